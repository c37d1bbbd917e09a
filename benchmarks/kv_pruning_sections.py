"""The sections of ``benchmarks/kv_pruning.py`` (its module docstring): ``run_niah``, ``run_ppl``,
``run_random_sink`` and ``run_memory``. Each but ``memory`` writes its record after every prefill and skips
what is recorded; ``run_niah`` also writes the first trials' full retention maps
(``kv_pruning_retention.json``: ``RETENTION_TRIALS`` per depth at ``RETENTION_RATIOS``).
"""

from __future__ import annotations

import statistics
import sys
import time

from kv_pruning_configs import EDGE_MARGIN, Config, check_placement
from niah_grid import open_record, trial_seed, wait_for_quiet, write_record

RETENTION_TRIALS = 1  # trials per depth whose full retention maps are recorded
RETENTION_RATIOS = (0.5, 0.68, 0.8)


def _needle_kept(keep, start, length):
    from longctx.evals.pruned import needle_retention

    return needle_retention(keep, start, length)


def run_niah(out, model, tok, meta, configs, depths, trials, length, ratios, threads, force):
    from tqdm import tqdm

    from longctx.evals.haystack import HaystackBuilder
    from longctx.evals.pruned import PrefillSnapshot, PrunedScorer
    from longctx.evals.scoring import SCORING

    data = open_record(out, meta)
    data["meta"].update(scoring=SCORING, length=length, edge_margin=EDGE_MARGIN,
                        trials="independent: own needle value, filler offset and random draws per trial")
    ret_path = out.with_name(out.stem.replace("_niah", "") + "_retention.json")  # kv_pruning_retention.json
    ret = open_record(ret_path, meta)
    done = {(r["press_config"], r["depth"], r["seed"]) for r in data["rows"]}
    builder = HaystackBuilder(tok)
    for d in depths:  # refuse a depth whose needle sits on a window edge, before any compute
        check_placement(builder.build(length, d, trial_seed(length, d, 0)), ratios)
    cells = [(d, i) for i in trials for d in depths]
    for d, i in tqdm(cells, desc="niah", file=sys.stderr):
        seed = trial_seed(length, d, i)
        todo = [c for c in configs if (c.label, d, seed) not in done]
        if not todo:
            continue
        load = wait_for_quiet(threads, force)
        prompt = builder.build(length, d, seed)
        margin = check_placement(prompt, ratios)
        needle = range(prompt.needle_start, prompt.needle_start + prompt.needle_len)
        t0 = time.perf_counter()
        snap = PrefillSnapshot.capture(model, prompt.token_ids)
        prefill_s = time.perf_counter() - t0
        answers = PrunedScorer(model, tok, snap).answer_many(
            prompt, [(c.press(seed, needle), c.aware) for c in todo]
        )
        batch_s = time.perf_counter() - t0 - prefill_s
        for c, a in zip(todo, answers, strict=True):
            r = a.reading
            kept = _needle_kept(a.keep, prompt.needle_start, prompt.needle_len)
            data["rows"].append({
                "haystack": "passkey", "rope": "none", "length": length, "depth": d, "seed": seed, "trial": i,
                "needle_start": prompt.needle_start, "needle_len": prompt.needle_len, "edge_distance": margin,
                "correct": r.correct, "exact": r.exact, "answer_logprob": r.answer_logprob,
                "answer": prompt.answer,
                "output": r.output, "answer_token_logprobs": [round(x, 4) for x in r.token_logprobs],
                "forced_top": [tok.decode([t]) for t in r.forced_top], "breaks_at": r.breaks_at,
                "press": c.label, "press_config": c.label, "press_name": c.name, "ratio": c.ratio,
                "aware": c.aware,
                "n_sink": c.options.get("n_sink", 4) if c.name == "streaming_llm" else None,
                "kept_tokens": a.kept_tokens, "needle_kept": kept.sum(-1).tolist(),  # [layer][KV head] counts
                "prefill_s": prefill_s, "batch_s": batch_s, "configs_in_batch": len(todo),
                "load_1min": load, "usable": meta["usable"],
            })  # fmt: skip
            if i < RETENTION_TRIALS and c.ratio in RETENTION_RATIOS:
                needle_ids = prompt.token_ids[needle.start:needle.stop]
                ret["rows"].append({"press_config": c.label, "press_name": c.name, "ratio": c.ratio,
                                    "aware": c.aware, "depth": d, "seed": seed, "correct": r.correct,
                                    "needle_tokens": [tok.decode([t]) for t in needle_ids],
                                    "kept": [["".join("1" if x else "0" for x in head) for head in layer]
                                             for layer in kept]})  # fmt: skip
        write_record(out, data)
        write_record(ret_path, ret)
    return data


def run_ppl(out, model, tok, meta, presses, ratios, length, threads, force, offsets=(0, 3000, 6000),
            continuation=128, random_seeds=5):
    from longctx.evals.haystack import natural_text
    from longctx.evals.pruned import PrefillSnapshot, continuation_nll_many

    ids = tok.encode(natural_text())
    data = open_record(out, meta)
    done = {(r["press_config"], r["offset"], r.get("seed")) for r in data["rows"]}
    for off in offsets:
        cfgs = [(Config("none"), None)]
        for r in ratios:
            for name in presses:
                seeds = range(random_seeds) if name == "random" else [None]
                cfgs += [(Config(name, r), s) for s in seeds]
                if name == "streaming_llm":
                    cfgs.append((Config(name, r, options={"n_sink": 32}), None))
                if name == "h2o":
                    cfgs.append((Config("h2o_mean", r), None))
        cfgs = [(c, s) for c, s in cfgs if (c.label, off, s) not in done]
        if not cfgs:
            continue
        load = wait_for_quiet(threads, force)
        ctx, cont = ids[off : off + length], ids[off + length : off + length + continuation]
        t0 = time.perf_counter()
        snap = PrefillSnapshot.capture(model, ctx)
        nlls = continuation_nll_many(model, snap, [c.press(s or 0) for c, s in cfgs], cont)
        secs = time.perf_counter() - t0
        for (c, s), nll in zip(cfgs, nlls, strict=True):
            data["rows"].append(
                {
                    "press_config": c.label, "press_name": c.name, "ratio": c.ratio, "offset": off, "seed": s,
                    "context_tokens": len(ctx), "continuation_tokens": len(cont), "nll": nll,
                    "seconds": secs / len(cfgs), "load_1min": load, "usable": meta["usable"],
                    "n_sink": c.options.get("n_sink", 4) if c.name == "streaming_llm" else None,
                }
            )
        write_record(out, data)
    return data


def run_random_sink(out, model, tok, meta, ratios, length, threads, force, offsets=(0, 3000, 6000),
                    continuation=128, seeds=10):
    import torch

    from longctx.evals.haystack import natural_text
    from longctx.evals.pruned import PrefillSnapshot, continuation_nll_many
    from longctx.kv.intervention import ForcedPress
    from longctx.kv.press import RandomPress

    class FixedRandomPress(RandomPress):
        """The random press as it was: re-seeded inside score, so every layer evicts the same positions."""

        def score(self, inp):
            return torch.rand(
                inp.keys.shape[0], inp.num_tokens, generator=torch.Generator().manual_seed(self.seed)
            )

    ids = tok.encode(natural_text())
    data = open_record(out, meta)
    done = {(r["offset"], r["ratio"], r["variant"], r["seed"]) for r in data["rows"]}
    for off in offsets:
        todo = [(r, v, s) for r in ratios for v in ("fixed", "fixed+sink", "per_layer", "per_layer+sink")
                for s in range(seeds) if (off, r, v, s) not in done]
        if not todo:
            continue
        load = wait_for_quiet(threads, force)
        ctx, cont = ids[off : off + length], ids[off + length : off + length + continuation]
        snap = PrefillSnapshot.capture(model, ctx)

        def make(r, v, s):
            base = (FixedRandomPress if v.startswith("fixed") else RandomPress)(r, seed=s)
            return ForcedPress(base, [0]) if v.endswith("+sink") else base

        presses = [make(*t) for t in todo]
        evicted = [sum(int((k[:, 0] != 0).sum()) for k in snap.keep_indices(make(*t))) for t in todo]
        nlls = continuation_nll_many(model, snap, presses, cont)
        base = continuation_nll_many(model, snap, [None], cont)[0]
        for (r, v, s), nll, ev in zip(todo, nlls, evicted, strict=True):
            data["rows"].append(
                {
                    "offset": off, "ratio": r, "variant": v, "seed": s, "nll": nll, "nll_full_cache": base,
                    "sink_evicted_layer_heads": ev, "layer_heads": snap.num_layers * snap.keys[0].shape[0],
                    "load_1min": load, "usable": meta["usable"],
                }
            )
        write_record(out, data)
    return data


def run_memory(out, model, tok, meta, ratios, length, decode_steps=24):
    import torch

    from longctx.engine import Engine, MonolithicScheduler
    from longctx.engine.torch_executor import TorchExecutor
    from longctx.evals.haystack import natural_text
    from longctx.kv.block_manager import BlockManager, blocks_for_tokens
    from longctx.kv.press import make_press
    from longctx.memory import kv_bytes_per_token

    ids = tok.encode(natural_text())[:length]
    c = model.config
    bytes_per_token = kv_bytes_per_token(c, "fp32")  # the engine's cache is in the model's dtype, fp32
    rows = []
    for ratio in [0.0, *ratios]:
        press = make_press("knorm", ratio)
        pool = BlockManager(blocks_for_tokens(length + decode_steps + 1, 16), 16)
        engine = Engine(
            TorchExecutor(model, pool, press=press), MonolithicScheduler(), max_model_len=c.max_context
        )
        seq = engine.add_request(ids, decode_steps + 1)
        engine.step()  # the prefill, then the press
        held, kv_tokens = len(pool.block_table(seq.seq_id)), seq.num_cached_tokens
        steps = []
        while engine.has_unfinished():
            steps.append(engine.step().duration_s)
        rows.append({"ratio": ratio, "kv_tokens": kv_tokens,
                     "blocks_held": held, "blocks_unpruned": blocks_for_tokens(length, 16),
                     "kv_bytes_held": held * 16 * bytes_per_token, "decode_step_s": statistics.median(steps),
                     "threads": torch.get_num_threads()})
        print(
            f"ratio {ratio:4.2f}: {held:3d} blocks, decode step {1e3 * rows[-1]['decode_step_s']:.1f} ms",
            flush=True,
        )
    data = {"meta": meta, "bytes_per_token": bytes_per_token, "rows": rows}
    write_record(out, data)
    return data

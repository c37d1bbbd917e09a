"""What KV pruning costs SmolLM2-135M (CPU, fp32), press by press and ratio by ratio, and why SnapKV loses
the needle: recorded with provenance, resumable.

Sections (each writes ``longctx/data/recorded/kv_pruning_<section>.json`` as it goes; a rerun skips what is
recorded):

- ``niah``    passkey needle at 1,024 tokens. Each trial (its own seed: needle value, filler offset, and the
              random press's draws) is prefilled ONCE (``longctx.evals.pruned.PrefillSnapshot``) and that
              prefill serves every configuration, batched (``PrunedScorer.answer_many``): every press x
              ratio question-aware; SnapKV and H2O question-agnostic too; StreamingLLM with 32 sinks; H2O
              with kvpress's per-query normalisation (``h2o_mean``); and the causal account of SnapKV's
              losses: SnapKV with the needle's tokens force-kept at the same budget
              (``snapkv_force_needle``), and transplants of exactly SnapKV's choice of needle tokens (per
              layer and KV head) into presses that otherwise decide: random (``random_snapkv_needle``),
              random with token 0 kept (``random_sink_snapkv_needle``, against its control
              ``random_sink``: random alone loses the attention sink) and key norm (``knorm_snapkv_needle``).
              Rows carry per-token answer log-probabilities, the model's top
              token at each answer position, and how many needle tokens each layer's KV heads kept; the
              full per-token retention maps of the first trials go to ``kv_pruning_retention.json``.
              Needle depths are checked against every window edge (StreamingLLM's 4- and 32-sink recent
              windows, H2O's recent half) so that no needle straddles one.
- ``ppl``     mean NLL of 128 tokens of natural text after a 1,024-token context whose cache was pruned, at
              three offsets, one prefill per offset for every press; random over 5 seeds per offset.
- ``random-sink``  why the old random baseline's perplexity was not monotonic: the old fixed mask (one
              seeded draw reused by every layer) against per-layer draws, each with and without token 0
              (the attention sink) force-kept, over 10 mask seeds.
- ``memory``  the engine's blocks and KV bytes held after a 1,024-token prefill, and one decode step's time.

Load and provenance as in ``niah_grid.py``: refuses to start above ``--threads`` of one-minute load average,
pauses while others load the machine, ``--force`` marks the record unusable.

Usage (one CPU thread, in the background)::

    OMP_NUM_THREADS=1 nohup .venv/bin/python benchmarks/kv_pruning.py niah > /tmp/kv.log 2>&1 &
    .venv/bin/python benchmarks/kv_pruning.py niah --ratios 0.5 --trials 1 --out /tmp/x.json --force
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from niah_grid import (
    RECORDED,
    load_gate,
    now,
    open_record,
    provenance,
    trial_seed,
    wait_for_quiet,
    write_record,
)

PRESSES = ("streaming_llm", "snapkv", "h2o", "knorm", "random")
RATIOS = "0.25,0.5,0.68,0.8,0.9"
DEPTHS = "0.1,0.4,0.79"  # every window edge >= 8 tokens away (0.5: the needle began at the 4-sink edge, 516)
LENGTH = 1024
EDGE_MARGIN = 8  # tokens between a needle and any window edge
RETENTION_TRIALS = 1  # trials per depth whose full retention maps are recorded
RETENTION_RATIOS = (0.5, 0.68, 0.8)


@dataclass(frozen=True)
class Config:
    """One pruned configuration; ``label`` is its ``press_config`` in the record."""

    name: str  # the press_name in the record
    ratio: float = 0.0
    aware: bool = True
    options: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.name == "none":
            return "none"
        extra = "".join(f" {k}={v}" for k, v in self.options.items())
        return f"{self.name} {self.ratio:g}{extra}" + ("" if self.aware else " agnostic")

    def press(self, seed: int, needle: range | None = None):
        from longctx.kv.intervention import ForcedPress
        from longctx.kv.press import make_press

        r = self.ratio
        if self.name == "none":
            return None
        if self.name == "h2o_mean":
            return make_press("h2o", r, normalization="mean")
        if self.name == "snapkv_force_needle":
            return ForcedPress(make_press("snapkv", r), needle)
        if self.name == "random_sink":  # random with token 0, the attention sink, kept in every head
            return ForcedPress(make_press("random", r, seed=seed), [0])
        if self.name in ("random_snapkv_needle", "random_sink_snapkv_needle", "knorm_snapkv_needle"):
            base = {
                "random_snapkv_needle": make_press("random", r, seed=seed),
                "knorm_snapkv_needle": make_press("knorm", r),
                "random_sink_snapkv_needle": ForcedPress(make_press("random", r, seed=seed), [0]),
            }[self.name]
            return ForcedPress(base, needle, donor=make_press("snapkv", r))
        return make_press(self.name, r, **({"seed": seed} if self.name == "random" else self.options))


def niah_configs(presses, ratios) -> list[Config]:
    out = [Config("none")]
    for r in ratios:
        for name in presses:
            out.append(Config(name, r))
            if name == "streaming_llm":
                out.append(Config(name, r, options={"n_sink": 32}))
            if name in ("snapkv", "h2o"):
                out.append(Config(name, r, aware=False))
            if name == "h2o":
                out.append(Config("h2o_mean", r))
            if name == "snapkv":
                out += [Config("snapkv_force_needle", r), Config("random_snapkv_needle", r),
                        Config("random_sink", r), Config("random_sink_snapkv_needle", r),
                        Config("knorm_snapkv_needle", r)]
    return out


def window_edges(T: int, ratios, streaming: bool = True) -> dict[str, int]:
    """``{what: first token position}`` of every recent window the sweep's presses keep of ``T`` tokens
    (``streaming=False``: H2O's only, for the question-agnostic prune of the context)."""
    from longctx.kv.press import H2OPress, StreamingLLMPress

    edges = {}
    for r in ratios:
        for sinks in (4, 32) if streaming else ():
            p = StreamingLLMPress(r, n_sink=sinks)
            edges[f"streaming_llm {r:g} n_sink={sinks}"] = T - (p.num_kept(T) - sinks)
        h = H2OPress(r)
        edges[f"h2o {r:g} recent half"] = T - round(h.recent_fraction * h.num_kept(T))
    return edges


def check_placement(prompt, ratios, margin: int = EDGE_MARGIN) -> int:
    """The needle's distance (tokens) to the nearest window edge; ``ValueError`` if under ``margin``."""
    a, b = prompt.needle_start, prompt.needle_start + prompt.needle_len
    worst, where = None, None
    for T, streaming in ((prompt.length, True), (prompt.question_start, False)):  # aware, agnostic
        for what, e in window_edges(T, ratios, streaming).items():
            d = a - e if e <= a else (e - b if e >= b else -1)
            if worst is None or d < worst:
                worst, where = d, f"{what} (of {T} tokens) at {e}"
    if worst < margin:
        raise ValueError(f"the needle at tokens {a}..{b - 1} is {worst} tokens from the edge of {where}: "
                         f"choose another depth (need >= {margin})")
    return worst


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


def print_niah(data) -> None:
    from longctx.evals.stats import Rate

    groups: dict[str, list] = {}
    for r in data["rows"]:
        groups.setdefault(r["press_config"], []).append(r)
    print(f"\nniah passkey, {LENGTH} tokens: accuracy [95 % Wilson] / mean log p(answer) per configuration")
    for label, rows in groups.items():
        lp = sum(r["answer_logprob"] for r in rows) / len(rows)
        print(f"{label:<40} {Rate.of(r['correct'] for r in rows)!s:<30} {lp:7.2f}")


def print_ppl(data) -> None:
    import math

    by: dict[str, list] = {}
    for r in data["rows"]:
        by.setdefault(r["press_config"], []).append(r["nll"])
    base = statistics.mean(by.get("none", [float("nan")]))
    print(
        "\ncontinuation of natural text after a pruned 1,024-token context: perplexity (change vs full cache)"
    )
    for label, v in by.items():
        m = statistics.mean(v)
        print(f"{label:<34} {math.exp(m):8.2f}  {100 * (math.exp(m - base) - 1):+7.1f} %   ({len(v)} runs)")


def print_random_sink(data) -> None:
    import math

    by: dict = {}
    for r in data["rows"]:
        by.setdefault((r["ratio"], r["variant"]), []).append(r)
    print("\nrandom pruning: perplexity change vs the full cache (mean over offsets and mask seeds); masks "
          "evicting token 0 in at least one (layer, KV head)")
    for (ratio, variant), rows in sorted(by.items()):
        change = statistics.mean(math.exp(r["nll"] - r["nll_full_cache"]) - 1 for r in rows)
        sink = sum(r["sink_evicted_layer_heads"] > 0 for r in rows)
        print(f"{ratio:4.2f} {variant:<15} {100 * change:+8.1f} %   sink evicted in {sink}/{len(rows)} runs")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("section", choices=["niah", "ppl", "random-sink", "memory", "all"])
    ap.add_argument("--presses", default=",".join(PRESSES))
    ap.add_argument("--ratios", default=RATIOS)
    ap.add_argument("--depths", default=DEPTHS)
    ap.add_argument("--trials", type=int, default=10, help="independent trials per depth (niah)")
    ap.add_argument("--length", type=int, default=LENGTH)
    ap.add_argument(
        "--seeds", type=int, default=None, help="random masks per point (ppl: 5, random-sink: 10)"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--force", action="store_true", help="record despite the load (marks the record unusable)"
    )
    ap.add_argument("--out", type=Path, default=None, help="one section: write here instead")
    args = ap.parse_args(argv)
    gate_load = load_gate(args.threads, args.force)

    import torch

    torch.set_num_threads(args.threads)
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    model, tok = load_model(), load_tokenizer()
    meta = provenance(args.threads, usable=not args.force, gate_load=gate_load)
    ratios = [float(x) for x in args.ratios.split(",")]
    presses = args.presses.split(",")
    sections = ["niah", "ppl", "random-sink", "memory"] if args.section == "all" else [args.section]
    gate = (args.threads, args.force)
    for section in sections:
        out = args.out or RECORDED / f"kv_pruning_{section.replace('-', '_')}.json"
        if section == "niah":
            print_niah(run_niah(out, model, tok, meta, niah_configs(presses, ratios),
                                [float(x) for x in args.depths.split(",")], range(args.trials), args.length,
                                ratios, *gate))
        elif section == "ppl":
            print_ppl(run_ppl(out, model, tok, meta, presses, ratios, args.length, *gate,
                              random_seeds=args.seeds or 5))
        elif section == "random-sink":
            print_random_sink(
                run_random_sink(
                    out, model, tok, meta, [r for r in ratios if r <= 0.68], args.length, *gate,
                    seeds=args.seeds or 10,
                )
            )
        else:
            run_memory(out, model, tok, meta, ratios, args.length)
        print(f"wrote {out} ({now()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

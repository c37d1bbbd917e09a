"""The sections of the GPU suite (``longctx.gpu.bench``). Each appends its results to ``ctx.record``.

Every point is timed with ``longctx.gpu.harness`` (CUDA events, warm-up, median of repeats). A point that
runs out of memory is listed under ``skipped`` and the run goes on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from longctx.gpu import counts
from longctx.gpu import workloads as w
from longctx.gpu.harness import synchronize, time_fn, time_sequence
from longctx.kv.cache import PagedKVCache
from longctx.model.config import resized, spec_to_dict
from longctx.model.llama import _sdpa, apply_rope, rope_cos_sin

MAIN, SLICE = "llama-3-8b", "llama-3.1-70b-slice"


@dataclass
class Context:
    record: dict
    config: object  # BenchConfig
    device: torch.device
    dtype: torch.dtype
    budget: object  # Budget
    log: Callable[[str], None]
    models: dict = field(default_factory=dict)

    def model(self, name: str):
        """The random-weight model ``name`` (built once; building the slice drops the 8B model first)."""
        if name not in self.models:
            self.drop_models()
            cfg = w.model_configs(self.config.is_toy, self.config.slice_layers, self.config.main_layers)[name]
            self.models[name] = w.build_model(cfg, self.device, self.dtype)
            entry = {"config": spec_to_dict(cfg), "num_params": sum(p.numel() for p in self.models[name].parameters())}
            if cfg.num_layers < (80 if name == SLICE else 32) and not self.config.is_toy:
                entry["note"] = f"{cfg.num_layers} of the model's layers, at its real layer shape"
            self.record.setdefault("models", {})[name] = entry
        return self.models[name]

    def drop_models(self) -> None:
        self.models.clear()
        free_memory(self.device)

    @property
    def dtype_bytes(self) -> int:
        return torch.finfo(self.dtype).bits // 8

    def time(self, fn, warmup=None, repeats=None):
        c = self.config
        return time_fn(fn, self.device, c.warmup if warmup is None else warmup,
                       c.repeats if repeats is None else repeats)

    def guarded(self, what: str, fn) -> object | None:
        """``fn()``; or None, with ``what`` listed under ``skipped`` when the device runs out of memory and
        under ``errors`` for any other exception (one failed point must not lose a whole GPU run)."""
        try:
            return fn()
        except torch.OutOfMemoryError:
            self.budget.skipped.append(f"{what} (out of memory)")
        except Exception as exc:  # recorded, never hidden: tests require errors == []
            self.record.setdefault("errors", []).append(f"{what}: {type(exc).__name__}: {exc}"[:500])
            self.log(f"  ERROR {what}: {type(exc).__name__}: {exc}")
        free_memory(self.device)
        return None


def free_memory(device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---- 1. ceilings --------------------------------------------------------------------------------------


def ceilings(ctx: Context) -> None:
    c, dev = ctx.config, ctx.device
    gen = torch.Generator(device=dev).manual_seed(0)
    n = c.matmul_n
    a = torch.randn(n, n, device=dev, dtype=ctx.dtype, generator=gen)
    b = torch.randn(n, n, device=dev, dtype=ctx.dtype, generator=gen)
    mm = ctx.time(lambda: a @ b, warmup=3, repeats=10)
    src = torch.randn(c.copy_bytes // ctx.dtype_bytes, device=dev, dtype=ctx.dtype, generator=gen)
    dst = torch.empty_like(src)
    cp = ctx.time(lambda: dst.copy_(src), warmup=3, repeats=10)
    nbytes = src.numel() * ctx.dtype_bytes
    ctx.record["ceilings"] = {
        "matmul": {"n": n, "flops": 2 * n**3, **mm.to_dict(), "flops_per_s": 2 * n**3 / mm.median_s},
        "copy": {"bytes": nbytes, "bytes_moved": 2 * nbytes, **cp.to_dict(),
                 "bytes_per_s": 2 * nbytes / cp.median_s, "convention": "bytes read + bytes written"},
    }
    ctx.log(f"  matmul {2 * n**3 / mm.median_s / 1e12:.1f} TFLOP/s, copy {2 * nbytes / cp.median_s / 1e12:.2f} TB/s")


# ---- 2. prefill against chunk size --------------------------------------------------------------------


def _prefill_curve(ctx: Context, name: str, chunk_sizes, prompt_tokens: int) -> None:
    model = ctx.model(name)
    cfg, bs, dev = model.config, ctx.config.block_size, ctx.device
    cache = PagedKVCache.for_model(cfg, -(-prompt_tokens // bs), bs, dev, ctx.dtype)
    table = list(range(cache.num_blocks))
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (prompt_tokens,), generator=gen).to(dev)
    out = ctx.record.setdefault("prefill_chunks", [])
    for chunk in chunk_sizes:
        if chunk > prompt_tokens or not ctx.budget.allows(f"{name} prefill chunk {chunk}"):
            continue
        pieces = [(s, min(chunk, prompt_tokens - s)) for s in range(0, prompt_tokens, chunk)]
        metas = [w.fast_metadata([(table, s, n)], bs, dev) for s, n in pieces]
        rows = [torch.tensor([n - 1], device=dev) for _, n in pieces]
        fns = [lambda s=s, n=n, m=m, r=r: model(ids[s:s + n], cache, m, logits_rows=r)
               for (s, n), m, r in zip(pieces, metas, rows, strict=True)]
        res = ctx.guarded(f"{name} prefill chunk {chunk}", lambda fns=fns: time_sequence(
            fns, dev, warmup=1, repeats=max(1, ctx.config.repeats - 2)))
        if res is None:
            continue
        each, whole = res
        seqs = [(n, s) for s, n in pieces]
        flops = counts.executed_flops(cfg, seqs, logits_rows=len(pieces))
        out.append({"model": name, "chunk_size": chunk, "prompt_tokens": prompt_tokens, "num_chunks": len(pieces),
                    "time_s": whole, **flops, "flops_per_s": flops["flops"] / whole,
                    "chunks": [[n, s, t] for (s, n), t in zip(pieces, each, strict=True)]})
        ctx.log(f"  {name} chunk {chunk:>5}: {whole * 1e3:8.1f} ms, {flops['flops'] / whole / 1e12:6.1f} TFLOP/s")


def prefill_chunks(ctx: Context) -> None:
    with w.scores_per_call(ctx.config.max_scores_per_call):
        _prefill_curve(ctx, MAIN, ctx.config.chunk_sizes, ctx.config.prefill_prompt_tokens)


# ---- 3. decode against batch and context --------------------------------------------------------------


def _decode_grid(ctx: Context, name: str, batch_sizes, contexts) -> None:
    model = ctx.model(name)
    cfg, bs, dev, c = model.config, ctx.config.block_size, ctx.device, ctx.config
    points = [(b, L) for L in contexts for b in batch_sizes if b * L <= c.max_decode_kv_tokens]
    for b, L in [(b, L) for L in contexts for b in batch_sizes if b * L > c.max_decode_kv_tokens]:
        ctx.budget.skipped.append(f"{name} decode batch {b} context {L} (KV over {c.max_decode_kv_tokens} tokens)")
    if not points:
        return
    blocks_per_seq = {L: -(-(L + 1) // bs) for _, L in points}
    cache = ctx.guarded(f"{name} decode cache", lambda: PagedKVCache.for_model(
        cfg, max(b * blocks_per_seq[L] for b, L in points), bs, dev, ctx.dtype))
    if cache is None:
        return
    cache.data.normal_(generator=torch.Generator(device=dev).manual_seed(2))  # real numbers, not zeros
    copy_bw = ctx.record.get("ceilings", {}).get("copy", {}).get("bytes_per_s")
    out = ctx.record.setdefault("decode", [])
    for b, L in points:
        if not ctx.budget.allows(f"{name} decode batch {b} context {L}"):
            continue
        nb = blocks_per_seq[L]
        meta = w.fast_metadata([(list(range(i * nb, (i + 1) * nb)), L, 1) for i in range(b)], bs, dev)
        ids = torch.randint(0, cfg.vocab_size, (b,), device=dev)
        rows = torch.arange(b, device=dev)
        t = ctx.guarded(f"{name} decode batch {b} context {L}",
                        lambda ids=ids, meta=meta, rows=rows: ctx.time(
                            lambda: model(ids, cache, meta, logits_rows=rows)))
        del meta
        if t is None:
            continue
        seqs = [(1, L)] * b
        nbytes = counts.min_step_bytes(cfg, seqs, ctx.dtype_bytes)
        entry = {"model": name, "batch_size": b, "context_tokens": L, "step_s": t.median_s,
                 "min_s": t.min_s, "bytes": nbytes, "bytes_per_s": nbytes / t.median_s,
                 **counts.executed_flops(cfg, seqs, logits_rows=b)}
        if copy_bw:
            entry["fraction_of_copy"] = nbytes / t.median_s / copy_bw
        out.append(entry)
        ctx.log(f"  {name} decode b={b:>3} ctx={L:>6}: {t.median_s * 1e3:7.2f} ms, "
                f"{nbytes / t.median_s / 1e12:5.2f} TB/s")


def decode(ctx: Context) -> None:
    _decode_grid(ctx, MAIN, ctx.config.decode_batch_sizes, ctx.config.decode_contexts)


# ---- 4. attention versus the rest of a layer ------------------------------------------------------------


def _layer_split(ctx: Context, name: str, contexts) -> None:
    """One layer's prefill of T tokens, timed in two parts: the attention core (causal SDPA with GQA, as
    ``longctx.model.llama``) and the rest (norms, q/k/v/o projections, RoPE, SwiGLU MLP, residuals)."""
    block = ctx.model(name).layers[0]
    cfg, dev = ctx.models[name].config, ctx.device
    gen = torch.Generator(device=dev).manual_seed(3)
    out = ctx.record.setdefault("attention_share", [])
    for T in contexts:
        if not ctx.budget.allows(f"{name} attention share {T}"):
            continue

        def measure(T=T):
            H, Hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
            x = torch.randn(T, cfg.d_model, device=dev, dtype=ctx.dtype, generator=gen)
            q = torch.randn(1, H, T, d, device=dev, dtype=ctx.dtype, generator=gen)
            k = torch.randn(1, Hkv, T, d, device=dev, dtype=ctx.dtype, generator=gen)
            v = torch.randn(1, Hkv, T, d, device=dev, dtype=ctx.dtype, generator=gen)
            attn_out = torch.randn(T, H * d, device=dev, dtype=ctx.dtype, generator=gen)
            cos, sin = rope_cos_sin(torch.arange(T, device=dev), d, cfg.rope_theta, ctx.dtype)
            a = block.attn

            def rest():
                hn = block.attn_norm(x)
                apply_rope(a.q_proj(hn).view(T, H, d), cos, sin)  # [T, H, d]
                apply_rope(a.k_proj(hn).view(T, Hkv, d), cos, sin)  # [T, H_kv, d]
                a.v_proj(hn)
                h = x + a.o_proj(attn_out)
                return h + block.mlp(block.mlp_norm(h))

            t_att = ctx.time(lambda: _sdpa(q, k, v, is_causal=True), warmup=1, repeats=3)
            t_rest = ctx.time(rest, warmup=1, repeats=3)
            return t_att, t_rest

        res = ctx.guarded(f"{name} attention share {T}", measure)
        if res is None:
            continue
        t_att, t_rest = res
        f = counts.executed_flops(resized(cfg, num_layers=1), [(T, 0)], logits_rows=0)
        share = t_att.median_s / (t_att.median_s + t_rest.median_s)
        out.append({"model": name, "context_tokens": T, "attention_s": t_att.median_s, "rest_s": t_rest.median_s,
                    "attention_share": share, "attention_flops": f["attention_flops"],
                    "linear_flops": f["linear_flops"],
                    "flop_share": f["attention_flops"] / f["flops"],
                    "attention_flops_per_s": f["attention_flops"] / t_att.median_s,
                    "rest_flops_per_s": f["linear_flops"] / t_rest.median_s})
        ctx.log(f"  {name} layer T={T:>6}: attention {t_att.median_s * 1e3:8.2f} ms, rest "
                f"{t_rest.median_s * 1e3:8.2f} ms, share {share:.0%}")
        free_memory(dev)


def attention_share(ctx: Context) -> None:
    _layer_split(ctx, MAIN, ctx.config.attention_contexts)


# ---- 5. Exercise 1 on the real engine ---------------------------------------------------------------------


def exercise1(ctx: Context) -> None:
    from longctx.engine import ChunkedPrefillScheduler, MonolithicScheduler
    from longctx.gpu.exercise1 import run_exercise1, summarize_runs

    c, model = ctx.config, ctx.model(MAIN)
    kw = dict(num_decode_streams=c.ex1_num_decode_streams, prompt_tokens=c.ex1_prompt_tokens,
              stream_context_tokens=c.ex1_stream_context_tokens, warmup_steps=c.ex1_warmup_steps,
              tail_steps=c.ex1_tail_steps, block_size=c.block_size)
    factories = {"monolithic": MonolithicScheduler}
    factories.update({f"chunked-{b}": (lambda b=b: ChunkedPrefillScheduler(token_budget=b)) for b in c.ex1_budgets})
    with w.scores_per_call(c.max_scores_per_call):
        # warm-up: kernels, allocator and the engine's code paths, at a small size (discarded)
        ctx.guarded("exercise1 warm-up", lambda: run_exercise1(
            model, ChunkedPrefillScheduler(max(c.ex1_budgets)), **{**kw, "prompt_tokens": max(c.ex1_budgets) * 2,
                                                                   "warmup_steps": 2, "tail_steps": 2}))
        runs: dict = {}
        for rep in range(c.ex1_repeats):
            for label, make in factories.items():
                if not ctx.budget.allows(f"exercise1 {label} repeat {rep}"):
                    continue
                r = ctx.guarded(f"exercise1 {label}", lambda make=make, rep=rep: run_exercise1(
                    model, make(), seed=rep, **kw))
                free_memory(ctx.device)
                if r is not None:
                    runs.setdefault(label, []).append(r)
                    ctx.log(f"  exercise1 {label:<13} TTFT {r['ttft_s'] * 1e3:8.1f} ms, max ITL "
                            f"{r['max_itl_s'] * 1e3:7.1f} ms, steady ITL {r['steady_itl_s'] * 1e3:6.2f} ms")
    ctx.record["exercise1"] = {"model": MAIN, **{k: v for k, v in kw.items() if k != "block_size"},
                               "runs": {k: summarize_runs(v) for k, v in runs.items()}}


# ---- 6. the 70B-shaped slice ----------------------------------------------------------------------------


def slice(ctx: Context) -> None:  # noqa: A001 (the section's name)
    c = ctx.config
    with w.scores_per_call(c.max_scores_per_call):
        _prefill_curve(ctx, SLICE, c.chunk_sizes, c.prefill_prompt_tokens)
    _decode_grid(ctx, SLICE, c.slice_decode_batch_sizes, c.slice_decode_contexts)
    _layer_split(ctx, SLICE, c.slice_attention_contexts)
    synchronize(ctx.device)

"""The GPU suite's sections: ``section(run, model_name)`` appends its results to ``run.record``, each point
timed by ``run.time`` (``suite.time_fn``) and guarded by ``run.point``; FLOPs and bytes from ``run.cost``.
``prefill_chunks`` and ``decode`` time each point with every backend of ``config.attention_backends`` side by
side (each row names the one that ran); ``decode`` and ``decode_profile`` live in ``decode_sections``;
``prefill_engine``, ``stall`` and ``capstone`` run the engine (``serving_sections``)."""

from __future__ import annotations

from dataclasses import asdict

import torch

from longctx.flops import chunk_flops
from longctx.gpu.decode_sections import backends, decode, decode_profile  # noqa: F401 (suite finds sections here)
from longctx.gpu.serving_sections import capstone, prefill_engine, stall  # noqa: F401
from longctx.kv.cache import PagedKVCache, build_attention_metadata
from longctx.memory import blocks_for_tokens
from longctx.model.attention import sdpa
from longctx.model.config import resized
from longctx.model.llama import apply_rope, rope_cos_sin
from longctx.specs import dtype_bytes


def ceilings(ctx, name: str) -> None:
    """A square matmul's FLOP/s and a copy's bytes/s (read + written): what this card really reaches."""
    c, dev, n = ctx.config, ctx.device, ctx.config.matmul_n
    gen = torch.Generator(device=dev).manual_seed(0)
    a, b = (torch.randn(n, n, device=dev, dtype=ctx.dtype, generator=gen) for _ in range(2))
    mm = ctx.time(lambda: a @ b, warmup=3, repeats=10)
    src = torch.randn(c.copy_bytes // int(dtype_bytes(c.dtype)), device=dev, dtype=ctx.dtype, generator=gen)
    dst = torch.empty_like(src)
    cp = ctx.time(lambda: dst.copy_(src), warmup=3, repeats=10)
    ctx.record["ceilings"] = {
        "matmul": {"n": n, "flops": 2 * n**3, **asdict(mm), "flops_per_s": 2 * n**3 / mm.median_s},
        "copy": {"bytes": src.nbytes, **asdict(cp), "bytes_per_s": 2 * src.nbytes / cp.median_s,
                 "convention": "bytes read + bytes written"}}
    ctx.log(f"  matmul {2 * n**3 / mm.median_s / 1e12:.1f} TFLOP/s, "
            f"copy {2 * src.nbytes / cp.median_s / 1e12:.2f} TB/s")


def prefill_chunks(ctx, name: str) -> None:
    """Per chunk size and backend: each chunk of one prompt timed after the earlier chunks filled
    the KV cache."""
    model, T, bs, dev = ctx.model(name), ctx.config.prefill_prompt_tokens, ctx.config.block_size, ctx.device
    cache = PagedKVCache.for_model(model.config, blocks_for_tokens(T, bs), bs, dev, ctx.dtype)
    table = list(range(cache.num_blocks))
    ids = torch.randint(0, model.config.vocab_size, (T,), generator=torch.Generator().manual_seed(1)).to(dev)

    def chunk_s(n: int, s: int, backend) -> float:  # n new tokens after s cached ones
        meta = build_attention_metadata([(table, s, n)], bs, dev, decode_groups=backend.uses_decode_groups)
        last = torch.tensor([n - 1], device=dev)
        return ctx.time(lambda: model(ids[s:s + n], cache, meta, logits_rows=last, backend=backend), warmup=1,
                        repeats=max(1, ctx.config.repeats - 2)).median_s

    for chunk in (c for c in ctx.config.chunk_sizes if c <= T):
        pieces = [(min(chunk, T - s), s) for s in range(0, T, chunk)]  # (new, cached)
        flops = sum(ctx.cost(model.config, [p]).flops for p in pieces)
        for choice in backends(ctx):
            what = f"{name} prefill chunk {chunk} {choice.name}"
            timed = ctx.point(what,
                              lambda pieces=pieces, b=choice.backend: [chunk_s(n, s, b) for n, s in pieces])
            if (times := timed) is None:
                continue
            ctx.record.setdefault("prefill_chunks", []).append(
                {"model": name, "attention_backend": choice.name, "chunk_size": chunk, "prompt_tokens": T,
                 "time_s": sum(times), "flops": flops, "flops_per_s": flops / sum(times),
                 "chunks": [[n, s, t] for (n, s), t in zip(pieces, times, strict=True)]})
            ctx.log(f"  {what:<40}: {sum(times) * 1e3:9.2f} ms, {flops / sum(times) / 1e12:6.2f} TFLOP/s")


def attention_share(ctx, name: str) -> None:
    """One layer's prefill of T tokens timed in two parts: the attention core (causal SDPA with GQA, as
    ``longctx.model.llama``) and the rest (norms, projections, RoPE, SwiGLU MLP, residuals)."""
    model, dev = ctx.model(name), ctx.device
    block, cfg, gen = model.layers[0], model.config, torch.Generator(device=dev).manual_seed(3)
    H, Hkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

    def measure(T: int):
        x, attn_out = (torch.randn(T, w, device=dev, dtype=ctx.dtype, generator=gen)
                       for w in (cfg.d_model, H * d))
        q, k, v = (torch.randn(1, h, T, d, device=dev, dtype=ctx.dtype, generator=gen) for h in (H, Hkv, Hkv))
        cos, sin = rope_cos_sin(torch.arange(T, device=dev), d, cfg.rope_theta, ctx.dtype)
        a = block.attn

        def rest():
            hn = block.attn_norm(x)
            apply_rope(a.q_proj(hn).view(T, H, d), cos, sin)  # [T, H, d]
            apply_rope(a.k_proj(hn).view(T, Hkv, d), cos, sin)  # [T, H_kv, d]
            a.v_proj(hn)
            h = x + a.o_proj(attn_out)
            return h + block.mlp(block.mlp_norm(h))

        return (ctx.time(lambda: sdpa(q, k, v, is_causal=True), warmup=1, repeats=3),
                ctx.time(rest, warmup=1, repeats=3))

    for T in ctx.config.attention_contexts:
        what = f"{name} attention share {T}"
        if (res := ctx.point(what, lambda T=T: measure(T))) is None:
            continue
        att_s, rest_s = res[0].median_s, res[1].median_s
        f = chunk_flops(resized(cfg, num_layers=1), T, logit_tokens=0)  # causal, "matmul"
        ctx.record.setdefault("attention_share", []).append(
            {"model": name, "context_tokens": T, "attention_s": att_s, "rest_s": rest_s,
             "attention_share": att_s / (att_s + rest_s), "attention_flops": f.attention_flops,
             "linear_flops": f.linear_flops, "flop_share": f.attention_share})
        ctx.log(f"  {name} layer T={T:>6}: attention {att_s * 1e3:8.2f} ms, rest {rest_s * 1e3:8.2f} ms")
        ctx.free_memory()

"""The GPU suite's decode sections: decode steps of ``b`` sequences at context ``L`` over one paged pool.

- ``decode``: the step's time per (b, L) and backend, and once more for the fused backend replayed from its
  decode CUDA graph (``longctx.engine.cuda_graphs``; rows say ``cuda_graphs: "on"``). An eager step builds
  its attention metadata inside the timed call (the fused backend's block mask with it), as the engine does
  every step, so a backend whose per-step host work is dear pays for it; a graphed step refills its buffers
  and replays.
- ``decode_profile``: at a few points, per variant, the host's time to enqueue the step (the call returns
  before the GPU is done), the GPU's time (CUDA events, the launches queued behind a ``torch.cuda._sleep``
  head start so that host gaps do not count, up to the depth of the launch queue) and the wall time to the
  end of the step: launch-bound when the host's time exceeds the GPU's. Then the FlexAttention decode kernel
  alone on one layer's pool: its time and the bytes of K and V it must read, against the copy ceiling.

On a CPU (``--toy``) the same code runs eagerly: a "graphed" row runs the graph's buffers without a capture
(``cuda_graphs: "eager-buffers"``), and the profile has host and wall time only (``gpu_s`` None: absent).
Each sequence owns its own consecutive blocks; block 0 is the graphs' scratch block.
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch

from longctx.engine.cuda_graphs import DecodeGraphs
from longctx.kv.block_manager import BlockManager
from longctx.kv.cache import PagedKVCache, build_attention_metadata
from longctx.memory import blocks_for_tokens
from longctx.model.attention import choose_backend
from longctx.model.paged_flex import paged_decodes
from longctx.specs import dtype_bytes


class DecodePool:
    """One pool holding ``b`` sequences of ``L`` cached tokens for every point (each in its own blocks after
    the scratch block 0), random numbers in it; step functions per variant."""

    def __init__(self, ctx, name: str, points):
        c, self.ctx = ctx.config, ctx
        self.model, self.bs, self.dev = ctx.model(name), c.block_size, ctx.device
        self.nb = {L: blocks_for_tokens(L + 1, self.bs) for _, L in points}
        total = 1 + max(b * self.nb[L] for b, L in points)
        self.cache = PagedKVCache.for_model(self.model.config, total, self.bs, self.dev, ctx.dtype)
        self.cache.data.normal_(generator=torch.Generator(device=self.dev).manual_seed(2))  # not zeros
        self.block_manager = BlockManager(total, self.bs)
        self.max_batch, self.max_blocks = max(b for b, _ in points), max(self.nb.values())
        self.graphs: DecodeGraphs | None = None

    def chunks(self, b: int, L: int) -> list:
        nb = self.nb[L]
        return [(list(range(1 + i * nb, 1 + (i + 1) * nb)), L, 1) for i in range(b)]

    def ids(self, b: int) -> list[int]:
        return torch.randint(0, self.model.config.vocab_size, (b,),
                             generator=torch.Generator().manual_seed(b)).tolist()

    def eager_step(self, b: int, L: int, backend):
        chunks, rows = self.chunks(b, L), torch.arange(b, device=self.dev)
        ids = torch.tensor(self.ids(b), device=self.dev)

        groups = backend.uses_decode_groups

        def step():  # the metadata (and the fused backend's block mask) built inside, as the engine does
            meta = build_attention_metadata(chunks, self.bs, self.dev, decode_groups=groups)
            return self.model(ids, self.cache, meta, logits_rows=rows, backend=backend)

        return step

    def graph_step(self, b: int, L: int, backend):
        """The step replayed from its bucket's graph (captured here, before any timing); None when the
        capture fails (``self.graphs.failure`` says why)."""
        if self.graphs is None:
            self.graphs = DecodeGraphs(self.model, self.cache, self.block_manager, backend, self.max_batch,
                                       self.max_blocks, capture=self.dev.type == "cuda")
        g = self.graphs
        g.warm([b])
        if g.failure is not None:
            return None
        chunks, ids = self.chunks(b, L), self.ids(b)
        return lambda: g.run(ids, chunks)

    @property
    def graph_mode(self) -> str:
        return "on" if self.dev.type == "cuda" else "eager-buffers"


def backends(ctx) -> list:
    """The ``BackendChoice`` of each of ``config.attention_backends`` on this device and dtype (pool in the
    model's dtype); a name twice (``auto`` resolving to one already listed) is measured once."""
    out = {}
    for requested in ctx.config.attention_backends:
        choice = choose_backend(requested, ctx.device, ctx.dtype)
        out.setdefault(choice.name, choice)
    return list(out.values())


def variants(ctx) -> list[tuple[str, object, bool]]:
    """``(label, BackendChoice, graphed)`` per timed variant: every backend, and the fused one replayed from
    graphs when ``cuda_graphs`` is ``auto`` (on a CPU: the toy run's eager buffers)."""

    out = []
    for choice in backends(ctx):
        out.append((choice.name, choice, False))
        if choice.name == "fused" and ctx.config.cuda_graphs == "auto":
            out.append(("fused+graphs", choice, True))
    return out


def _points(ctx, name: str, points, what: str) -> list:
    cap = ctx.config.max_decode_kv_tokens
    ctx.record["skipped"] += [f"{name} {what} batch {b} context {L} (KV over {cap} tokens)"
                              for b, L in points if b * L > cap]
    return [(b, L) for b, L in points if b * L <= cap]


def _pool(ctx, name: str, points) -> DecodePool | None:
    return ctx.point(f"{name} decode cache", timed=False, fn=lambda: DecodePool(ctx, name, points))


def decode(ctx, name: str) -> None:
    """One decode step per (b, L) and variant (``variants``)."""
    c = ctx.config
    points = _points(ctx, name, [(b, L) for L in c.decode_contexts for b in c.decode_batch_sizes], "decode")
    if not points or (pool := _pool(ctx, name, points)) is None:
        return
    graphs_failed, timed = False, variants(ctx)  # one backend object each: its compiled decode kernels reused
    for b, L in points:
        cost = ctx.cost(pool.model.config, [(1, L)] * b)
        for label, choice, graphed in timed:
            if graphed and graphs_failed:
                continue
            what = f"{name} decode batch {b} context {L} {label}"
            make = pool.graph_step if graphed else pool.eager_step
            t = ctx.point(what, lambda b=b, L=L, k=choice.backend, make=make: _timed(ctx, make(b, L, k)))
            if graphed and pool.graphs is not None and pool.graphs.failure is not None:
                graphs_failed = True
                ctx.fallback(f"cuda graphs: {pool.graphs.failure}; the decode rows run without graphs")
            if t is None:
                continue
            ctx.record.setdefault("decode", []).append(
                {"model": name, "attention_backend": choice.name, "batch_size": b, "context_tokens": L,
                 "step_s": t.median_s, "min_s": t.min_s, "max_s": t.max_s, "bytes": cost.bytes,
                 "bytes_per_s": cost.bytes / t.median_s, "flops": cost.flops,
                 **({"cuda_graphs": pool.graph_mode} if graphed else {})})
            ctx.log(f"  {what:<54}: {t.median_s * 1e3:7.2f} ms, {cost.bytes / t.median_s / 1e12:5.2f} TB/s")


def _timed(ctx, step):
    return None if step is None else ctx.time(step)


def _sleep_cycles_per_s(dev) -> float:
    """How many ``torch.cuda._sleep`` cycles make a second on this card (measured once)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    torch.cuda.synchronize(dev)
    return 10_000_000 / (start.elapsed_time(end) / 1e3)


def profile_step(step, dev, warmup: int, repeats: int, cycles_per_s: float | None = None) -> dict:
    """Medians over ``repeats`` calls of ``step`` (after ``warmup``): ``host_s`` (the call's own time),
    ``wall_s`` (to the end of its GPU work) and on CUDA ``gpu_s`` (CUDA events around the step, its launches
    queued behind a head start twice the host's time, so the GPU runs them back to back); else None."""
    cuda = dev.type == "cuda"
    for _ in range(warmup):
        step()
    host, wall, gpu = [], [], []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        if cuda:
            torch.cuda.synchronize(dev)
        host.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(2 * (t1 - t0) * cycles_per_s))
            start.record()
            step()
            end.record()
            torch.cuda.synchronize(dev)
            gpu.append(start.elapsed_time(end) / 1e3)
    med = statistics.median
    return {"host_s": med(host), "wall_s": med(wall), "gpu_s": med(gpu) if gpu else None,
            "repeats": repeats}


def flex_decode_alone(ctx, pool: DecodePool, b: int, L: int, backend) -> dict:
    """One layer's FlexAttention decode of ``b`` rows at context ``L`` over the pool (the block mask built
    once, outside the timing): its time and the K and V bytes it reads (``b x L x H_kv x d x 2 x dtype``)."""
    from longctx.model.paged_flex import EAGER_WARNING, batch_bucket, compiled_flex

    cfg, dev = pool.model.config, pool.dev
    k, v = pool.cache.flat(0)
    masks = backend.backend.decode_state(k, pool.bs, dev)  # the backend's own masks: its compiled kernel's
    paged = paged_decodes([(i, t, L + 1) for i, (t, _, _) in enumerate(pool.chunks(b, L))], masks)
    keys, values = (x.permute(1, 0, 2).unsqueeze(0) for x in (k, v))  # [1, H_kv, num_slots, d]
    qd = torch.randn(batch_bucket(b), cfg.num_heads, 1, cfg.head_dim, device=dev, dtype=ctx.dtype)

    def call():
        if dev.type == "cuda":
            return compiled_flex(qd, keys, values, paged.block_mask)
        from torch.nn.attention.flex_attention import flex_attention

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=EAGER_WARNING)
            return flex_attention(qd, keys, values, block_mask=paged.block_mask, enable_gqa=True)

    t = ctx.time(call)
    read = b * (L + 1) * cfg.num_kv_heads * cfg.head_dim * 2 * int(dtype_bytes(ctx.config.dtype))
    return {"time_s": t.median_s, "timer": t.timer, "kv_bytes": read, "bytes_per_s": read / t.median_s,
            "share_of_copy_ceiling": read / t.median_s / ctx.record["ceilings"]["copy"]["bytes_per_s"]}


def decode_profile(ctx, name: str) -> None:
    """Per ``decode_profile_points`` point and variant: host vs GPU vs wall time of one decode step; and the
    FlexAttention decode kernel alone (when the fused backend runs)."""
    c, dev = ctx.config, ctx.device
    points = _points(ctx, name, list(c.decode_profile_points), "decode profile")
    if not points or (pool := _pool(ctx, name, points)) is None:
        return
    cycles = _sleep_cycles_per_s(dev) if dev.type == "cuda" else None
    rows, timed = ctx.record.setdefault("decode_profile", []), variants(ctx)
    for b, L in points:
        for label, choice, graphed in timed:
            what = f"{name} decode profile batch {b} context {L} {label}"

            def measure(b=b, L=L, k=choice.backend, graphed=graphed):
                step = (pool.graph_step if graphed else pool.eager_step)(b, L, k)
                return None if step is None else profile_step(step, dev, c.warmup, c.repeats, cycles)

            if (p := ctx.point(what, measure)) is None:
                continue
            bound = None if p["gpu_s"] is None else ("launch" if p["host_s"] > p["gpu_s"] else "GPU")
            rows.append({"model": name, "attention_backend": choice.name, "batch_size": b,
                         "context_tokens": L, "cuda_graphs": pool.graph_mode if graphed else "off", **p,
                         "bound": bound, "gpu_time": "cuda-events" if p["gpu_s"] is not None
                         else "absent (no GPU)"})
            gpu = "GPU absent" if p["gpu_s"] is None else f"GPU {p['gpu_s'] * 1e3:.2f} ms ({bound}-bound)"
            ctx.log(f"  {what:<56}: host {p['host_s'] * 1e3:.2f} ms, {gpu}, wall {p['wall_s'] * 1e3:.2f} ms")
        fused = [ch for _, ch, _ in timed if ch.name == "fused"]
        if fused:
            what = f"{name} flex decode kernel batch {b} context {L}"
            k = ctx.point(what, lambda b=b, L=L, f=fused[0]: flex_decode_alone(ctx, pool, b, L, f))
            if k is None:
                continue
            ctx.record.setdefault("flex_decode", []).append({"batch_size": b, "context_tokens": L, **k})
            ctx.log(f"  {what:<56}: {k['time_s'] * 1e6:.1f} us, {k['bytes_per_s'] / 1e12:.2f} TB/s "
                    f"({k['share_of_copy_ceiling']:.0%} of copy)")

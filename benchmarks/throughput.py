"""Throughput: our engine versus transformers' ``generate`` on the same 16 prompts, same CPU, one run.

Both decode greedily up to ``--max-tokens`` tokens per prompt, stopping at EOS (``<|im_end|>``); tokens/s
counts the tokens each prompt really gets (up to and including its EOS). transformers runs the 16 prompts as
one left-padded batch (its fastest mode here; ``--hf-sequential`` also times one prompt at a time): the
batch keeps computing every row until the longest answer ends. Our engine batches continuously over the
paged KV cache: a finished request leaves the batch at once. ``--ignore-eos`` makes every prompt generate
exactly ``--max-tokens`` tokens, which removes that advantage (the two then do the same work).

    python benchmarks/throughput.py --json out.json

Measured 2026-11-29, 2 threads on the course's 2-core VM, torch 2.13.0 CPU, fp32, up to 128 tokens each
(answers of 33-128 tokens, all 16 token-identical between the two):

    ours (chunked, budget 512)             15.56 s    98.6 tokens/s
    transformers generate (batch of 16)    13.34 s   115.0 tokens/s    ratio 0.86x
    transformers generate (one at a time)  88.01 s    17.4 tokens/s    ratio 5.7x

Against a static batch that starts all 16 prompts together, continuous batching cannot win much on a
CPU: each decode step streams all 540 MB of fp32 weights whatever the batch size (~0.1 s), and both run
~128 steps. (An earlier run at 1 thread under load gave 1.07x.) It wins when requests arrive over time or
are served one by one, the way ``generate`` is usually called per request.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sys
import time
import warnings
from pathlib import Path

QUESTIONS = [
    "What is the capital of France, and why did it become the capital?",
    "Explain photosynthesis to a ten-year-old.",
    "Write a haiku about autumn rain.",
    "List three uses of a paperclip that are not holding paper.",
    "Why is the sea salty?",
    "Give me a recipe for pancakes.",
    "What is the difference between weather and climate?",
    "Summarise the plot of Romeo and Juliet in two sentences.",
    "How does a refrigerator keep food cold?",
    "Suggest a name for a friendly robot and explain it.",
    "What are prime numbers? Give five examples.",
    "Describe the smell of a forest after rain.",
    "How do airplanes stay in the air?",
    "Write a short motivational message for a student before an exam.",
    "What is the tallest mountain in the world and how tall is it?",
    "Explain what a computer program is, in simple words.",
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens generated per prompt")
    p.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens per prompt")
    p.add_argument("--prompts", type=int, default=16, help="how many prompts (at most 16)")
    p.add_argument("--token-budget", type=int, default=512, help="our chunked scheduler's token budget")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--hf-sequential", action="store_true", help="also time transformers one prompt at a time")
    p.add_argument("--json", type=Path, default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)
    if not 1 <= args.prompts <= len(QUESTIONS) or args.max_tokens < 1:
        p.error(f"--prompts must be 1..{len(QUESTIONS)} and --max-tokens >= 1")
    return args


def load_hf(ignore_eos: bool):
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from longctx.model.weights import find_gguf

    hf_logging.disable_progress_bar()
    path = find_gguf()
    with warnings.catch_warnings(), open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        warnings.simplefilter("ignore")  # and its GGUF progress bars
        model = LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.generation_config.eos_token_id = None if ignore_eos else 2
    model.generation_config.pad_token_id = 2
    return model.eval()


def until_eos(ids: list[int], eos: int | None) -> list[int]:
    return ids[: ids.index(eos) + 1] if eos is not None and eos in ids else ids


def hf_generate(model, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[list[int]]]:
    """One left-padded batch; returns (seconds, generated ids per prompt, cut after EOS)."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.tensor([[2] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=max_tokens,
            do_sample=False,
        )
    seconds = time.perf_counter() - t0
    eos = model.generation_config.eos_token_id
    return seconds, [until_eos(row, eos) for row in out[:, width:].tolist()]


def ours_generate(model, prompts, max_tokens, token_budget, eos) -> tuple[float, list[list[int]]]:
    from longctx.engine import ChunkedPrefillScheduler, Engine
    from longctx.engine.torch_executor import TorchExecutor
    from longctx.kv.block_manager import BlockManager, blocks_for_tokens

    num_blocks = sum(blocks_for_tokens(len(p) + max_tokens, 16) for p in prompts)
    engine = Engine(
        TorchExecutor(model, num_blocks, 16),
        ChunkedPrefillScheduler(token_budget),
        BlockManager(num_blocks, 16),
    )
    t0 = time.perf_counter()
    seqs = [engine.add_request(p, max_tokens=max_tokens, eos_token_id=eos) for p in prompts]
    engine.run_until_done()
    return time.perf_counter() - t0, [s.output_token_ids for s in seqs]


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch

    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    torch.set_num_threads(args.threads)
    tok = load_tokenizer()
    prompts = [tok.encode_chat(q) for q in QUESTIONS[: args.prompts]]
    ours_model, hf_model = load_model(), load_hf(args.ignore_eos)
    eos = None if args.ignore_eos else tok.eos_token_id
    # warm-up both (first calls allocate and pick kernels)
    ours_generate(ours_model, prompts[:2], 2, args.token_budget, eos)
    hf_generate(hf_model, prompts[:2], 2)
    ours_s, ours_out = ours_generate(ours_model, prompts, args.max_tokens, args.token_budget, eos)
    hf_s, hf_out = hf_generate(hf_model, prompts, args.max_tokens)
    agree = sum(a == b for a, b in zip(ours_out, hf_out, strict=True))
    n_tokens = sum(map(len, ours_out))
    n_hf = sum(map(len, hf_out))
    result = {
        "ours_tokens_per_s": n_tokens / ours_s,
        "hf_batched_tokens_per_s": n_hf / hf_s,
        "ratio": (n_tokens / ours_s) / (n_hf / hf_s),
        "ours_tokens": n_tokens,
        "hf_tokens": n_hf,
        "output_lengths": [len(o) for o in ours_out],
        "ignore_eos": args.ignore_eos,
        "ours_s": ours_s,
        "hf_batched_s": hf_s,
        "prompts": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "max_tokens": args.max_tokens,
        "identical_outputs": agree,
    }
    lengths = sorted(len(o) for o in ours_out)
    print(
        f"{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), greedy, "
        f"{'exactly' if args.ignore_eos else 'up to'} {args.max_tokens} tokens each "
        f"(got {lengths[0]}-{lengths[-1]}), torch {torch.__version__}, {args.threads} threads"
    )
    print(f"{'engine':<36}{'seconds':>9}{'tokens/s':>10}")
    print(
        f"{'ours (chunked, budget ' + str(args.token_budget) + ')':<36}{ours_s:>9.2f}{n_tokens / ours_s:>10.1f}"
    )
    print(
        f"{'transformers generate (batch of ' + str(len(prompts)) + ')':<36}{hf_s:>9.2f}{n_hf / hf_s:>10.1f}"
    )
    if args.hf_sequential:
        runs = [hf_generate(hf_model, [p], args.max_tokens) for p in prompts]
        seq_s, n_seq = sum(r[0] for r in runs), sum(len(r[1][0]) for r in runs)
        result |= {"hf_sequential_s": seq_s, "hf_sequential_tokens_per_s": n_seq / seq_s}
        print(f"{'transformers generate (one at a time)':<36}{seq_s:>9.2f}{n_seq / seq_s:>10.1f}")
    print(
        f"ratio ours / transformers batched: {result['ratio']:.2f}x "
        f"({agree}/{len(prompts)} outputs token-identical; padding changes rounding)"
    )
    if args.json:
        result["provenance"] = {
            "date": datetime.date.today().isoformat(),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": args.threads,
            "device": "cpu",
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

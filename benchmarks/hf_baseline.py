"""The transformers baseline of benchmarks/throughput.py: SmolLM2 as ``LlamaForCausalLM`` (read from the same
GGUF), served the best way a user can without a serving engine (static left-padded batches of whatever has
arrived, each run to completion), and one decode forward with its ``DynamicCache`` for the per-step table."""

from __future__ import annotations

import contextlib
import os
import time
import warnings


def load_hf():
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import torch
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    from longctx.model.weights import find_gguf

    hf_logging.disable_progress_bar()
    path = find_gguf()
    with warnings.catch_warnings(), open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        warnings.simplefilter("ignore")
        model = LlamaForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    model.generation_config.eos_token_id = None  # equal work: every answer runs to max_tokens
    model.generation_config.pad_token_id = 2
    return model.eval()


def hf_static_batch(model, batch: list[dict], t0: float) -> None:
    """``generate`` one left-padded batch; stamps each request's token times (seconds since t0)."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    step_times: list[float] = []

    class Stamp(LogitsProcessor):
        def __call__(self, input_ids, scores):
            step_times.append(time.perf_counter() - t0)
            return scores

    width = max(len(r["ids"]) for r in batch)
    ids = torch.tensor([[2] * (width - len(r["ids"])) + r["ids"] for r in batch])
    mask = torch.tensor([[0] * (width - len(r["ids"])) + [1] * len(r["ids"]) for r in batch])
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False,
            logits_processor=LogitsProcessorList([Stamp()]),
            max_new_tokens=max(r["max_tokens"] for r in batch), min_new_tokens=1,
        )
    end = time.perf_counter() - t0  # tokens are only returned at the end, but they exist per step
    for r in batch:
        r["times"] = step_times[: r["max_tokens"]]
        r["returned_s"] = end


def serve_hf(model, reqs, max_batch: int) -> tuple[list[dict], float]:
    """Whenever the model is idle, every arrived request (up to ``max_batch``) as one static batch, run to
    completion; returns the requests with their token times and the wall seconds."""
    todo, finished = [dict(r) for r in reqs], []
    t0 = time.perf_counter()
    while todo:
        now = time.perf_counter() - t0
        if todo[0]["arrival_s"] > now:
            time.sleep(todo[0]["arrival_s"] - now)
            now = time.perf_counter() - t0
        batch = [r for r in todo if r["arrival_s"] <= now][:max_batch]
        hf_static_batch(model, batch, t0)
        finished += batch
        todo = [r for r in todo if "times" not in r]
    return finished, time.perf_counter() - t0


def step_hf(model, batch_size: int, context: int):
    """One forward of transformers at the same batch and context, with its DynamicCache (a function)."""
    import torch
    from transformers import DynamicCache

    c = model.config
    kv_heads, head_dim = c.num_key_value_heads, c.hidden_size // c.num_attention_heads
    cache = DynamicCache(config=c)
    for layer in range(c.num_hidden_layers):
        k = torch.randn(batch_size, kv_heads, context, head_dim)
        cache.update(k, torch.randn_like(k), layer)
    ids = torch.full((batch_size, 1), 5)
    mask = torch.ones(batch_size, context + 1, dtype=torch.long)
    pos = torch.full((batch_size, 1), context)

    def one_step():
        with torch.inference_mode():
            model(input_ids=ids, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True)
        cache.crop(-1)  # back to `context` cached tokens
        assert cache.get_seq_length() == context

    return one_step

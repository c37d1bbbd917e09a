"""The engine on the real model, in one call: ``build_engine`` and ``generate`` (SmolLM2-135M-Instruct)."""

from __future__ import annotations

from longctx.engine.clock import Clock
from longctx.engine.engine import Engine
from longctx.engine.scheduler import ChunkedPrefillScheduler, MonolithicScheduler, Scheduler
from longctx.engine.torch_executor import TorchExecutor
from longctx.kv.hybrid import block_manager_for, kv_cache_groups, pool_blocks_for_tokens

DEFAULT_NUM_BLOCKS = 256  # 4096 tokens of 16; for SmolLM2 in fp32: 4096 x 46 KB = 189 MB of KV


def build_engine(
    scheduler: Scheduler | None = None, num_blocks: int | None = None, block_size: int = 16,
    device="cpu", dtype=None, clock: Clock | None = None, model=None, kv_dtype: str | None = None,
    enable_prefix_caching: bool = False, press=None, attention_backend: str | None = None,
    model_name: str | None = None,
):
    """An ``Engine`` running ``model_name`` (default SmolLM2-135M-Instruct; ``longctx.model.registry``) on
    ``device``, or the given loaded ``model`` with ``model_name``'s tokenizer; returns
    ``(engine, tokenizer)``.

    ``num_blocks`` defaults to ``DEFAULT_NUM_BLOCKS`` per KV-cache group (one group for a full-attention
    model; ``longctx.kv.hybrid``).

    The KV pool is ``num_blocks`` blocks of ``block_size`` tokens, stored as ``kv_dtype``
    (``longctx.kv.quant``; default: the model's dtype), sharing cached prefix blocks when
    ``enable_prefix_caching``; ``press`` (a ``longctx.kv.press.Press``) prunes each prompt's KV cache when
    its prefill ends (not with prefix caching). The scheduler defaults to ``ChunkedPrefillScheduler(512)``.
    EOS is ``<|im_end|>``. ``attention_backend``: auto, reference or fused (``longctx.model.attention``; None:
    the model's own choice, ``auto`` for a model loaded here).
    """
    from longctx.model.tokenizer import load_tokenizer
    from longctx.model.weights import load_model

    model = model if model is not None else load_model(device=device, dtype=dtype, model=model_name)
    tokenizer = load_tokenizer(model_name)
    if num_blocks is None:
        num_blocks = DEFAULT_NUM_BLOCKS * len(kv_cache_groups(model.config))
    pool = block_manager_for(model.config, num_blocks, block_size, enable_prefix_caching)
    engine = Engine(
        TorchExecutor(model, pool, press=press, kv_dtype=kv_dtype, attention_backend=attention_backend),
        scheduler if scheduler is not None else ChunkedPrefillScheduler(512),
        clock=clock,
        max_model_len=model.config.max_context,
        eos_token_id=tokenizer.eos_token_id,
        vocab_size=model.config.vocab_size,
    )
    return engine, tokenizer


def generate(
    model, prompt_token_ids: list[int], max_tokens: int, chunk_size: int | None = None,
    eos_token_id: int | None = None, block_size: int = 16, press=None, attention_backend: str | None = None,
) -> list[int]:
    """Greedy completion of one prompt; prefill in chunks of ``chunk_size`` (None: all at once); ``press``
    (a ``longctx.kv.press.Press``) prunes the prompt's KV cache when its prefill ends; ``attention_backend``
    as in ``build_engine``."""
    scheduler = MonolithicScheduler() if chunk_size is None else ChunkedPrefillScheduler(chunk_size)
    num_blocks = max(1, pool_blocks_for_tokens(model.config, len(prompt_token_ids) + max(1, max_tokens),
                                               block_size))
    engine = Engine(
        TorchExecutor(model, block_manager_for(model.config, num_blocks, block_size), press=press,
                      attention_backend=attention_backend),
        scheduler,
        max_model_len=model.config.max_context,
        eos_token_id=eos_token_id,
        vocab_size=model.config.vocab_size,
    )
    seq = engine.add_request(prompt_token_ids, max_tokens)
    engine.run_until_done()
    return seq.output_token_ids

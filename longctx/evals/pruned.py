"""Needle trials under many presses from ONE prefill, and what each press kept of the needle.

A press decides from what the prefill left behind: every layer's keys and values and, for SnapKV and H2O,
the prompt's queries. ``PrefillSnapshot.capture(model, prompt)`` runs the prompt's prefill once and keeps
exactly that (post-RoPE keys and values ``[H_kv, P, d]`` and queries ``[H, P, d]`` per layer, and the logits
of the last prompt position). From it, any number of presses are applied without prefilling again:

    keep[layer] = press.keep_indices(snapshot.press_input(layer, T, press))   # T = P, or the question's start
    cache       = the kept K/V of every layer, compacted into slots 0 … kept-1
    then, as longctx.evals.forcing.forced_logits does after its prune: the question (question-agnostic only)
    and the answer teacher-forced over the pruned cache, and greedy decoding (longctx.evals.niah.read_answer)

This is the same computation as ``NiahRunner(model, tok, press=...)`` trial by trial (a test checks kept sets,
log-probabilities and outputs against it), at the cost of one prefill per prompt instead of one per press.

``needle_retention(keep, start, length)`` is the picture of what a press kept of the needle: a boolean
``[layers, H_kv, needle tokens]`` array.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from longctx.evals.forcing import forward_at
from longctx.evals.niah import DECODE_EXTRA_TOKENS, AnswerReading, GreedyAnswer
from longctx.kv.press import Press, PressInput, attention_weights, compact
from longctx.memory import blocks_for_tokens


@dataclass
class PrefillSnapshot:
    """One prompt's prefill: ``keys[l]``/``values[l]`` ``[H_kv, P, d]``, ``queries[l]`` ``[H, P, d]``
    (post-RoPE), ``last_logits`` ``[1, vocab]`` (the row that predicts the first answer token with the whole
    cache)."""

    token_ids: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    queries: list[torch.Tensor]
    last_logits: torch.Tensor
    _attention_sums: dict = field(default_factory=dict, repr=False)  # (layer, T) -> [H, T]

    @classmethod
    def capture(cls, model, token_ids: list[int], block_size: int = 16) -> PrefillSnapshot:
        from longctx.kv.cache import PagedKVCache

        P = len(token_ids)
        if P < 1:
            raise ValueError("a snapshot needs a prompt of at least one token")
        p = next(model.parameters())
        nb = blocks_for_tokens(P, block_size)
        cache = PagedKVCache.for_model(model.config, nb, block_size, p.device, p.dtype)
        queries: dict[int, torch.Tensor] = {}

        def probe_for(layer):
            def probe(q, keys, row):  # q [P, H, d] of this (single) prefill chunk
                queries[layer] = q.transpose(0, 1).clone()  # [H, P, d]
            return probe

        attns = [block.attn for block in model.layers]
        try:
            for i, attn in enumerate(attns):
                attn.probe = probe_for(i)
            last = forward_at(
                model, cache, list(range(nb)), list(token_ids), 0, [P - 1], block_size=block_size
            )
        finally:
            for attn in attns:
                attn.probe = None
        keys, values = [], []
        for layer in range(len(attns)):
            k, v = cache.flat(layer)  # [slots, H_kv, d]; slot s is token s (table 0 … nb-1)
            keys.append(k[:P].transpose(0, 1).clone())  # [H_kv, P, d]
            values.append(v[:P].transpose(0, 1).clone())
        return cls(list(token_ids), keys, values, [queries[i] for i in range(len(attns))], last)

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def attention_sum(self, layer: int, num_tokens: int) -> torch.Tensor:
        """``[H, T]``: causal attention of queries ``0 … T-1`` summed per key (what the engine
        accumulates)."""
        key = (layer, num_tokens)
        if key not in self._attention_sums:
            q, k = self.queries[layer][:, :num_tokens], self.keys[layer][:, :num_tokens]
            self._attention_sums[key] = attention_weights(q, k).sum(dim=1)
        return self._attention_sums[key]

    def press_input(self, layer: int, num_tokens: int, press: Press) -> PressInput:
        """What ``press`` sees when it prunes the first ``num_tokens`` prompt tokens of ``layer``."""
        if not 1 <= num_tokens <= len(self.token_ids):
            raise ValueError(f"num_tokens must be in [1, {len(self.token_ids)}], got {num_tokens}")
        T, w = num_tokens, press.query_window
        queries = self.queries[layer][:, max(0, T - w) : T] if w else None
        total = self.attention_sum(layer, T) if press.uses_attention_sum else None
        return PressInput(self.keys[layer][:, :T], self.values[layer][:, :T], queries, total)

    def keep_indices(self, press: Press, num_tokens: int | None = None) -> list[torch.Tensor]:
        """Per layer, ``[H_kv, kept]`` positions ``press`` keeps of the first ``num_tokens`` (default all)."""
        T = len(self.token_ids) if num_tokens is None else int(num_tokens)
        press.check_prompt(T)
        return [press.keep_indices(self.press_input(layer, T, press)) for layer in range(self.num_layers)]


def needle_retention(keep: list[torch.Tensor], start: int, length: int) -> np.ndarray:
    """``[layers, H_kv, length]`` booleans: did each layer's KV head keep needle token ``start + i``?"""
    positions = torch.arange(int(start), int(start) + int(length))
    return np.stack([np.stack([torch.isin(positions, head).numpy() for head in k]) for k in keep])


@dataclass(frozen=True)
class PrunedAnswer:
    """The ``AnswerReading`` of one press on one snapshot, with what it kept of every layer."""

    reading: AnswerReading
    keep: list[torch.Tensor]
    kept_tokens: int


class PrunedScorer:
    """Applies presses to a snapshot's prompt and reads each answer, several presses batched at once.

    ``answer_many(prompt, [(press, question_aware), ...])`` gives each press its own block range of one KV
    pool (at most ``max_batch`` presses per pool), runs every press's question (question-agnostic) and
    teacher-forced answer in ONE forward pass, then decodes all the greedy answers together, one batched
    step per token. Batched decodes pad keys to the longest context, so logits agree with one-by-one
    scoring to rounding (a test compares with ``NiahRunner``)."""

    def __init__(self, model, tokenizer, snapshot: PrefillSnapshot, block_size: int = 16,
                 extra_tokens: int = DECODE_EXTRA_TOKENS, max_batch: int = 16) -> None:
        if int(max_batch) < 1 or int(extra_tokens) < 0:
            raise ValueError(f"need max_batch >= 1 and extra_tokens >= 0, got {max_batch}, {extra_tokens}")
        self.model, self.tok, self.snap = model, tokenizer, snapshot
        self.block_size, self.extra_tokens, self.max_batch = (
            int(block_size), int(extra_tokens), int(max_batch),
        )

    def answer(self, prompt, press: Press | None, question_aware: bool = True) -> PrunedAnswer:
        return self.answer_many(prompt, [(press, question_aware)])[0]

    def answer_many(self, prompt, configs) -> list[PrunedAnswer]:
        """One ``PrunedAnswer`` per ``(press or None, question_aware)``, in order. ``prompt``: the
        ``NeedlePrompt`` whose ``token_ids`` this snapshot prefilled."""
        if list(prompt.token_ids) != self.snap.token_ids:
            raise ValueError("the prompt is not the one this snapshot prefilled")
        out: list[PrunedAnswer] = []
        for g in range(0, len(configs), self.max_batch):
            out += self._group(prompt, list(configs[g : g + self.max_batch]))
        return out

    def _keep(self, press, split):
        if press is None:
            return [torch.arange(split).expand(k.shape[0], split) for k in self.snap.keys]
        return self.snap.keep_indices(press, split)

    def _group(self, prompt, configs) -> list[PrunedAnswer]:
        from longctx.kv.cache import ChunkSlots, PagedKVCache, build_attention_metadata

        P, ans, bs = len(prompt.token_ids), list(prompt.answer_ids), self.block_size
        m, budget = len(ans), len(ans) + self.extra_tokens
        splits = [P if aware or prompt.question_start < 1 else prompt.question_start for _, aware in configs]
        keeps = [self._keep(press, split) for (press, _), split in zip(configs, splits, strict=True)]
        kept = [k[0].shape[1] for k in keeps]
        # blocks each
        sizes = [blocks_for_tokens(n + P - s + budget, bs) for n, s in zip(kept, splits, strict=True)]
        firsts = [sum(sizes[:i]) for i in range(len(sizes))]
        tables = [list(range(f, f + n)) for f, n in zip(firsts, sizes, strict=True)]
        p = next(self.model.parameters())
        cache = PagedKVCache.for_model(self.model.config, sum(sizes), bs, p.device, p.dtype)
        for layer in range(self.snap.num_layers):
            k_flat, v_flat = cache.flat(layer)  # [slots, H_kv, d]; config i's slots start at firsts[i] * bs
            for i, keep in enumerate(keeps):
                base = firsts[i] * bs
                k_flat[base : base + kept[i]] = compact(
                    self.snap.keys[layer][:, : splits[i]], keep[layer]
                ).transpose(0, 1)
                v_flat[base : base + kept[i]] = compact(
                    self.snap.values[layer][:, : splits[i]], keep[layer]
                ).transpose(0, 1)
        # one forward: each config's question (if agnostic) and its answer but the last token
        chunks, ids, rows, own_rows = [], [], [], []
        for i, s in enumerate(splits):
            new = list(prompt.token_ids[s:]) + ans[:-1]
            r0 = len(ids)
            mine = ([r0 + P - s - 1] if s < P else []) + [r0 + P - s + j for j in range(m - 1)]
            own_rows.append(list(range(len(rows), len(rows) + len(mine))))
            rows += mine
            if new:
                chunks.append(ChunkSlots(tables[i], kept[i], len(new), first_position=s))
                ids += new
        logits = self._run(ids, chunks, rows, cache, build_attention_metadata) if ids else None
        greedy = []
        for i, s in enumerate(splits):
            mine = logits[own_rows[i]] if own_rows[i] else self.snap.last_logits[:0]
            forced = mine if s < P else torch.cat([self.snap.last_logits.float(), mine.float()])
            greedy.append(GreedyAnswer(forced, prompt, self.tok, budget))
        cached = [n + P - s for n, s in zip(kept, splits, strict=True)]
        while True:  # one batched decode step for every answer still open
            active = [i for i, g in enumerate(greedy) if not g.done]
            if not active:
                break
            steps = [len(greedy[i].output_ids) - 1 for i in active]
            chunks = [ChunkSlots(tables[i], cached[i] + k, 1, P + k)
                      for i, k in zip(active, steps, strict=True)]
            out = self._run(
                [greedy[i].output_ids[-1] for i in active], chunks, list(range(len(active))), cache,
                build_attention_metadata,
            )
            for i, token in zip(active, out.argmax(-1).tolist(), strict=True):
                greedy[i].push(token)
        return [PrunedAnswer(g.reading(), k, n) for g, k, n in zip(greedy, keeps, kept, strict=True)]

    def _run(self, ids, chunks, rows, cache, build):
        dev = next(self.model.parameters()).device
        meta = build(chunks, self.block_size, dev)
        with torch.inference_mode():
            out = self.model(
                torch.tensor(ids, device=dev), cache, meta, logits_rows=torch.tensor(rows, device=dev)
            )
        return out.float()


def continuation_nll_many(model, snapshot: PrefillSnapshot, presses, continuation_ids: list[int],
                          block_size: int = 16) -> list[float]:
    """Mean NLL (nats per token) of ``continuation_ids`` after the snapshot's context, its cache pruned by
    each press in turn (None: the full cache): ``longctx.evals.forcing.continuation_nll`` for many presses
    from one prefill. The first continuation token is predicted by the full prefill (the press runs after
    it), the others over the pruned cache."""
    from longctx.kv.cache import PagedKVCache

    c = list(continuation_ids)
    if not c:
        raise ValueError("need a continuation of at least one token")
    P = len(snapshot.token_ids)
    p = next(model.parameters())
    nb = blocks_for_tokens(P + len(c), block_size)
    cache = PagedKVCache.for_model(model.config, nb, block_size, p.device, p.dtype)
    table, targets = list(range(nb)), torch.tensor(c, device=p.device)
    out = []
    for press in presses:
        keep = (snapshot.keep_indices(press) if press is not None else
                [torch.arange(P).expand(k.shape[0], P) for k in snapshot.keys])
        kept = keep[0].shape[1]
        for layer, k_l in enumerate(keep):
            k_flat, v_flat = cache.flat(layer)
            k_flat[:kept] = compact(snapshot.keys[layer], k_l).transpose(0, 1)
            v_flat[:kept] = compact(snapshot.values[layer], k_l).transpose(0, 1)
        logits = snapshot.last_logits.float()
        if len(c) > 1:
            rest = forward_at(model, cache, table, c[:-1], kept, list(range(len(c) - 1)), P, block_size)
            logits = torch.cat([logits, rest])
        out.append(float(-torch.log_softmax(logits, dim=-1).gather(1, targets[:, None]).mean()))
    return out

"""KV pruning in the real engine: a press (``longctx.kv.press``) applied to each sequence's paged cache.

``TorchExecutor(model, block_manager, press=...)`` owns a ``PressRecorder``. While a sequence's prompt is
prefilled (in one step or in chunks), the recorder collects what the press declared it reads, from the
model's attention ``probe`` hook: the last ``query_window`` queries of each layer (SnapKV) and/or every
prompt query's attention summed per key (H2O), accumulated chunk by chunk. In the step that completes the
prefill, after the forward pass (so the first output token still saw the whole prompt):

    for each layer:  keys, values = the sequence's K/V  [H_kv, T, d]
                     keep = press.keep_indices(...)      [H_kv, kept], per head
                     write each head's kept K/V to the sequence's first ``kept`` slots (compaction)

and reports ``T - kept`` evicted tokens; the engine then shrinks the sequence's block table, so the
blocks past ``kept`` return to the pool at once. Later tokens keep their true positions (keys are cached
after RoPE). A press with ``rolling`` set (StreamingLLM) keeps its budget during decode too: whenever a
sequence has a block's worth of tokens over the budget, the oldest block after the press's ``n_sink`` first
tokens is evicted.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from longctx.kv.block_manager import slots
from longctx.kv.press import Press, PressInput, attention_weights, compact, make_press


def press_from_options(name: str | None, compression_ratio: float | None) -> Press | None:
    """The press of the ``--press NAME --compression-ratio R`` options (the CLI's and the server's), or None
    without a name; clear errors when only one of the two is given."""
    if name is None:
        if compression_ratio is not None:
            raise ValueError("--compression-ratio needs --press NAME")
        return None
    if compression_ratio is None:
        raise ValueError("--press needs --compression-ratio R, a fraction in [0, 1)")
    return make_press(name, compression_ratio)


class PressRecorder:
    """Per-sequence state of one press across prefill chunks, and the compaction of the cache."""

    def __init__(self, press: Press, model) -> None:
        if not isinstance(press, Press):
            raise ValueError(f"press must be a longctx.kv.press.Press, got {type(press).__name__}")
        self.press, self.model = press, model
        self._state: dict[int, dict] = {}  # seq id -> {"queries": {layer: [H, <=w, d]}, "attention": {...}}
        self._budget: dict[int, int] = {}  # seq id -> tokens a rolling press keeps during decode
        self._rows: dict[int, int] = {}  # first row of this step -> seq id (prefill chunks recorded)

    @property
    def collects(self) -> bool:
        return bool(self.press.query_window or self.press.uses_attention_sum)

    def forget(self, seq_id: int) -> None:
        self._state.pop(seq_id, None)
        self._budget.pop(seq_id, None)

    @contextmanager
    def recording(self, chunks):
        """Collect during one forward pass. ``chunks``: ``(seq_id, first_row, starts_prompt)`` of the
        step's prefill chunks (``starts_prompt``: the chunk begins at position 0, so earlier state is
        stale)."""
        self._rows = {}
        for seq_id, row, starts in chunks:
            if starts or seq_id not in self._state:
                self._state[seq_id] = {"queries": {}, "attention": {}}
            self._rows[row] = seq_id
        layers = [block.attn for block in self.model.layers]
        if not (self.collects and self._rows):
            yield
            return
        for i, attn in enumerate(layers):
            attn.probe = self._probe(i)
        try:
            yield
        finally:
            for attn in layers:
                attn.probe = None

    def _probe(self, layer: int):
        window, summed = self.press.query_window, self.press.uses_attention_sum

        def probe(q, keys, row):
            seq_id = self._rows.get(row)
            if seq_id is None:
                return  # a decode, or a sequence the press does not touch
            state = self._state[seq_id]
            qt = q.transpose(0, 1)  # [H, n, d]
            if window:
                prev = state["queries"].get(layer)
                both = qt if prev is None else torch.cat([prev, qt], dim=1)
                state["queries"][layer] = both[:, -window:].clone()
            if summed:
                add = attention_weights(qt, keys[0]).sum(dim=1)  # [H, kv_len]
                prev = state["attention"].get(layer)
                if prev is not None:
                    add[:, : prev.shape[1]] += prev
                state["attention"][layer] = add

        return probe

    def compress(self, cache, table: list[int], seq_id: int, num_tokens: int) -> int:
        """Compact sequence ``seq_id``'s ``num_tokens`` cached tokens with the press; returns how many it
        evicted per KV head (0 when it keeps them all)."""
        state = self._state.pop(seq_id, {"queries": {}, "attention": {}})
        kept = self.press.num_kept(num_tokens)
        if kept >= num_tokens:
            return 0  # nothing to evict (ratio 0, or a short prompt): the cache stays exact, also later
        if self.press.rolling:
            self._budget[seq_id] = kept
        where = _slots_of(cache, table, num_tokens)
        for layer in range(len(self.model.layers)):
            inp = self._input(cache, where, state, layer)
            keep = self.press.keep_indices(inp).to(inp.keys.device)  # [H_kv, kept]
            k_flat, v_flat = cache.flat(layer)  # [num_slots, H_kv, d]
            k_flat[where[:kept]] = compact(inp.keys, keep).transpose(0, 1)  # [kept, H_kv, d]
            v_flat[where[:kept]] = compact(inp.values, keep).transpose(0, 1)
        return num_tokens - kept

    def layer_input(self, cache, table: list[int], seq_id: int, num_tokens: int, layer: int) -> PressInput:
        """What the press would see for ``layer`` of sequence ``seq_id`` now (its first ``num_tokens``
        cached tokens and what was collected so far): to look at a press's choice without pruning."""
        return self._input(
            cache, _slots_of(cache, table, num_tokens),
            self._state.get(seq_id, {"queries": {}, "attention": {}}), layer,
        )

    @staticmethod
    def _input(cache, where, state, layer) -> PressInput:
        k_flat, v_flat = cache.flat(layer)  # [num_slots, H_kv, d]
        keys, values = k_flat[where].transpose(0, 1), v_flat[where].transpose(0, 1)  # [H_kv, T, d] copies
        return PressInput(keys, values, state["queries"].get(layer), state["attention"].get(layer))

    def roll(self, cache, table: list[int], seq_id: int, num_cached: int) -> int:
        """For a rolling press: evict the oldest block of non-sink tokens once ``num_cached`` exceeds the
        budget by a block; returns how many tokens it evicted (0 or ``block_size``)."""
        budget, bs = self._budget.get(seq_id), cache.block_size
        if budget is None or num_cached < budget + bs:
            return 0
        sink = self.press.n_sink
        where = _slots_of(cache, table, num_cached)
        src, dst = where[sink + bs :], where[sink : num_cached - bs]
        for layer in range(len(self.model.layers)):
            for flat in cache.flat(layer):
                flat[dst] = flat[src].clone()  # shift the window down by one block: the oldest block goes
        return bs


def _slots_of(cache, table: list[int], num_tokens: int) -> torch.Tensor:
    """Pool slots ``[T]`` of a sequence's first ``num_tokens`` cached tokens (on the cache's device)."""
    return slots(torch.as_tensor(table), torch.arange(num_tokens), cache.block_size).to(cache.device)

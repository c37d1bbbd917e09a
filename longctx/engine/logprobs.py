"""Log-probabilities of sampled and prompt tokens, as the executor records them (torch).

``TokenLogprob`` is one token's record: its log-probability under the model's raw distribution (the logits
before any bias, penalty or temperature: vLLM's default ``raw_logprobs``), its rank (1: the most likely
token) and the ``k`` most likely tokens with theirs. ``LogprobRecorder`` keeps, per sequence, the records of
its sampled tokens (when its ``SamplingParams.logprobs`` is set) and of its prompt tokens from the second on
(``prompt_logprobs``: the first has no context, so no log-probability, as in vLLM and OpenAI's ``echo``).
A reader takes the new ones with ``take(seq_id)`` and drops the rest with ``forget(seq_id)`` when it is
done: records outlive the sequence (the engine finishes a sequence before the server reads its last token).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

ROWS_AT_ONCE = 256  # prompt rows turned into log-probabilities per pass (a [rows, vocab] float32 copy each)

@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...]  # the k most likely (token id, log-probability), most likely first


def token_logprobs(logits: torch.Tensor, token_ids: list[int], k: int) -> list[TokenLogprob]:
    """One record per row of ``logits`` ``[rows, vocab]``: the log-probability of ``token_ids[row]``."""
    lp = torch.log_softmax(logits.float(), dim=-1)
    targets = torch.tensor(token_ids, device=lp.device).unsqueeze(1)
    chosen = lp.gather(1, targets)  # [rows, 1]
    ranks = (lp > chosen).sum(dim=1) + 1
    if k > 0:
        top_lp, top_ids = lp.topk(k, dim=-1)
        tops = [tuple(zip(i, v, strict=True)) for i, v in zip(top_ids.tolist(), top_lp.tolist(), strict=True)]
    else:
        tops = [()] * len(token_ids)
    return [
        TokenLogprob(int(t), float(c), int(r), top)
        for t, c, r, top in zip(token_ids, chosen.squeeze(1).tolist(), ranks.tolist(), tops, strict=True)
    ]


class LogprobRecorder:
    """Per-sequence records of sampled-token and prompt-token log-probabilities."""

    def __init__(self) -> None:
        self.outputs: dict[int, list[TokenLogprob]] = {}
        self.prompts: dict[int, list[TokenLogprob]] = {}
        self._sent: dict[int, int] = {}  # seq id -> prompt records already taken

    def add_output(self, seq_id: int, row: torch.Tensor, token_id: int, k: int) -> None:
        self.outputs.setdefault(seq_id, []).extend(token_logprobs(row.unsqueeze(0), [token_id], k))

    def add_prompt_rows(self, seq, start: int, rows: torch.Tensor, k: int) -> None:
        """``rows``: the logits of positions ``start .. start + len(rows) - 1`` of ``seq``; each predicts the
        next position's token. Only prompt positions not recorded yet are kept (a recompute after preemption
        computes them again)."""
        done = self.prompts.setdefault(seq.seq_id, [])
        first = len(done) + 1  # the next prompt position to record (position 0 has none)
        last = min(start + len(rows), len(seq.prompt_token_ids) - 1)  # the last position these rows predict
        if last < first or first < start + 1:
            return
        for lo in range(first, last + 1, ROWS_AT_ONCE):  # bounded memory for a long prompt in one step
            hi = min(lo + ROWS_AT_ONCE, last + 1)
            done.extend(token_logprobs(rows[lo - 1 - start : hi - 1 - start], seq.prompt_token_ids[lo:hi], k))

    def take(self, seq_id: int) -> tuple[list[TokenLogprob], list[TokenLogprob]]:
        """The prompt and output records of ``seq_id`` collected since the last ``take`` (then dropped)."""
        return self._take_prompt(seq_id), self.outputs.pop(seq_id, [])

    def _take_prompt(self, seq_id: int) -> list[TokenLogprob]:
        """Prompt records are kept (their count says which positions are done) but handed out once."""
        done = self.prompts.get(seq_id)
        if not done:
            return []
        sent = self._sent.get(seq_id, 0)
        self._sent[seq_id] = len(done)
        return done[sent:]

    def forget(self, seq_id: int) -> None:
        """Drop everything kept for ``seq_id`` (its reader will not take any more)."""
        self.outputs.pop(seq_id, None)
        self.prompts.pop(seq_id, None)
        self._sent.pop(seq_id, None)

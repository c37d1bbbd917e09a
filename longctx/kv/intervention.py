"""Interventions on a press's choice: force chosen tokens kept, or transplant another press's choice of them.

A "why did this press lose the needle?" needs more than a picture of what it kept: it needs the suspected
cause switched on and off at the same budget. ``ForcedPress(base, positions, donor=None)`` is ``base`` (its
scores rank every other token, its budget and protected tokens are unchanged) except at ``positions``:

- ``donor=None``: every KV head of every layer keeps those tokens (force-keep). Example: SnapKV with the
  needle's tokens forced in. If accuracy recovers, losing those tokens was the cause.
- ``donor=press``: each KV head keeps those tokens exactly where ``donor`` keeps them in that layer and head,
  and evicts them elsewhere (a transplant). Example: random pruning plus exactly the needle tokens SnapKV
  drops. If that fails too, SnapKV's choice of needle tokens is enough to lose the answer.

Forced tokens take budget that ``base`` would have spent on others: ``kept`` stays ``T - floor(ratio T)``.
"""

from __future__ import annotations

import torch

from longctx.kv.press import Press, PressInput

_KEEP = torch.finfo(torch.float32).max  # above every real score, below the +inf of protected tokens


class ForcedPress(Press):
    """``base``'s choice with ``positions`` forced kept (``donor=None``) or decided by ``donor``."""

    name = "forced"

    def __init__(self, base: Press, positions, donor: Press | None = None) -> None:
        if not isinstance(base, Press) or (donor is not None and not isinstance(donor, Press)):
            raise ValueError("base and donor must be longctx.kv.press.Press instances")
        super().__init__(base.compression_ratio)
        self.positions = sorted({int(p) for p in positions})
        if not self.positions or self.positions[0] < 0:
            raise ValueError(f"positions must be token positions >= 0, got {positions!r}")
        self.base, self.donor = base, donor

    def __repr__(self) -> str:
        how = "kept" if self.donor is None else f"as {self.donor!r} keeps them"
        return f"ForcedPress({self.base!r}, {len(self.positions)} tokens {how})"

    @property
    def query_window(self) -> int:
        return max(self.base.query_window, self.donor.query_window if self.donor else 0)

    @property
    def uses_attention_sum(self) -> bool:
        return self.base.uses_attention_sum or bool(self.donor and self.donor.uses_attention_sum)

    def check_prompt(self, num_tokens: int) -> None:
        self.base.check_prompt(num_tokens)
        if self.donor is not None:
            self.donor.check_prompt(num_tokens)
        if self.positions[-1] >= num_tokens:
            raise ValueError(f"position {self.positions[-1]} is outside the {num_tokens}-token prompt")

    def protected(self, num_tokens: int, num_kept: int) -> torch.Tensor:
        return self.base.protected(num_tokens, num_kept)

    def num_kept(self, num_tokens: int) -> int:
        return self.base.num_kept(num_tokens)

    def score(self, inp: PressInput) -> torch.Tensor:
        T = inp.num_tokens
        scores = self.base.score(_for(self.base, inp)).float().clone()  # [H_kv, T]
        pos = torch.tensor(self.positions, device=scores.device)
        if self.donor is None:
            busy = len(self.positions) + int(self.protected(T, self.num_kept(T)).sum())
            if busy > self.num_kept(T):
                raise ValueError(
                    f"{len(self.positions)} forced tokens and the protected ones need {busy} places "
                    f"but each head keeps {self.num_kept(T)}: lower the ratio or force fewer"
                )
            scores[:, pos] = _KEEP
            return scores
        keep = self.donor.keep_indices(_for(self.donor, inp)).to(scores.device)  # [H_kv, kept]
        donor_kept = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, keep, True)
        scores[:, pos] = torch.where(donor_kept[:, pos], _KEEP, float("-inf"))
        return scores


def _for(press: Press, inp: PressInput) -> PressInput:
    """``inp`` cut to what ``press`` reads: its own number of window queries."""
    q = inp.queries
    if (
        q is not None
        and press.query_window
        and q.shape[1] > press.query_window
        and not press.uses_attention_sum
    ):
        q = q[:, -press.query_window:]
    return PressInput(inp.keys, inp.values, q, inp.attention_sum)

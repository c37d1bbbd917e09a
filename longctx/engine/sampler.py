"""Drawing tokens inside the executor (torch): each entry's next token from the step's logits.

``Sampler`` is what ``TorchExecutor`` calls after the forward pass: the greedy token (``argmax``) for every
entry, then, for each entry that produces a token this step and whose sequence carries ``SamplingParams``
(``longctx.engine.sampling_params``) that need more, vLLM's pipeline on that row: ``logit_bias``, the
``min_tokens`` mask (EOS and the stop token ids) and the repetition / frequency / presence penalties
(``apply_logit_changes``), then for a sampled request temperature, top-k and top-p and a draw with the
sequence's own seeded generator (created on its first draw, advanced by each one, dropped by ``forget``).
Greedy requests without changes stay bit-identical to plain ``argmax``. The log-probabilities a request asks
for are recorded on the way (``longctx.engine.logprobs``: ``Sampler.logprobs``).
"""

from __future__ import annotations

import torch

from longctx.engine.logprobs import LogprobRecorder
from longctx.engine.sampling_params import SamplingParams

MIN_TEMPERATURE = 1e-2


def apply_logit_changes(logits: torch.Tensor, params: SamplingParams, seq) -> torch.Tensor:
    """``logits`` ``[vocab]`` (float32, a copy) after the bias, the minimum length and the penalties."""
    vocab = logits.shape[-1]
    for token, bias in params.logit_bias.items():
        if token < vocab:
            logits[token] += bias
    if params.min_tokens and len(seq.output_token_ids) < params.min_tokens:
        eos = getattr(seq, "eos_token_id", None)
        stops = [t for t in (eos, *params.stop_token_ids) if t is not None and 0 <= t < vocab]
        logits[stops] = float("-inf")
    outputs = seq.output_token_ids
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.prompt_token_ids) | set(outputs)), dtype=torch.long)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / params.repetition_penalty,
                                   vals * params.repetition_penalty)
    if (params.frequency_penalty or params.presence_penalty) and outputs:
        counts = torch.bincount(torch.tensor(outputs, dtype=torch.long), minlength=vocab)[:vocab].float()
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).float()
    return logits


def sample_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """One token id from ``logits`` ``[vocab]``: greedy, or temperature + top-k + top-p sampling."""
    if params.greedy:
        return int(logits.argmax())
    # vLLM (v0.11 SamplingParams) raises a temperature in (0, 0.01) to 0.01: below it the division overflows
    probs = torch.softmax(logits.float() / max(params.temperature, MIN_TEMPERATURE), dim=-1)  # [vocab]
    # extreme penalties or biases overflowed: take the limit, greedy
    if not bool(torch.isfinite(probs).all()):
        return int(torch.nan_to_num(logits.float(), nan=float("-inf")).argmax())
    if params.min_p > 0:  # vLLM applies min_p first, then top-k / top-p on what is left
        probs = torch.where(probs >= params.min_p * probs.max(), probs, 0.0)
        probs = probs / probs.sum()
    if params.top_p < 1.0 or 0 < params.top_k < probs.shape[-1]:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p  # the smallest set reaching top_p
        if params.top_k > 0:
            keep[params.top_k:] = False
        sorted_probs = sorted_probs * keep
        choice = torch.multinomial(sorted_probs / sorted_probs.sum(), 1, generator=generator)
        return int(order[choice])
    return int(torch.multinomial(probs, 1, generator=generator))


class Sampler:
    """Per-sequence seeded generators, the choice of every entry's next token, and the log-probabilities."""

    def __init__(self) -> None:
        self._generators: dict[int, torch.Generator] = {}
        self.logprobs = LogprobRecorder()

    def __call__(self, logits: torch.Tensor, batch, last_rows: list[int] | None = None) -> list[int]:
        """``logits``: rows of the step's new tokens; ``last_rows[i]``: the row of entry ``i``'s last new
        token (None: row ``i``). Entries whose ``prompt_logprobs`` are asked have all their rows there,
        contiguous, ending at their last row. Returns one token id per entry."""
        last = logits if last_rows is None else logits[torch.tensor(last_rows, device=logits.device)]
        next_ids = last.argmax(dim=-1).tolist()  # .tolist() waits for the device
        for i, entry in enumerate(batch.entries):
            params, seq = entry.seq.sampling, entry.seq
            if params is None:
                continue
            if params.prompt_logprobs is not None and not entry.is_decode and last_rows is not None:
                n = entry.num_tokens
                rows = logits[last_rows[i] - n + 1 : last_rows[i] + 1]
                self.logprobs.add_prompt_rows(seq, seq.num_computed_tokens, rows, params.prompt_logprobs)
            if params.is_plain_greedy or not entry.completes_prefill:
                continue
            row = last[i].float().cpu()
            if params.logprobs is not None:
                raw = row
            if params.changes_logits:
                row = apply_logit_changes(row.clone(), params, seq)
            token = sample_token(row, params, self._generator(seq.seq_id, params))
            next_ids[i] = token
            if params.logprobs is not None:
                self.logprobs.add_output(seq.seq_id, raw, token, params.logprobs)
        return next_ids

    def _generator(self, seq_id: int, params: SamplingParams) -> torch.Generator:
        gen = self._generators.get(seq_id)
        if gen is None:
            gen = self._generators[seq_id] = torch.Generator(device="cpu")
            gen.manual_seed(int(params.seed))
        return gen

    def forget(self, seq_id: int) -> None:
        """The sequence finished or was aborted: drop its generator (its log-probability records wait for
        their reader: ``self.logprobs.forget``)."""
        self._generators.pop(seq_id, None)

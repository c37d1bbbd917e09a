"""LogprobRecorder (longctx.engine.logprobs) on random logits: prompt log-probabilities gathered over chunked
prefills and a recompute equal one log_softmax over the whole prompt; output records; take hands each out
once."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from longctx.engine.logprobs import LogprobRecorder, token_logprobs


def test_prompt_logprobs_over_chunks_and_a_recompute_equal_one_pass():
    torch.manual_seed(0)
    vocab, n = 50, 600  # longer than ROWS_AT_ONCE, in chunks that do not divide it
    prompt = torch.randint(0, vocab, (n,)).tolist()
    seq = SimpleNamespace(seq_id=7, prompt_token_ids=prompt)
    logits = torch.randn(n, vocab)  # row p predicts token p + 1
    rec = LogprobRecorder()
    for start, size in ((0, 170), (170, 300), (470, 130)):
        rec.add_prompt_rows(seq, start, logits[start:start + size], k=3)
    first, _ = rec.take(7)
    rec.add_prompt_rows(seq, 0, logits[:400], k=3)  # a recompute after preemption: nothing new
    again, _ = rec.take(7)
    assert again == [] and len(first) == n - 1
    want = torch.log_softmax(logits, dim=-1)
    got = torch.tensor([r.logprob for r in first])
    torch.testing.assert_close(got, want[torch.arange(n - 1), torch.tensor(prompt[1:])])
    assert [r.token_id for r in first] == prompt[1:]
    top = want[10].topk(3)
    assert [t for t, _ in first[10].top] == top.indices.tolist()
    assert first[10].rank == int((want[10] > want[10, prompt[11]]).sum()) + 1


def test_output_records_are_taken_once_and_forgotten():
    rec = LogprobRecorder()
    row = torch.tensor([0.0, 2.0, 1.0])
    rec.add_output(3, row, 2, k=1)
    (r,) = token_logprobs(row.unsqueeze(0), [2], 1)
    assert rec.take(3) == ([], [r]) and r.rank == 2 and r.top[0][0] == 1
    assert rec.take(3) == ([], [])
    rec.add_output(3, row, 1, k=0)
    rec.forget(3)
    assert rec.take(3) == ([], [])

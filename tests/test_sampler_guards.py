"""Extreme but valid sampling parameters never crash the engine loop (one bad request once killed it for all).

Found by a soak of the server: ``temperature`` 1e-300 and ``repetition_penalty`` 1e-40 overflowed the logits
(inf, then NaN probabilities: ``torch.multinomial`` raised inside the engine's thread), and a seed of 2**64
overflowed ``manual_seed``. Now the temperature is raised to vLLM's floor of 0.01, an overflowed row takes
its limit (the greedy token), and the seed is bounded to torch.long's range, as vLLM bounds it.
"""

from __future__ import annotations

import pytest
import torch

from longctx.engine.sampler import MIN_TEMPERATURE, apply_logit_changes, sample_token
from longctx.engine.sampling_params import SamplingParams


class _Seq:
    prompt_token_ids = [1, 2, 3]
    output_token_ids = [3]
    eos_token_id = 0


def _logits():
    return torch.tensor([0.5, 2.0, -1.0, 1.0, 0.0])


OVERFLOWING = [SamplingParams(temperature=1e-300, seed=1),
               SamplingParams(temperature=1.0, repetition_penalty=1e-40, seed=1),
               SamplingParams(temperature=2.0, top_p=0.5, repetition_penalty=1e-40, seed=1)]


@pytest.mark.parametrize("params", OVERFLOWING)
def test_overflowing_parameters_give_a_token_not_an_exception(params):
    logits = apply_logit_changes(_logits(), params, _Seq())
    token = sample_token(logits, params, torch.Generator().manual_seed(params.seed))
    assert 0 <= token < 5


def test_a_tiny_temperature_samples_as_vllms_floor():
    tiny = SamplingParams(temperature=1e-9, seed=3)
    floor = SamplingParams(temperature=MIN_TEMPERATURE, seed=3)
    draws = [sample_token(_logits(), p, torch.Generator().manual_seed(3)) for p in (tiny, floor)]
    assert draws[0] == draws[1] == 1


@pytest.mark.parametrize("seed", [2**63, -(2**63) - 1, 2**64])
def test_a_seed_outside_torch_long_is_refused(seed):
    with pytest.raises(ValueError, match="64-bit"):
        SamplingParams(temperature=1.0, seed=seed)


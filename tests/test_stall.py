"""The napkin stall model of lesson 01 reproduces the source's Exercise 1 and rejects impossible inputs."""

import pytest

from longctx.lessons.stall import StallScenario, decode_token_times, max_inter_token_latency_s

SOURCE = dict(num_decode_streams=16, decode_step_s=0.020, prompt_tokens=12_000, prefill_s_per_token=2 * 7e9 / 150e12)


def test_monolithic_spike_is_steady_itl_plus_prefill():
    scenario = StallScenario(**SOURCE)
    assert scenario.prefill_s == pytest.approx(1.12)
    assert max_inter_token_latency_s(scenario.timeline()) == pytest.approx(1.14)


def test_chunked_iterations_carry_every_decode_and_the_whole_prompt():
    scenario = StallScenario(**SOURCE, chunk_decode_overhead_s=0.002)
    records = scenario.timeline(chunk_size=1_000, steps_before=2, steps_after=2)
    mixed = [r for r in records if r.kind == "mixed"]
    assert len(mixed) == scenario.num_chunks(1_000) == 12
    assert sum(r.num_prefill_tokens for r in records) == 12_000
    assert all(r.num_decode_tokens == 16 for r in records)
    assert max_inter_token_latency_s(records) == pytest.approx(0.0953333, rel=1e-5)


def test_partial_last_chunk_and_token_times():
    scenario = StallScenario(2, 0.01, 1_001, 1e-4)
    records = scenario.timeline(chunk_size=500, steps_before=0, steps_after=0)
    assert [r.num_prefill_tokens for r in records] == [500, 500, 1]
    assert decode_token_times(records) == pytest.approx([r.start_s + r.duration_s for r in records])


@pytest.mark.parametrize(
    "bad",
    [dict(num_decode_streams=0), dict(prompt_tokens=0), dict(decode_step_s=0.0), dict(prefill_s_per_token=-1.0),
     dict(chunk_decode_overhead_s=-0.1)],
)
def test_impossible_scenarios_are_refused(bad):
    with pytest.raises(ValueError, match="must|cannot"):
        StallScenario(**{**SOURCE, **bad})


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match="chunk_size"):
        StallScenario(**SOURCE).timeline(chunk_size=0)

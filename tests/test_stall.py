"""The stall scenario on the napkin (lesson 01) reproduces the source's Exercise 1 and rejects impossible
inputs; its server requests carry the scenario's sizes."""

import pytest

from longctx.lessons.stall import NapkinCosts, StallScenario, decode_token_times, max_inter_token_latency_s

SOURCE = StallScenario(num_decode_streams=16, prompt_tokens=12_000)
COSTS = dict(decode_step_s=0.020, prefill_s_per_token=2 * 7e9 / 150e12)


def test_monolithic_spike_is_steady_itl_plus_prefill():
    records = SOURCE.timeline(NapkinCosts(**COSTS))
    assert [r.duration_s for r in records if r.kind == "prefill"] == [pytest.approx(1.12)]
    assert max_inter_token_latency_s(records) == pytest.approx(1.14)


def test_chunked_iterations_carry_every_decode_and_the_whole_prompt():
    scenario = SOURCE
    records = scenario.timeline(NapkinCosts(**COSTS, chunk_decode_overhead_s=0.002), chunk_size=1_000,
                                steps_before=2, steps_after=2)
    mixed = [r for r in records if r.kind == "mixed"]
    assert len(mixed) == scenario.num_chunks(1_000) == 12
    assert sum(r.num_prefill_tokens for r in records) == 12_000
    assert all(r.num_decode_tokens == 16 for r in records)
    assert max_inter_token_latency_s(records) == pytest.approx(0.0953333, rel=1e-5)


def test_partial_last_chunk_and_token_times():
    records = StallScenario(2, 1_001).timeline(NapkinCosts(0.01, 1e-4), chunk_size=500, steps_before=0,
                                               steps_after=0)
    assert [r.num_prefill_tokens for r in records] == [500, 500, 1]
    assert decode_token_times(records) == pytest.approx([r.start_s + r.duration_s for r in records])


@pytest.mark.parametrize("bad", [dict(num_decode_streams=0), dict(prompt_tokens=0), dict(prompt_tokens=1.5),
                                 dict(stream_context_tokens=-1), dict(tail_steps=-1)])
def test_impossible_scenarios_are_refused(bad):
    with pytest.raises(ValueError, match=f"{next(iter(bad))} must"):
        StallScenario(**bad)


@pytest.mark.parametrize("bad", [dict(decode_step_s=0.0), dict(prefill_s_per_token=-1.0),
                                 dict(chunk_decode_overhead_s=-0.1)])
def test_impossible_costs_are_refused(bad):
    with pytest.raises(ValueError, match=f"{next(iter(bad))} (must|cannot)"):
        NapkinCosts(**{**COSTS, **bad})


def test_chunk_size_must_be_positive():
    with pytest.raises(ValueError, match="chunk_size"):
        SOURCE.timeline(NapkinCosts(**COSTS), chunk_size=0)


class _Words:  # a tokenizer stand-in with the one method the requests use: a token per word
    def encode_chat(self, text):
        return text.split()

    def encode(self, text):
        return text.split()


def test_server_requests_carry_the_scenario_sizes():
    from longctx.bench.workloads import build_workload

    requests, offsets = StallScenario(3, 40).requests(_Words(), chat_max_tokens=8, num_long=2, long_at_s=1.0)
    kinds = [r["kind"] for r in requests]
    assert kinds == ["chat"] * 3 + ["long-prefill"] * 2 and offsets == pytest.approx(
        [0, 0.02, 0.04, 1.0, 1.02]
    )
    assert all(r["max_tokens"] == 8 for r in requests[:3])
    assert requests[3:] == build_workload("long-prefill", 2, _Words(), 40, 4, 0)

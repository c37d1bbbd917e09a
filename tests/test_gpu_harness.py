"""longctx.gpu: device detection, the timer, and the vectorised attention metadata (same as the engine's)."""


import pytest
import torch

from longctx import gpu
from longctx.gpu import counts
from longctx.gpu.harness import time_fn, time_sequence
from longctx.gpu.workloads import LLAMA31_70B, model_configs, scores_per_call
from longctx.model import llama
from longctx.model.config import LLAMA3_8B


@pytest.mark.parametrize("name,key", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                      ("NVIDIA A100-SXM4-80GB", "a100"), ("cpu", "cpu"),
                                      ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"), ("Tesla T4", "t4")])
def test_device_key(name, key):
    assert gpu.device_key(name) == key


def test_available_matches_torch():
    assert gpu.available() == torch.cuda.is_available()
    assert (gpu.device_name() == "cpu") == (not torch.cuda.is_available())


def test_time_fn_median_of_repeats_after_warmup():
    calls = []
    t = time_fn(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and t.repeats == 5 and t.timer == "perf_counter"
    assert 0 <= t.min_s <= t.median_s <= t.max_s
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, repeats=0)


def test_time_sequence_times_each_function():
    order = []
    each, whole = time_sequence([lambda: order.append("a"), lambda: order.append("b")], warmup=1, repeats=2)
    assert order == ["a", "b"] * 3 and len(each) == 2 and whole >= 0


def _random_chunks(rng, block_size):
    chunks, free = [], list(range(2000))
    rng.shuffle(free)
    for _ in range(rng.randint(1, 6)):
        computed = rng.randint(0, 60)
        new = 1 if rng.random() < 0.5 and computed > 0 else rng.randint(1, 40)
        nb = -(-(computed + new) // block_size)
        chunks.append(([free.pop() for _ in range(nb)], computed, new))
    return chunks


def test_scores_per_call_restores():
    old = llama.MAX_SCORES_PER_CALL
    with scores_per_call(123):
        assert llama.MAX_SCORES_PER_CALL == 123
    assert llama.MAX_SCORES_PER_CALL == old


def test_real_shapes_and_flop_counts():
    cfgs = model_configs(toy=False, slice_layers=4)
    assert cfgs["llama-3-8b"].d_model == 4096 and cfgs["llama-3-8b"].num_layers == 32
    assert cfgs["llama-3.1-70b-slice"].num_layers == 4 and cfgs["llama-3.1-70b-slice"].d_model == 8192
    # Llama-3-8B: 8.03e9 parameters = layers + both embedding tables + final norm
    total = counts.layer_params(LLAMA3_8B) * 32 + 2 * 128256 * 4096
    assert abs(total - 8.03e9) / 8.03e9 < 0.005
    assert counts.layer_params(LLAMA31_70B) * 80 > 6.4e10
    # a decode after S cached tokens attends to S + 1 keys; a fresh causal chunk of C to C(C+1)/2
    assert counts.causal_pairs(1, 100) == 101 and counts.causal_pairs(4, 0) == 10
    f = counts.executed_flops(LLAMA3_8B, [(1, 1023)], logits_rows=1)
    assert f["attention_flops"] == 4 * 32 * 128 * 1024 * 32
    assert counts.kv_bytes_per_token(LLAMA3_8B, 2) == 131072  # 128 KiB per token in bf16

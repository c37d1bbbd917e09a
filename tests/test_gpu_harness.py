"""longctx.gpu: device detection and the timer."""

import pytest
import torch

from longctx import gpu
from longctx.gpu.harness import time_fn


@pytest.mark.parametrize("name,key", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                      ("NVIDIA A100-SXM4-80GB", "a100"), ("cpu", "cpu"),
                                      ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"), ("Tesla T4", "t4")])
def test_device_key(name, key):
    assert gpu.device_key(name) == key


def test_available_matches_torch():
    assert gpu.available() == torch.cuda.is_available()


def test_time_fn_median_of_repeats_after_warmup():
    calls = []
    t = time_fn(lambda: calls.append(1), warmup=2, repeats=5)
    assert len(calls) == 7 and t.repeats == 5 and t.timer == "perf_counter"
    assert 0 <= t.min_s <= t.median_s <= t.max_s
    with pytest.raises(ValueError, match="repeats"):
        time_fn(lambda: None, repeats=0)

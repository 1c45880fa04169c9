"""The tuner's timing of short calls: within CUDA graph replays, the GPU's time alone (NOTES 112)."""

import time

import pytest
import torch

from autoflash.tune.timing import median_ms

pytestmark = pytest.mark.gpu
HOST_MS = 0.3  # each call's host time, longer than its kernel's


def slow_host(x):
    def fn(i):
        time.sleep(HOST_MS / 1e3)
        x[i].add_(1.0)
    return fn


def test_a_short_call_is_timed_without_its_host_time():
    x = torch.zeros(2, 1024, device="cuda")
    device = x.device
    assert median_ms(slow_host(x), 2, device, rep_ms=20) >= 0.8 * HOST_MS, "call after call: the host's time"
    assert median_ms(slow_host(x), 2, device, rep_ms=20, graph_below_ms=5.0) < 0.1 * HOST_MS
    assert median_ms(slow_host(x), 2, device, rep_ms=20, graph_below_ms=0.01) >= 0.8 * HOST_MS, "longer: no graph"


def test_a_call_that_cannot_be_captured_is_timed_call_after_call():
    x = torch.zeros(2, 1024, device="cuda")

    def uncapturable(i):
        x[i].add_(1.0)
        torch.cuda.synchronize()  # (not allowed while capturing)

    ms = median_ms(uncapturable, 2, x.device, rep_ms=20, graph_below_ms=5.0)
    assert 0 < ms < 5.0
    with pytest.raises(RuntimeError):
        median_ms(uncapturable, 2, x.device, rep_ms=20, graph=True)
    x.add_(1.0)  # the device still works, its random generator too (NOTES 115: a failed capture had left it
    torch.randn(4, device="cuda").sum().item()  # marked as capturing, and the next random op raised)
    torch.cuda.synchronize()

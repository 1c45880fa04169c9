"""autoflash bench's timing of one problem, in Triton's interpreter: rounds interleave the implementations, a
backend that cannot run the problem is a row with its error, tried once, not a failure. (Speed: the GPU's.)"""

import pytest
import torch

from autoflash import bench
from autoflash.problem import Problem
from autoflash.tune import timing

TINY = Problem(1, 2, 1, 16, 16, 16, True, "float16")


def _bench(monkeypatch, problem, direction):
    """bench_problem's rows, and the timing options of each median_ms it ran."""
    calls, median = [], timing.median_ms

    def spy(fn, n_sets, device, **options):
        calls.append(options)
        return median(fn, n_sets, device, **options)
    monkeypatch.setattr(bench, "median_ms", spy)
    monkeypatch.setattr(timing, "median_ms", spy)  # (the backward's timer)
    return {row["backend"]: row for row in bench.bench_problem(problem, torch.device("cpu"), direction, rounds=3)}, calls


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_rounds_time_every_implementation(monkeypatch, direction):
    rows, calls = _bench(monkeypatch, TINY, direction)
    assert list(rows) == ["autoflash", *bench.SDPA_BACKENDS]
    timed = [row for row in rows.values() if "error" not in row]
    assert rows["autoflash"] in timed and rows["sdpa"] in timed
    for row in timed:
        assert len(row["rounds_ms"]) == 3 and row["ms"] == sorted(row["rounds_ms"])[1] > 0  # the rounds' median
    refused = len(rows) - len(timed)  # tried once: in the forward's timing, or building the backward's graphs
    assert len(calls) == 3 * len(timed) + (refused if direction == "fwd" else 0)
    assert all(options == {"rep_ms": pytest.approx(100 / 3), "graph": False} for options in calls)
    assert "fwd why:" in rows["autoflash"]["explain"]
    assert rows["autoflash"]["graphs_by_round"] == [{}, {}, {}]  # (CPU tensors: no plan is replayed)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_a_backend_that_refuses_is_an_error_row_tried_once(monkeypatch, direction):
    rows, calls = _bench(monkeypatch, TINY.with_variants(window_size=(4, 0)), direction)
    assert len(rows["autoflash"]["rounds_ms"]) == 3
    for name in bench.SDPA_BACKENDS:
        assert "SDPA has no WINDOW" in rows[name]["error"] and "ms" not in rows[name]
    assert len(calls) == 3 + (len(bench.SDPA_BACKENDS) if direction == "fwd" else 0)


def test_summary_gives_the_geomean_and_the_lowest_ratio_per_backend():
    from autoflash.cli.bench import summary

    def rows(autoflash, sdpa, cudnn):
        return [{"backend": "autoflash", "tflops": autoflash}, {"backend": "sdpa", "tflops": sdpa},
                {"backend": "sdpa_cudnn", "tflops": cudnn}, {"backend": "sdpa_flash", "error": "refused"}]
    other = Problem(2, 4, 4, 64, 64, 64, False, "float16")
    text = summary([(TINY, rows(200.0, 100.0, 400.0)), (other, rows(50.0, 100.0, None))], "fwd")
    plain, cudnn = text.splitlines()  # (no line for a backend that ran none)
    assert plain == f"fwd vs sdpa: geomean 1.000x over 2, lowest 0.50x ({other.label()}), median 2.00x"
    assert cudnn == f"fwd vs sdpa_cudnn: geomean 0.500x over 1, lowest 0.50x ({TINY.label()}), median 0.50x"

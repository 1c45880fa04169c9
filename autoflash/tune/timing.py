"""Median run time of a kernel, do_bench style, with inputs rotated so that the L2 cache does not flatter.

`fn(i)` runs the kernel on input set `i`; sets are cycled so that each call finds its inputs out
of L2 whenever the sets together exceed it (`input_sets` says how many that takes).
"""

import math
import statistics
import time

import torch

from autoflash.graphs import clear_failed_capture


def input_sets(bytes_per_set: int, device: torch.device, max_sets: int = 32) -> int:
    """How many input sets to rotate so that together they span twice the L2 cache."""
    if device.type != "cuda":
        return 1
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2 ** 20)
    return max(1, min(max_sets, math.ceil(2 * l2 / max(bytes_per_set, 1))))


def median_ms(fn, n_sets: int, device: torch.device, warmup_ms: float = 25.0, rep_ms: float = 100.0,
              graph: bool = False, graph_below_ms: float = 0.0) -> float:
    """Median time of one call of `fn`, ms; with `graph`, of one call within replays of a CUDA graph of many
    (the GPU's time alone: no host time between calls, which short kernels otherwise wait on). With
    `graph_below_ms`, a call estimated shorter than that is timed so too, or, where `fn` cannot be captured, call
    after call (the tuner: NOTES 112)."""
    if device.type != "cuda":  # the interpreter: wall time of a few calls (for the record, not for speed)
        times = []
        for i in range(3):
            start = time.perf_counter()
            fn(i % n_sets)
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    # Estimate one call (after a first one: what it builds or compiles on the host, a plan, would count on the GPU's
    # clock too and shrink the graphs and repetitions below), then warm up and measure for about warmup_ms and rep_ms.
    fn(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(5):
        fn(i % n_sets)
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    if graph or estimate < graph_below_ms:
        try:
            return _graph_ms(fn, n_sets, max(n_sets, min(1000, int(2.0 / estimate))), max(5, int(rep_ms / 2.0)))
        except RuntimeError:
            clear_failed_capture(device)
            if graph:
                raise
            torch.cuda.synchronize()
    for i in range(max(1, int(warmup_ms / estimate))):
        fn(i % n_sets)
    reps = max(10, min(1000, int(rep_ms / estimate)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i % n_sets)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def captured(fn, n_sets: int, calls: int) -> torch.cuda.CUDAGraph:
    """A CUDA graph of `calls` calls of `fn` (input sets cycled), captured after each set's first call ran outside
    it (what those allocate or set up), and replayed once."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(n_sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % n_sets)
    graph.replay()
    return graph


def _graph_ms(fn, n_sets: int, calls: int, replays: int) -> float:
    """Median over `replays` replays of a CUDA graph of `calls` calls (input sets cycled), per call."""
    graph = captured(fn, n_sets, calls)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del graph
    return statistics.median(times)


def backward_ms(forward, sets, device: torch.device, **timing) -> float:
    """Median time of the backward alone of `forward(q, k, v) -> out`, over input sets (q, k, v, dout):
    each set's forward runs once, its graph is kept, and only torch.autograd.grad is timed (with median_ms's
    `timing` options). Where a graph may time it the forwards run on a side stream: autograd runs a node's
    backward on its forward's stream, and a backward whose nodes hold the legacy default stream cannot be captured
    alone (cudaErrorStreamCaptureImplicit; benchmarks/NOTES.md 87)."""
    graphs = []
    graphs_may_time = timing.get("graph") or timing.get("graph_below_ms")
    side = torch.cuda.Stream(device) if graphs_may_time and device.type == "cuda" else None
    with torch.cuda.stream(side):  # (None: the current stream)
        for q, k, v, dout in sets:
            inputs = tuple(t.detach().requires_grad_() for t in (q, k, v))
            graphs.append((inputs, forward(*inputs), dout))
    if side is not None:
        torch.cuda.current_stream(device).wait_stream(side)
    return median_ms(lambda i: torch.autograd.grad(graphs[i][1], graphs[i][0], graphs[i][2], retain_graph=True),
                     len(graphs), device, **timing)

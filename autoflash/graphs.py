"""Small passes replayed from CUDA graphs (benchmarks/NOTES.md 93, 94).

A backward whose GPU time is below the host time of its launches (two or three Triton kernels, their TMA
descriptors encoded per call, its buffers: ~60-80 µs of Python on the H100 machines) runs at the host's speed,
behind plain SDPA's C++ path; so does a forward below its launch's ~20-40 µs. Its plan launches the same kernels on the same addresses whenever the call's tensors
land where an earlier call's did (a training loop's steady state under the caching allocator, a benchmark): such
an address set, seen twice, is captured once and then replayed, one graph launch a call. The key holds every
tensor's address and the stream, and the plan's own buffers belong to the graphs' pool, so a replay reads and
writes exactly what the plan would; which a graph replays is its problem's alone (a plan is per call signature).
A plan's own buffers (a backward's fp32 dQ and its rows) live from its first launch to its last: nothing a graph
leaves in its pool is read after it, so the graphs that replay on one stream (one after another) share one pool,
which holds the largest graph's buffers, not their sum (NOTES 99).
"""

import os
import threading
from collections import Counter, OrderedDict
from itertools import count

import torch

# A pass with more FLOPs than this is GPU-bound (its GPU time past the ~40-80 µs a forward's launch takes on the
# host, quiet or busy, the ~0.3-0.4 ms a backward's launches and autograd's round trip take on the H100/H200 hosts
# measured, NOTES 100 and 125, at ~350-400 TFLOP/s): captured never.
MAX_FLOPS = {"fwd": 32e9, "bwd": 150e9}
SIGHTINGS = 2  # an address set is captured at its second call (a first call's addresses rarely come back)
MAX_GRAPHS = 64  # graphs the process keeps, every plan's together, the least recently replayed dropped
MAX_BUFFER_BYTES = 256 << 20  # a plan whose own buffers are larger is not wrapped (a backward's: ~3x q's bytes)
# A plan captures only while fewer than this many of its graphs await their first replay (a capture costs ~1 ms of
# host time, a replay saves ~0.02-0.06): addresses that never repeat stop its captures after this many, while a
# model's many layers, each its own address set, are all captured over a few steps (this many a step).
UNREPLAYED = 16

_graphs: OrderedDict = OrderedDict()  # (plan's token, stream, addresses) -> (graph, stream)
_pools: dict = {}  # (device, stream) -> the memory pool of the graphs that replay on that stream
_retiring: list = []  # (event, graph): dropped graphs, kept until the GPU is past their last replay (their buffers)
_lock = threading.Lock()  # (autograd runs each GPU's backwards on a thread of its own)
_capturing = threading.Lock()  # one capture at a time in the process (two threads may share a stream, so a pool)
_tokens = count()  # (a plan's token is never reused: a graph is never replayed for another plan)
# What every Replayed plan of the process did, call by call (for benchmarks: whether a timing's calls replayed):
# "replayed", "captured" (then replayed once), "ran" (the plan as it is: a first sighting, UNREPLAYED graphs awaiting
# a replay, captures off), "capture_failed" (it ran as it is too), "in_capture" (inside the caller's own capture).
COUNTS: Counter = Counter()


def replayed(plan, direction: str, flops: float, buffer_bytes: int):
    """`plan` as a Replayed where a pass of `flops` is host-bound and its own buffers take `buffer_bytes` at most
    MAX_BUFFER_BYTES; else, or with AUTOFLASH_GRAPHS=0 in the environment (read as each plan is made), `plan`. (A
    plan whose launches hold more than its tensors' addresses builds that part in the capture too: a mask_mod's
    block tables, templates/tl/launch_mask_mod.py.)"""
    small = flops <= MAX_FLOPS[direction] and buffer_bytes <= MAX_BUFFER_BYTES
    if os.environ.get("AUTOFLASH_GRAPHS", "1") == "0":
        return plan
    return Replayed(plan) if small else plan


def clear_failed_capture(device) -> None:
    """Undo what a capture that raised leaves behind. Its stream's capture has ended, but torch marks the device's
    default random generator as capturing until a capture ends cleanly (its epilogue), so every later random op on
    the device would raise "Offset increment outside graph capture encountered unexpectedly" (measured on torch
    2.11, NOTES 115); one clean capture clears the mark."""
    with torch.cuda.device(device):
        scratch = torch.zeros(1, device=device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):  # (as `_captured`'s: other threads run on)
            scratch.add_(1.0)
        del graph


def _raw_stream(device: int) -> int:
    """The handle of `device`'s current stream (torch.cuda.current_stream()'s object takes 4-8 µs a call on the
    H100/H200 hosts, NOTES 106; Triton's launches read the same handle)."""
    return torch._C._cuda_getCurrentRawStream(device)


class Replayed:
    """`plan(*tensors)` (tensors: CUDA tensors or None, in a fixed order) replayed from a CUDA graph per address
    set seen SIGHTINGS times. The plan runs as it is while a capture is under way (the caller's own graph records
    its launches), where a capture fails (from then on), and for new address sets while UNREPLAYED of its graphs
    await a replay."""

    def __init__(self, plan):
        self.plan = plan
        self.token = next(_tokens)
        self.sightings: OrderedDict = OrderedDict()  # key -> calls seen, uncaptured
        self.unreplayed: set = set()  # keys captured and not replayed since
        self.capturing = True  # (False once a capture failed)

    def __call__(self, *tensors):
        if torch.cuda.is_current_stream_capturing():
            with _lock:
                COUNTS["in_capture"] += 1
            return self.plan(*tensors)
        device = tensors[0].get_device()
        key = (self.token, _raw_stream(device), *(0 if t is None else t.data_ptr() for t in tensors))
        with _lock:
            if (graph := _graphs.get(key)) is not None:
                _graphs.move_to_end(key)
                self.unreplayed.discard(key)
                COUNTS["replayed"] += 1
            else:
                seen = self.sightings.pop(key, 0) + 1
                capture = self.capturing and seen >= SIGHTINGS and len(self.unreplayed) < UNREPLAYED
                if not capture:
                    COUNTS["ran"] += 1
                    self.sightings[key] = seen
                    while len(self.sightings) > 4 * MAX_GRAPHS:
                        self.sightings.popitem(last=False)
        if graph is not None:
            graph[0].replay()
            return None
        if not capture:
            return self.plan(*tensors)
        stream = torch.cuda.current_stream(device)
        try:
            graph = self._captured(tensors, stream)
        except RuntimeError:  # (a launch that cannot be captured: the plan runs as it is from now on)
            with _capturing:
                clear_failed_capture(device)
            with _lock:
                COUNTS["capture_failed"] += 1
            self.capturing = False
            return self.plan(*tensors)
        graph.replay()  # (a capture runs nothing)
        with _lock:
            COUNTS["captured"] += 1
            self.unreplayed.add(key)
            _graphs[key] = (graph, stream)
            while len(_graphs) > MAX_GRAPHS:
                _, (dropped, on) = _graphs.popitem(last=False)
                _retiring.append((on.record_event(), dropped))
            _retiring[:] = [(event, dropped) for event, dropped in _retiring if not event.query()]
        return None

    def _captured(self, tensors, stream) -> torch.cuda.CUDAGraph:
        """The plan's launches on `tensors`, captured on a side stream ordered after `stream` into the pool of the
        graphs that replay on `stream` (thread_local: the autograd engine's device thread captures while other
        threads may launch)."""
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream(stream.device)
        with _lock:
            if (stream.device, stream.cuda_stream) not in _pools:
                _pools[stream.device, stream.cuda_stream] = torch.cuda.graph_pool_handle()
            pool = _pools[stream.device, stream.cuda_stream]
        side.wait_stream(stream)
        with _capturing, torch.cuda.stream(side):
            graph.capture_begin(pool=pool, capture_error_mode="thread_local")
            try:
                self.plan(*tensors)
            finally:
                graph.capture_end()
        stream.wait_stream(side)
        return graph

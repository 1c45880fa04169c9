"""Small backwards replayed from CUDA graphs (benchmarks/NOTES.md 93, 94).

A backward whose GPU time is below the host time of its launches (two or three Triton kernels, their TMA
descriptors encoded per call, its buffers: ~60-80 µs of Python on the H100 machines) runs at the host's speed,
behind plain SDPA's C++ path. Its plan launches the same kernels on the same addresses whenever the call's tensors
land where an earlier call's did (a training loop's steady state under the caching allocator, a benchmark): such
an address set, seen twice, is captured once and then replayed, one graph launch a call. The key holds every
tensor's address and the stream, and the plan's own buffers belong to the graph's pool, so a replay reads and
writes exactly what the plan would; which a graph replays is its problem's alone (a plan is per call signature).
"""

import threading
from collections import OrderedDict
from itertools import count

import torch

MAX_FLOPS = 50e9  # a backward with more (~0.15 ms at 330 TFLOP/s) is GPU-bound: captured never
MAX_Q_BYTES = 16 << 20  # nor one whose q is larger: a graph keeps its plan's buffers (fp32 dQ: twice q's bytes)
SIGHTINGS = 2  # an address set is captured at its second call (a first call's addresses rarely come back)
MAX_GRAPHS = 32  # graphs the process keeps, every plan's together, the least recently replayed dropped
# After this many captures, a plan captures on only while its graphs replay PAYBACK times a capture on average
# (a capture costs ~1 ms of host time, a replay saves ~0.05): addresses that do not repeat stop the captures.
FREE_CAPTURES, PAYBACK = 16, 8

_graphs: OrderedDict = OrderedDict()  # (plan's token, stream, addresses) -> (graph, stream)
_retiring: list = []  # (event, graph): dropped graphs, kept until the GPU is past their last replay (their buffers)
_lock = threading.Lock()  # (autograd runs each GPU's backwards on a thread of its own)
_tokens = count()  # (a plan's token is never reused: a graph is never replayed for another plan)


def pays(flops: float, q_bytes: int) -> bool:
    """Whether a backward of `flops` on a q of `q_bytes` is small enough for its host time to matter and its
    graphs' buffers to be kept."""
    return flops <= MAX_FLOPS and q_bytes <= MAX_Q_BYTES


class Replayed:
    """`plan(*tensors)` (tensors: CUDA tensors or None, in a fixed order) replayed from a CUDA graph per address
    set seen SIGHTINGS times. The plan runs as it is while a capture is under way (the caller's own graph records
    its launches), where a capture fails (from then on), and for new address sets once captures stop paying."""

    def __init__(self, plan):
        self.plan = plan
        self.token = next(_tokens)
        self.sightings: OrderedDict = OrderedDict()  # key -> calls seen, uncaptured
        self.captures = self.replays = 0
        self.capturing = True

    def __call__(self, *tensors):
        if torch.cuda.is_current_stream_capturing():
            return self.plan(*tensors)
        stream = torch.cuda.current_stream()
        key = (self.token, stream.cuda_stream, *(0 if t is None else t.data_ptr() for t in tensors))
        with _lock:
            if (graph := _graphs.get(key)) is not None:
                _graphs.move_to_end(key)
                graph = graph[0]
        if graph is not None:
            self.replays += 1
            graph.replay()
            return None
        seen = self.sightings.pop(key, 0) + 1
        if not self.capturing or seen < SIGHTINGS:
            self.sightings[key] = seen
            while len(self.sightings) > 4 * MAX_GRAPHS:
                self.sightings.popitem(last=False)
            return self.plan(*tensors)
        try:
            graph = self._captured(tensors, stream)
        except RuntimeError:  # (a launch that cannot be captured: the plan runs as it is from now on)
            self.capturing = False
            return self.plan(*tensors)
        self.captures += 1
        self.capturing = self.captures < FREE_CAPTURES or self.replays >= PAYBACK * self.captures
        graph.replay()  # (a capture runs nothing)
        with _lock:
            _graphs[key] = (graph, stream)
            while len(_graphs) > MAX_GRAPHS:
                _, (dropped, on) = _graphs.popitem(last=False)
                _retiring.append((on.record_event(), dropped))
            _retiring[:] = [(event, dropped) for event, dropped in _retiring if not event.query()]
        return None

    def _captured(self, tensors, stream) -> torch.cuda.CUDAGraph:
        """The plan's launches on `tensors`, captured on a side stream ordered after `stream` (thread_local: the
        autograd engine's device thread captures while other threads may launch)."""
        graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream(stream.device)
        side.wait_stream(stream)
        with torch.cuda.stream(side):
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                self.plan(*tensors)
            finally:
                graph.capture_end()
        stream.wait_stream(side)
        return graph

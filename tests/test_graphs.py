"""autoflash/graphs.py's policy, on the CPU: which calls run the plan, which capture, which replay (the captures
themselves are GPU-only: tests/test_gpu_graph.py)."""

import pytest
import torch

from autoflash import graphs
from test_mask_mod import same_document


class FakeGraph:
    def __init__(self, key):
        self.key, self.replays = key, 0

    def replay(self):
        self.replays += 1


class Stream:
    cuda_stream = 7

    def record_event(self):
        return type("Event", (), {"query": lambda event: True})()


@pytest.fixture
def replayed(monkeypatch):
    """A Replayed around a plan that logs its calls; captures make FakeGraphs (logged) and fail on request."""
    calls, captures, failing = [], [], []
    monkeypatch.setattr(graphs, "_graphs", type(graphs._graphs)())  # (no other test's graphs)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(graphs, "_raw_stream", lambda device: Stream.cuda_stream)
    monkeypatch.setattr(graphs, "_retiring", [])
    cleared = []
    monkeypatch.setattr(graphs, "clear_failed_capture", cleared.append)

    def captured(self, tensors, stream):
        if failing:
            raise RuntimeError("operation not permitted when stream is capturing")
        captures.append(FakeGraph(tuple(t if t is None else t.data_ptr() for t in tensors)))
        return captures[-1]
    monkeypatch.setattr(graphs.Replayed, "_captured", captured)
    r = graphs.Replayed(lambda *tensors: calls.append(tuple(t if t is None else t.data_ptr() for t in tensors)))
    return r, calls, captures, failing


def test_an_address_set_is_captured_at_its_second_call_and_replayed_after(replayed):
    r, calls, captures, _ = replayed
    a, b = (torch.empty(4), torch.empty(4)), (torch.empty(4), torch.empty(4))
    r(*a)
    assert len(calls) == 1 and not captures, "a first sighting runs the plan"
    r(*b)
    r(*a)
    assert len(calls) == 2 and len(captures) == 1 and captures[0].replays == 1, "the second sighting captures, runs"
    r(*a)
    r(*a)
    assert len(calls) == 2 and captures[0].replays == 3
    r(*b)
    assert len(captures) == 2 and captures[1].key == tuple(t.data_ptr() for t in b)


def test_none_tensors_are_part_of_the_key(replayed):
    r, calls, captures, _ = replayed
    a = torch.empty(4)
    r(a, None)
    r(a, a)
    assert len(calls) == 2 and not captures, "(a, None) and (a, a) are two address sets"


def test_a_capture_that_fails_runs_the_plan_and_stops_capturing(replayed):
    r, calls, captures, failing = replayed
    a = (torch.empty(4),)
    failing.append(True)
    r(*a)
    r(*a)
    assert len(calls) == 2 and not captures
    failing.clear()
    for _ in range(3):
        r(*a)
    assert len(calls) == 5 and not captures, "after a failed capture the plan runs as it is"


def test_a_capture_under_way_elsewhere_runs_the_plan(replayed, monkeypatch):
    r, calls, captures, _ = replayed
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    a = (torch.empty(4),)
    for _ in range(3):
        r(*a)
    assert len(calls) == 3 and not captures, "the caller's own capture records the plan's launches"


def test_graphs_are_kept_per_plan_and_process_wide_at_most_max_graphs(replayed, monkeypatch):
    """Two plans seeing the same addresses replay their own graphs; the process keeps MAX_GRAPHS in all."""
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 2)
    r, calls, captures, _ = replayed
    other = graphs.Replayed(lambda *tensors: calls.append(("other", *tensors)))
    a, b = (torch.empty(4),), (torch.empty(4),)
    for plan in (r, other, r):
        plan(*a)
        plan(*a)
    assert len(captures) == 2 and captures[0].replays == 3, "each plan captured its own; r's replayed twice more"
    r(*b)
    r(*b)
    assert len(graphs._graphs) == 2 and len(captures) == 3
    assert not graphs._retiring, "a dropped graph whose replays the GPU is past is let go"
    other(*a)
    assert len(captures) == 3, "the other plan's graph was dropped (least recently replayed): a first sighting"
    other(*a)
    assert len(captures) == 4


def test_only_small_passes_are_replayed(monkeypatch):
    plan = object()
    assert isinstance(graphs.replayed(plan, "fwd", 1e9, 0), graphs.Replayed)
    assert graphs.replayed(plan, "fwd", 40e9, 0) is plan, "a forward past 32 GFLOP is GPU-bound"
    assert isinstance(graphs.replayed(plan, "bwd", 20e9, 1 << 20), graphs.Replayed)
    assert graphs.replayed(plan, "bwd", 20e9, graphs.MAX_BUFFER_BYTES + 1) is plan, "its buffers too large"
    monkeypatch.setenv("AUTOFLASH_GRAPHS", "0")
    assert graphs.replayed(plan, "fwd", 1e9, 0) is plan, "AUTOFLASH_GRAPHS=0 turns replays off"


def test_a_dropped_graph_is_kept_while_its_replay_may_run(replayed, monkeypatch):
    monkeypatch.setattr(graphs, "MAX_GRAPHS", 1)
    monkeypatch.setattr(Stream, "record_event", lambda stream: type("Event", (), {"query": lambda event: False})())
    r, _, captures, _ = replayed
    for tensors in ((torch.empty(4),), (torch.empty(4),)):
        r(*tensors)
        r(*tensors)
    assert [graph for _, graph in graphs._retiring] == captures[:1], "kept until its stream's event completes"


def test_addresses_that_never_come_back_stop_the_captures(replayed, monkeypatch):
    """A plan captures while fewer than UNREPLAYED of its graphs await a replay; the graphs kept still replay, and
    a replay lets the captures go on."""
    monkeypatch.setattr(graphs, "UNREPLAYED", 3)
    r, calls, captures, _ = replayed
    sets = [(torch.empty(4),) for _ in range(8)]
    for tensors in sets:  # each seen twice, never again: three captured, never replayed
        r(*tensors)
        r(*tensors)
    assert len(captures) == 3, "captures stop at three graphs that no call replayed"
    assert len(calls) == 8 + 5, "first sightings, then the uncaptured second ones"
    r(*sets[2])
    assert captures[2].replays == 2, "a kept graph still replays (its capture's run, then this call)"
    r(*sets[3])
    assert len(captures) == 4 and len(calls) == 13, "a replay made room: the next address set seen twice is captured"


def test_a_model_s_many_layers_are_all_captured_over_a_few_steps(replayed, monkeypatch):
    """Eight address sets a step (a model's layers), three awaiting a replay at most: all replay by the fifth step."""
    monkeypatch.setattr(graphs, "UNREPLAYED", 3)
    r, calls, captures, _ = replayed
    layers = [(torch.empty(4),) for _ in range(8)]
    for step in range(4):
        for tensors in layers:
            r(*tensors)
    assert len(captures) == 8 and len(calls) == 8 + 5 + 2, "captured three, three and two a step after the first"
    for tensors in layers:
        r(*tensors)
    assert len(calls) == 15 and all(graph.replays >= 1 for graph in captures)


def test_counts_say_what_each_call_did(replayed, monkeypatch):
    """graphs.COUNTS, which `autoflash bench` records a round each: first sightings and refused captures ran the
    plan, the second sighting captured, later calls replayed, a failed capture ran the plan too."""
    monkeypatch.setattr(graphs, "COUNTS", type(graphs.COUNTS)())
    r, calls, captures, failing = replayed
    a = (torch.empty(4), torch.empty(4))
    for _ in range(4):
        r(*a)
    assert dict(graphs.COUNTS) == {"ran": 1, "captured": 1, "replayed": 2}
    failing.append(True)
    b = (torch.empty(4), torch.empty(4))
    r(*b)
    r(*b)
    assert dict(graphs.COUNTS) == {"ran": 2, "captured": 1, "replayed": 2, "capture_failed": 1}


def test_a_mask_mod_call_captured_into_a_graph_makes_its_tables_in_it(monkeypatch):
    """Captured into a CUDA graph (a Replayed's or the caller's own), a mask_mod's call computes its block tables
    in the graph and keeps them not, so that each replay makes them from what its captures hold then; outside a
    capture the tables of unchanged captures are made once (the GPU's half: tests/test_gpu_graph.py's mask_mod
    tests)."""
    import autoflash
    from autoflash.resources import launcher

    masks, made, capturing = launcher("tl", "mask_mod"), [], []
    real = masks._Tables.evaluated
    monkeypatch.setattr(masks._Tables, "evaluated", lambda self, *args: made.append(1) or real(self, *args))
    monkeypatch.setattr(masks, "_in_capture", lambda captures: bool(capturing))
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
    mod = autoflash.MaskMod(same_document, torch.arange(40, dtype=torch.int32) // 13)
    counts = []
    for capture in (False, False, True, True, False):
        capturing[:] = [True] if capture else []
        made.clear()
        autoflash.attention(q, k, v, mask_mod=mod)
        counts.append(len(made))
    assert counts[1:] == [0, 1, 1, 0] and counts[0] >= 1, counts

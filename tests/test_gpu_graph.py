"""autoflash.attention inside CUDA graph capture (GPU only)."""

import pytest
import torch

import autoflash
from autoflash import graphs
from autoflash.reference import GRAD_TOLERANCE, attention_backward_reference, gradient_errors
from helpers import assert_matches_reference, make_qkv
from test_mask_mod import same_document

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("given_out", [False, True], ids=["allocated", "out="])
@pytest.mark.parametrize("head_dim", [64, 128, 80])
def test_attention_replays_in_a_cuda_graph(head_dim, given_out):
    q, k, v = make_qkv(2, 4, 2, 300, 300, head_dim, torch.float16, "cuda", seed=1)
    static_out = torch.full_like(q, float("nan")) if given_out else None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and dispatch before capture
        autoflash.attention(q, k, v, causal=True, out=static_out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = autoflash.attention(q, k, v, causal=True, out=static_out)
    assert out is static_out or not given_out
    fresh = make_qkv(2, 4, 2, 300, 300, head_dim, torch.float16, "cuda", seed=2)
    for buffer, value in zip((q, k, v), fresh):
        buffer.copy_(value)
    graph.replay()
    torch.cuda.synchronize()
    assert_matches_reference(out, None, q, k, v, True)


@pytest.mark.parametrize("problem", [(2, 4, 2, 300, 300, 64), (32, 32, 8, 128, 128, 128)], ids=["gqa-300", "gqa-128"])
def test_training_step_replays_in_a_cuda_graph(problem):
    """PyTorch's whole-network capture: warm-up on a side stream, then forward and backward captured together; the
    replay on fresh inputs gives the fp64 reference's gradients. (The first problem is the graph test's; the second
    has the shape of the held-out problem whose backward-only capture failed in benchmarks/NOTES.md 87.)"""
    *shape, head_dim = problem
    leaves = [t.requires_grad_() for t in make_qkv(*shape, head_dim, torch.float16, "cuda", seed=1)]
    dout = torch.randn(shape[0], shape[1], shape[3], head_dim, dtype=torch.float16, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile and dispatch both directions before capture
        for _ in range(2):
            torch.autograd.grad(autoflash.attention(*leaves, causal=True), leaves, dout)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = torch.autograd.grad(autoflash.attention(*leaves, causal=True), leaves, dout)
    fresh = make_qkv(*shape, head_dim, torch.float16, "cuda", seed=2)
    with torch.no_grad():
        for leaf, value in zip(leaves, fresh):
            leaf.copy_(value)
        dout.copy_(torch.randn_like(dout))
    for grad in grads:
        grad.fill_(float("nan"))  # what the replay does not write stays NaN
    graph.replay()
    torch.cuda.synchronize()
    q, k, v = (t.detach() for t in leaves)
    expected = attention_backward_reference(q, k, v, dout, True)
    for name, grad, err in zip(("dq", "dk", "dv"), grads, gradient_errors(grads, expected)):
        assert not torch.isnan(grad).any(), f"{name} holds NaN after the replay"
        assert err < GRAD_TOLERANCE[torch.float16], f"{name} relative error {err:.2e}"


@pytest.mark.parametrize("problem", [(2, 8, 8, 1024, 1024, 80), (2, 8, 2, 333, 77, 64)], ids=["d80", "gqa-cross"])
def test_a_small_backward_replays_its_address_sets(problem, monkeypatch):
    """A small backward's (and forward's) plan captures an address set at its second call and replays it from then on
    (autoflash/graphs.py, benchmarks/NOTES.md 94): each call's gradients, inputs refilled in place between calls
    (the same addresses, new values) and grads poisoned, are the fp64 reference's; replays happened."""
    replays = []
    real_replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(1) or real_replay(graph))
    *shape, head_dim = problem
    leaves = [t.requires_grad_() for t in make_qkv(*shape, head_dim, torch.float16, "cuda", seed=1)]
    dout = torch.empty(shape[0], shape[1], shape[3], head_dim, dtype=torch.float16, device="cuda")
    for call in range(6):
        fresh = make_qkv(*shape, head_dim, torch.float16, "cuda", seed=10 + call)
        with torch.no_grad():
            for leaf, value in zip(leaves, fresh):
                leaf.copy_(value)
            dout.copy_(torch.randn_like(dout))
        grads = torch.autograd.grad(autoflash.attention(*leaves, causal=True), leaves, dout)
        torch.cuda.synchronize()
        expected = attention_backward_reference(*(t.detach() for t in leaves), dout, True)
        for name, grad, err in zip(("dq", "dk", "dv"), grads, gradient_errors(grads, expected)):
            assert not torch.isnan(grad).any(), f"call {call}: {name} holds NaN"
            assert err < GRAD_TOLERANCE[torch.float16], f"call {call}: {name} relative error {err:.2e}"
        for grad in grads:
            grad.fill_(float("nan"))  # (freed at the next call's allocation: a stale write would show there)
        del grads
    assert replays, "no backward was replayed from a graph: its addresses never came back"


@pytest.mark.parametrize("given_out", [False, True], ids=["allocated", "out="])
def test_a_small_forward_replays_its_address_sets(given_out, monkeypatch):
    """A small forward's plan, captured at an address set's second call (autoflash/graphs.py): each call's output
    and lse, inputs refilled in place between calls and outputs poisoned, are the fp64 reference's."""
    replays = []
    real_replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(1) or real_replay(graph))
    q, k, v = make_qkv(2, 8, 2, 257, 1000, 64, torch.float16, "cuda", seed=1)
    given = torch.empty_like(q) if given_out else None
    for call in range(5):
        for buffer, value in zip((q, k, v), make_qkv(2, 8, 2, 257, 1000, 64, torch.float16, "cuda", seed=10 + call)):
            buffer.copy_(value)
        if given is not None:
            given.fill_(float("nan"))
        out, lse = autoflash.attention(q, k, v, causal=True, return_lse=True, out=given)
        torch.cuda.synchronize()
        assert_matches_reference(out, lse, q, k, v, True)
        out.fill_(float("nan"))  # (freed at the next call's allocation: a stale write would show there)
        lse.fill_(float("nan"))
        del out, lse
    assert replays, "no forward was replayed from a graph"


def test_layers_graphs_share_a_pool_and_replay_in_any_order(monkeypatch):
    """Three layers' small backwards (each its own inputs: three address sets, two problems), their graphs in one
    pool (autoflash/graphs.py, NOTES 99), replayed in the order of capture, then reversed, then interleaved: each
    call's gradients are the fp64 reference's (a graph whose buffers another overwrote in between would show)."""
    replays = []
    real_replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(1) or real_replay(graph))
    shapes = [(2, 8, 8, 1024, 1024, 80), (2, 8, 2, 333, 77, 64), (2, 8, 8, 1024, 1024, 80)]
    layers = []
    for seed, (*shape, head_dim) in enumerate(shapes):
        leaves = [t.requires_grad_() for t in make_qkv(*shape, head_dim, torch.float16, "cuda", seed=seed)]
        layers.append((leaves, torch.randn(shape[0], shape[1], shape[3], head_dim, dtype=torch.float16,
                                           device="cuda")))
    orders = [[0, 1, 2]] * 3 + [[2, 1, 0], [1, 0, 2], [0, 2, 1]]
    for step, order in enumerate(orders):
        outs = {i: autoflash.attention(*layers[i][0], causal=True) for i in sorted(order)}  # (forward in layer order)
        grads = {}
        for i in order:
            leaves, dout = layers[i]
            grads[i] = torch.autograd.grad(outs[i], leaves, dout)
        torch.cuda.synchronize()
        for i, (leaves, dout) in enumerate(layers):
            expected = attention_backward_reference(*(t.detach() for t in leaves), dout, True)
            for name, err in zip(("dq", "dk", "dv"), gradient_errors(grads[i], expected)):
                assert err < GRAD_TOLERANCE[torch.float16], f"step {step}, layer {i}: {name} relative error {err:.2e}"
        with torch.no_grad():  # new values at the same addresses
            for leaves, dout in layers:
                for leaf in leaves:
                    leaf.copy_(torch.randn_like(leaf))
                dout.copy_(torch.randn_like(dout))
        del outs, grads
    assert replays, "no backward was replayed from a graph"


def test_a_plan_that_cannot_be_captured_runs_and_leaves_random_numbers_working():
    """A plan whose capture fails (here: it synchronizes) runs as it is, and the device's random generator works
    after (NOTES 115: torch left it marked as capturing, and the next random op raised)."""
    x = torch.zeros(4, device="cuda")

    def plan(t):
        t.add_(1.0)
        torch.cuda.synchronize()  # (not allowed while capturing)

    replayed = graphs.Replayed(plan)
    for _ in range(3):
        replayed(x)
    assert x.tolist() == [3.0] * 4 and not replayed.capturing
    assert torch.randn(1000, device="cuda").std().item() > 0.5



def test_a_mask_mod_whose_tensors_change_in_place(monkeypatch):
    """A small mask_mod pass called again and again on the same addresses, so replayed from graphs, while its
    document ids change, in place and in a new tensor at the same address (the caching allocator's usual reuse):
    each call's output, lse and gradients are the fp64 reference's (the block tables are built in the graph from
    the ids a replay reads: templates/tl/launch_mask_mod.py)."""
    replays = []
    real_replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(1) or real_replay(graph))
    before = graphs.COUNTS.copy()
    q, k, v = (t.requires_grad_() for t in make_qkv(2, 4, 2, 1000, 1000, 64, torch.float16, "cuda", seed=1))
    ids = torch.zeros(1000, dtype=torch.int32, device="cuda")
    generator = torch.Generator().manual_seed(0)
    for call, bounds in enumerate(([300, 600], [130, 900], [500], [300, 600], [64, 128, 700], [], [999], [1])):
        fresh = torch.zeros(1000, dtype=torch.int32)  # (made on the host: no device block between the calls')
        for bound in bounds:
            fresh[bound:] += 1
        if call % 2:
            del ids
            ids = fresh.cuda()  # (a new tensor, most likely at the freed one's address)
        else:
            ids.copy_(fresh)  # (in place: the same tensor, its version bumped)
        mod = autoflash.MaskMod(same_document, ids)
        out, lse = autoflash.attention(q, k, v, causal=True, mask_mod=mod, return_lse=True)
        dout = torch.randn(out.shape, generator=generator, dtype=out.dtype).cuda()
        grads = torch.autograd.grad(out, (q, k, v), dout)
        torch.cuda.synchronize()
        assert_matches_reference(out.detach(), lse.detach(), q.detach(), k.detach(), v.detach(), True, mask_mod=mod)
        expected = attention_backward_reference(*(t.detach() for t in (q, k, v)), dout, True, mask_mod=mod)
        for name, err in zip(("dq", "dk", "dv"), gradient_errors(grads, expected)):
            assert err < GRAD_TOLERANCE[torch.float16], f"call {call} ({bounds}): {name} relative error {err:.2e}"
        del out, lse, dout, grads, expected  # (the next call's land where these were)
    counts = graphs.COUNTS - before
    assert replays, f"no mask_mod pass was replayed from a graph (its calls: {dict(counts)})"


def test_a_mask_mod_in_a_cuda_graph_follows_its_tensors():
    """The caller's own capture of a mask_mod call (warm-up on a side stream, then captured), replayed after the
    document ids changed in place: each replay's output is the fp64 reference's for the ids it then holds (the
    block tables are made in the graph: templates/tl/launch_mask_mod.py)."""
    q, k, v = make_qkv(2, 4, 2, 1000, 1000, 64, torch.float16, "cuda", seed=1)
    ids = torch.zeros(1000, dtype=torch.int32, device="cuda")
    ids[500:] = 1
    mod = autoflash.MaskMod(same_document, ids)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compile, dispatch and the tables of these ids before capture
        autoflash.attention(q, k, v, causal=True, mask_mod=mod)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = autoflash.attention(q, k, v, causal=True, mask_mod=mod)
    for bounds in ([500], [130, 900], [64, 128, 700], []):
        fresh = torch.zeros(1000, dtype=torch.int32, device="cuda")
        for bound in bounds:
            fresh[bound:] += 1
        ids.copy_(fresh)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches_reference(out, None, q, k, v, True, mask_mod=mod)

"""Packed sequences and KV caches at real sizes on the GPU: bf16, long sequences, page sizes up to 256, the
compiled kernels (the interpreter runs the small cases of test_varlen.py and test_kvcache.py)."""

import pytest
import torch

import autoflash
from autoflash.reference import GRAD_TOLERANCE, TOLERANCE, relative_error, varlen_reference
from test_kvcache import paged, reference
from test_varlen import grads_with_dlse, packed_batch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_q, heads_kv, head_dim", [(8, 8, 128), (16, 4, 64), (8, 1, 80)])
def test_varlen_forward_backward(dtype, causal, heads_q, heads_kv, head_dim):
    lengths = [1000, 0, 1, 7, 123, 2049, 513]
    _assert_forward_backward(lengths, lengths, heads_q, heads_kv, head_dim, dtype, causal, seed=11)


def _assert_forward_backward(lengths_q, lengths_k, heads_q, heads_kv, head_dim, dtype, causal, seed):
    """out, lse and (through autograd, the lse's gradient included) dq, dk, dv of attention_varlen against the
    fp64 reference per sequence; returns (q, k, v, out, lse, dout, dlse (0 where a row sees no key), cu_q, cu_k,
    the reference gradients), detached."""
    q, k, v, cu_q, cu_k = packed_batch(lengths_q, lengths_k, heads_q, heads_kv, head_dim, dtype, seed=seed)
    dout, dlse = torch.randn_like(q), torch.randn(heads_q, q.shape[0], device="cuda")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = autoflash.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                          return_lse=True)
    seen = torch.isfinite(lse.detach())
    torch.autograd.backward((out, lse[seen]), (dout, dlse[seen]))
    ref, ref_lse = varlen_reference(q.detach(), k.detach(), v.detach(), cu_q, cu_k, causal)
    assert relative_error(out, ref) < TOLERANCE[dtype]
    assert (lse[seen].double() - ref_lse[seen]).abs().max() < 1e-2
    want = grads_with_dlse(q, k, v, cu_q, cu_k, causal, dout, dlse)
    for got, expected in zip((q.grad, k.grad, v.grad), want):
        assert relative_error(got, expected) < GRAD_TOLERANCE[dtype]
    return (*(t.detach() for t in (q, k, v, out, lse)), dout, torch.where(seen, dlse, 0.0), cu_q, cu_k, want)


@pytest.mark.parametrize("knobs", [dict(loads="tma"), dict(loads="tma", num_warps=8, num_stages=3),
                                   dict(loads="tma", kv_splits=4), dict(loads="tma", head_dim_split=True)],
                         ids=["tma", "tma_8_warps", "tma_splits", "tma_head_dim_split"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_forward_with_descriptors_per_sequence(knobs, causal, monkeypatch):
    """loads="tma": each program describes its own sequence's rows, so a tile stops at the sequence's end
    (poisoned output: a row written past it, or never written, shows)."""
    from test_varlen import force_knobs

    lengths = [1000, 0, 1, 7, 123, 4097, 513]
    q, k, v, cu_q, cu_k = packed_batch(lengths, lengths, 8, 2, 80 if knobs.get("head_dim_split") else 128,
                                       torch.bfloat16, seed=13)
    force_knobs(monkeypatch, "fwd", **knobs)
    _assert_forward_poisoned(q, k, v, cu_q, cu_k, max(lengths), max(lengths), causal)


def _assert_forward_poisoned(q, k, v, cu_q, cu_k, max_q, max_k, causal):
    """bf16 out (poisoned with NaN before the call) and lse against the fp64 reference per sequence."""
    out = torch.full_like(q, float("nan"))
    _, lse = autoflash.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=causal, return_lse=True, out=out)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal)
    seen = torch.isfinite(ref_lse)
    assert relative_error(out, ref) < TOLERANCE[torch.bfloat16]
    assert torch.equal(seen, torch.isfinite(lse)) and (lse[seen].double() - ref_lse[seen]).abs().max() < 1e-2


def test_varlen_equals_dense_on_equal_lengths():
    """Equal lengths: the varlen kernel computes what autoflash.attention does on the padded-free dense batch."""
    batch, seqlen, heads, head_dim = 4, 1024, 8, 128
    q, k, v, cu_q, cu_k = packed_batch([seqlen] * batch, [seqlen] * batch, heads, heads, head_dim, torch.bfloat16)
    out = autoflash.attention_varlen(q, k, v, cu_q, cu_k, seqlen, seqlen, causal=True)
    dense = autoflash.attention(*(t.view(batch, seqlen, heads, head_dim).transpose(1, 2) for t in (q, k, v)),
                                causal=True)
    assert relative_error(out, dense.transpose(1, 2).reshape(q.shape)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("page_size", [None, 16, 64, 256])
@pytest.mark.parametrize("seqlen_q, new, causal", [(1, 0, False), (1, 1, True), (128, 128, True), (7, 0, True)])
def test_kvcache(page_size, seqlen_q, new, causal):
    gen = torch.Generator().manual_seed(12)
    batch, heads_q, heads_kv, head_dim = 6, 32, 8, 128
    lengths = [0, 1, 255, 4097, 1000, 77]
    seqlen_cache = max(lengths) + new + 3

    def normal(*shape):
        return torch.randn(*shape, generator=gen).to("cuda", torch.bfloat16)
    q = normal(batch, seqlen_q, heads_q, head_dim)
    k_dense, v_dense = normal(batch, seqlen_cache, heads_kv, head_dim), normal(batch, seqlen_cache, heads_kv, head_dim)
    k_new, v_new = (normal(batch, new, heads_kv, head_dim), normal(batch, new, heads_kv, head_dim)) if new \
        else (None, None)
    if page_size is None:
        k_cache, v_cache, block_table = k_dense.clone(), v_dense.clone(), None
    else:
        k_cache, v_cache, block_table = paged((k_dense, v_dense), page_size, gen)
    cache_seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = autoflash.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens, block_table=block_table,
                                           k=k_new, v=v_new, causal=causal)
    for b, n in enumerate(lengths):
        if new:
            k_dense[b, n:n + new], v_dense[b, n:n + new] = k_new[b], v_new[b]
    ref, _ = reference(q, k_dense, v_dense, [n + new for n in lengths], causal)
    assert relative_error(out, ref) < TOLERANCE[torch.bfloat16]


def test_kvcache_decode_in_a_cuda_graph():
    """Fixed page table, lengths changing between replays: one captured graph, no host synchronisation."""
    gen = torch.Generator().manual_seed(13)
    batch, heads_q, heads_kv, head_dim = 4, 16, 4, 128
    k_dense, v_dense = (torch.randn(batch, 512, heads_kv, head_dim, generator=gen).to("cuda", torch.float16)
                        for _ in range(2))
    k_cache, v_cache, block_table = paged((k_dense, v_dense), 64, gen)
    q = torch.randn(batch, 1, heads_q, head_dim, generator=gen).to("cuda", torch.float16)
    cache_seqlens = torch.tensor([5, 100, 300, 511], dtype=torch.int32, device="cuda")

    def step():
        return autoflash.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                block_table=block_table)
    step()  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    cache_seqlens.copy_(torch.tensor([50, 1, 512, 200], dtype=torch.int32))
    graph.replay()
    ref, _ = reference(q, k_dense, v_dense, [50, 1, 512, 200], False)
    assert relative_error(out, ref) < TOLERANCE[torch.float16]


@pytest.mark.parametrize("causal", [False, True])
def test_varlen_forward_in_a_cuda_graph(causal):
    """Packed sequences' forward captured in a CUDA graph (no host lengths: the tile table built on the device),
    the offsets rewritten in place between replays (the same total): the replay's out and lse against the fp64
    reference on the new lengths, out poisoned before the replay."""
    first, second = [1000, 7, 0, 1993, 1], [123, 2049, 828, 0, 1]
    q, k, v, cu_q, cu_k = packed_batch(first, first, 16, 4, 128, torch.bfloat16)
    out = torch.empty_like(q)

    def step():
        return autoflash.attention_varlen(q, k, v, cu_q, cu_k, 2049, 2049, causal=causal, return_lse=True, out=out)[1]
    step()  # compiled outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured_lse = step()
    offsets = torch.tensor([0, *torch.tensor(second).cumsum(0).tolist()], dtype=torch.int32)
    cu_q.copy_(offsets)
    cu_k.copy_(offsets)
    out.fill_(float("nan"))
    graph.replay()
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal)
    seen = torch.isfinite(ref_lse)
    assert relative_error(out, ref) < TOLERANCE[torch.bfloat16]
    assert torch.equal(seen, torch.isfinite(captured_lse))
    assert (captured_lse[seen].double() - ref_lse[seen]).abs().max() < 1e-2


def _force_gluon(monkeypatch, direction, change):
    """Dispatch runs the Gluon family's default knobs with `change` for `direction` (the case skips where they
    cannot run the problem); the list it returns gets the knobs of each such dispatch."""
    from dataclasses import replace

    from autoflash import varlen
    from autoflash.api import DISPATCHER
    from autoflash.families import gluon

    chosen, forced = DISPATCHER.for_call, []

    def for_call(problem, gpu, which, *args):
        choice = chosen(problem, gpu, which, *args)
        if which != direction:
            return choice
        knobs = replace(gluon.default_knobs(problem, gpu, direction), **change)
        forced.append(knobs)
        if gluon.violations(knobs, problem, gpu):
            pytest.skip(f"{change} cannot run {problem.label()}: {gluon.violations(knobs, problem, gpu)}")
        return replace(choice, knobs=knobs)
    monkeypatch.setattr(DISPATCHER, "for_call", for_call)
    monkeypatch.setattr(varlen, "_plans", {})  # (plans are kept per layout: each case dispatches afresh)
    return forced


LENGTHS_Q, LENGTHS_K = [1000, 0, 1, 7, 123, 4097, 513], [1000, 5, 1, 300, 0, 4097, 600]


@pytest.mark.parametrize("change", [{}, dict(q_buffers=2, dynamic=True), dict(persistent=False),
                                    dict(consumers=1, overlap=False, persistent=False),
                                    dict(block_n=64, stage_o_in_q=True, q_buffers=1)],
                         ids=["default", "two_q_dynamic", "per_tile", "sequential", "o_in_q"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_q, heads_kv, head_dim", [(8, 2, 128), (8, 8, 64), (4, 1, 256), (4, 4, 80)])
def test_gluon_varlen_forward(change, causal, heads_q, heads_kv, head_dim, monkeypatch):
    """The Gluon forward over packed sequences (its VARLEN gate): every row of every sequence written once, none
    past it (output poisoned), queries and keys of different lengths, empty sequences, GQA, head dims 64-256."""
    forced = _force_gluon(monkeypatch, "fwd", change)
    q, k, v, cu_q, cu_k = packed_batch(LENGTHS_Q, LENGTHS_K, heads_q, heads_kv, head_dim, torch.bfloat16, seed=17)
    _assert_forward_poisoned(q, k, v, cu_q, cu_k, max(LENGTHS_Q), max(LENGTHS_K), causal)
    assert forced, "the call did not dispatch through the forced Gluon knobs"


@pytest.mark.parametrize("change", [{}, dict(q_buffers=1, block_n=64, stage_o_in_q=True)], ids=["default", "o_in_q"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_q, heads_kv, head_dim", [(8, 2, 96), (4, 4, 80), (4, 1, 160), (8, 2, 40)])
def test_gluon_varlen_forward_head_dim_split(change, causal, heads_q, heads_kv, head_dim, monkeypatch):
    """The packed forward with the head dim in two column tiles (head_dim_split, NOTES G16): O's second tile by TMA
    where a tile's rows are all the sequence's, else by the masked store, its columns from the first tile's width."""
    forced = _force_gluon(monkeypatch, "fwd", dict(change, head_dim_split=True))
    q, k, v, cu_q, cu_k = packed_batch(LENGTHS_Q, LENGTHS_K, heads_q, heads_kv, head_dim, torch.bfloat16, seed=19)
    _assert_forward_poisoned(q, k, v, cu_q, cu_k, max(LENGTHS_Q), max(LENGTHS_K), causal)
    assert forced and all(knobs.head_dim_split for knobs in forced)


@pytest.mark.parametrize("causal", [False, True])
def test_gluon_varlen_backward_uneven_groups(causal, monkeypatch):
    """Packed GQA 7:1 with each KV head's query heads over 2 programs unevenly (4 and 3), their fp32 dK and dV
    added up: the gradients against the fp64 reference per sequence."""
    forced = _force_gluon(monkeypatch, "bwd", dict(group_splits=2, uneven_groups=True))
    _assert_forward_backward(LENGTHS_Q, LENGTHS_K, 14, 2, 64, torch.bfloat16, causal, seed=19)
    assert forced and all(knobs.uneven_groups for knobs in forced)


@pytest.mark.parametrize("change", [{}, dict(group_splits=2), dict(dv_late=True)],
                         ids=["default", "split_2", "dv_late"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_q, heads_kv, head_dim", [(8, 2, 160), (4, 4, 192), (4, 1, 144)])
def test_gluon_varlen_backward_head_dim_split(change, causal, heads_q, heads_kv, head_dim, monkeypatch):
    """The packed backward with the head dim in two column tiles (NOTES G-bwd23): dK and dV of the second tile
    stored from registers from column 128, masked to the sequence and head_dim; empty sequences, GQA, MHA, MQA."""
    forced = _force_gluon(monkeypatch, "bwd", dict(change, head_dim_split=True))
    _assert_forward_backward(LENGTHS_Q, LENGTHS_K, heads_q, heads_kv, head_dim, torch.bfloat16, causal, seed=23)
    assert forced and all(knobs.head_dim_split for knobs in forced)


@pytest.mark.parametrize("change", [{}, dict(block_m=128), dict(warpgroups=1, group_splits=1), dict(num_buffers=3),
                                    dict(group_splits=1), dict(group_splits=2), dict(group_splits=4),
                                    dict(dq_writer=True)],
                         ids=["default", "rows_128", "one_warpgroup", "three_slots", "unsplit", "split_2", "split_4",
                              "dq_writer"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_q, heads_kv, head_dim", [(8, 2, 128), (8, 8, 64), (4, 1, 256), (4, 4, 80),
                                                         (8, 2, 32)])
def test_gluon_varlen_backward(change, causal, heads_q, heads_kv, head_dim, monkeypatch):
    """The Gluon backward over packed sequences (its VARLEN gate) against the fp64 reference per sequence, the lse's
    gradient included: through attention_varlen's autograd (the tables built on the host), then its plan called
    again on NaN-poisoned dq, dk, dv with the tables built on the device (every row of every sequence written,
    none past it: dQ's rows past a sequence add exact zeros into the next one's). Queries and keys of different
    lengths, empty sequences, GQA, MHA, MQA, head dims 32-256 (each one's steps: 32 rows past 128, 128 at 32)."""
    from autoflash import codegen
    from autoflash.varlen import packed

    forced = _force_gluon(monkeypatch, "bwd", change)
    q, k, v, out, lse, dout, dlse, cu_q, cu_k, want = _assert_forward_backward(
        LENGTHS_Q, LENGTHS_K, heads_q, heads_kv, head_dim, torch.bfloat16, causal, seed=19)
    assert forced, "the call did not dispatch through the forced Gluon knobs"
    poisoned = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    views = [packed(t) for t in (q, k, v, out, dout, *poisoned)]
    plan = codegen.load(forced[-1], frozenset({"VARLEN"})).varlen_backward_plan(
        *views[:4], lse[None], *views[4:], cu_q, cu_k, q.shape[-1] ** -0.5, causal, dlse[None])
    plan(*views[:4], lse[None], *views[4:], dlse[None], cu_q, cu_k, None)
    for got, expected in zip(poisoned, want):
        assert relative_error(got, expected) < GRAD_TOLERANCE[torch.bfloat16]

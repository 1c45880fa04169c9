"""attention_varlen: packed sequences of odd lengths (empty ones too) against the fp64 reference per sequence."""

import numpy as np
import pytest
import torch

import autoflash
from autoflash.reference import GRAD_TOLERANCE, TOLERANCE, relative_error, varlen_reference
from conftest import DEVICE


def packed_batch(lengths_q, lengths_k, heads_q, heads_kv, head_dim, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)

    def rows(total, heads):
        return torch.randn(total, heads, head_dim, generator=gen, dtype=torch.float32).to(DEVICE, dtype)

    def offsets(lengths):
        return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    q, k, v = rows(sum(lengths_q), heads_q), rows(sum(lengths_k), heads_kv), rows(sum(lengths_k), heads_kv)
    return q, k, v, offsets(lengths_q), offsets(lengths_k)


CASES = [  # lengths of q, lengths of k, heads_q, heads_kv, head_dim, causal, dtype
    ([0, 1, 7, 123], [0, 1, 7, 123], 2, 2, 32, True, torch.float16),
    ([5, 0, 40, 17], [9, 3, 33, 17], 4, 1, 24, False, torch.float32),
    ([33, 1, 2], [64, 50, 0], 4, 2, 64, True, torch.float16),
]


@pytest.mark.parametrize("lengths_q, lengths_k, heads_q, heads_kv, head_dim, causal, dtype", CASES)
def test_forward_matches_reference(lengths_q, lengths_k, heads_q, heads_kv, head_dim, causal, dtype):
    q, k, v, cu_q, cu_k = packed_batch(lengths_q, lengths_k, heads_q, heads_kv, head_dim, dtype)
    out = torch.full_like(q, float("nan"))  # poisoned: every row must be written
    result, lse = autoflash.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                             return_lse=True, out=out)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal)
    assert result is out and lse.shape == (heads_q, q.shape[0]) and lse.dtype == torch.float32
    assert relative_error(out, ref) < TOLERANCE[dtype]
    seen = torch.isfinite(ref_lse)
    assert torch.equal(seen, torch.isfinite(lse)), "rows that see no key have lse -inf"
    assert (lse[seen].double() - ref_lse[seen]).abs().max() < 1e-3


KNOBS = [  # what the table and the offsets must hold for: packed GQA rows, key splits, two column tiles, tiles
    (dict(block_m=16, block_n=16, num_warps=2, num_stages=1, pack_gqa=True), True),
    (dict(block_m=32, block_n=16, num_warps=2, num_stages=1, kv_splits=2), False),
    (dict(block_m=16, block_n=32, num_warps=2, num_stages=1, head_dim_split=True, pack_gqa=True, kv_splits=2), True),
    (dict(block_m=64, block_n=16, num_warps=4, num_stages=1, causal_split=False, exp="exp"), True),
    (dict(block_m=32, block_n=16, num_warps=2, num_stages=1, loads="tma"), True),  # descriptors per sequence
    (dict(block_m=16, block_n=32, num_warps=2, num_stages=1, loads="tma", kv_splits=2, head_dim_split=True), False),
]


@pytest.mark.parametrize("on_host", [True, False], ids=["host_tables", "device_tables"])
@pytest.mark.parametrize("knobs, causal", KNOBS)
def test_forward_variants(knobs, causal, on_host):
    from autoflash import codegen
    from autoflash.families.tl.knobs import FwdKnobs
    from autoflash.varlen import packed

    lengths_q, lengths_k = [3, 0, 45, 1, 20], [7, 5, 45, 0, 30]
    q, k, v, cu_q, cu_k = packed_batch(lengths_q, lengths_k, 4, 2, 40, torch.float16, seed=1)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((4, q.shape[0]), float("nan"), device=DEVICE)
    forward = codegen.load(FwdKnobs(**knobs), frozenset({"VARLEN"})).varlen_forward_plan(
        packed(q), packed(k), packed(v), packed(out), lse.unsqueeze(0), cu_q, cu_k[:-1], cu_k.diff(), 0.3, causal)
    host = (np.array(lengths_q), np.array(lengths_k)) if on_host else None
    forward(packed(q), packed(k), packed(v), packed(out), lse.unsqueeze(0), cu_q, cu_k[:-1],
            None if on_host else cu_k.diff(), host=host)
    ref, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, causal, 0.3)
    assert relative_error(out, ref) < TOLERANCE[torch.float16]
    seen = torch.isfinite(ref_lse)
    assert torch.equal(seen, torch.isfinite(lse)) and (lse[seen].double() - ref_lse[seen]).abs().max() < 1e-3


GRAD_CASES = [  # lengths of q, lengths of k, heads_q, heads_kv, causal, backward knobs
    ([0, 1, 7, 45], [0, 1, 7, 45], 2, 2, True, {}),
    ([5, 0, 40, 17], [9, 3, 33, 0], 4, 2, False, {}),
    ([20, 3, 37], [20, 50, 37], 4, 1, True, dict(dq="atomic", block_m=16, block_n=16, num_warps=2)),
    ([20, 3, 37], [31, 3, 40], 2, 1, True, dict(causal_split=False, block_m=16, block_n=32, num_warps=2)),
]


def force_knobs(monkeypatch, direction, **knobs):
    """Dispatch runs `knobs` (over its choice's, or over the tl family's default where the choice is another
    family's, which lacks them: the Gluon forward takes packed problems on Hopper) for `direction`."""
    from dataclasses import fields, replace

    from autoflash import families
    from autoflash.api import DISPATCHER

    chosen = DISPATCHER.for_call

    def for_call(problem, gpu, which, *args):
        choice = chosen(problem, gpu, which, *args)
        if which != direction:
            return choice
        base = choice.knobs
        if not set(knobs) <= {f.name for f in fields(base)}:
            base = families.FAMILIES["tl"].default(problem, gpu, direction)
        return replace(choice, knobs=replace(base, **knobs))
    monkeypatch.setattr(DISPATCHER, "for_call", for_call)


def grads_with_dlse(q, k, v, cu_q, cu_k, causal, dout, dlse):
    """(dq, dk, dv) of sum(out * dout) + sum(lse * dlse) over the rows that see a key, by autograd through the
    fp64 reference per sequence."""
    q, k, v = (t.detach().double().requires_grad_() for t in (q, k, v))
    out, lse = varlen_reference(q, k, v, cu_q, cu_k, causal)
    seen = torch.isfinite(lse)
    torch.autograd.backward((out, lse[seen]), (dout.double(), dlse.double()[seen]))
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("on_host", [True, False], ids=["host_tables", "device_tables"])
@pytest.mark.parametrize("lengths_q, lengths_k, heads_q, heads_kv, causal, knobs", GRAD_CASES)
def test_backward_matches_reference(lengths_q, lengths_k, heads_q, heads_kv, causal, knobs, on_host, monkeypatch):
    force_knobs(monkeypatch, "bwd", **knobs)
    if not on_host:  # as while a CUDA graph is captured: no lengths on the host, tables built on the device
        monkeypatch.setattr(autoflash.varlen, "host_lengths", lambda *args: None)
    dtype = torch.float32
    q, k, v, cu_q, cu_k = packed_batch(lengths_q, lengths_k, heads_q, heads_kv, 32, dtype, seed=2)
    dout, dlse = torch.randn_like(q), torch.randn(heads_q, q.shape[0], device=DEVICE)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = autoflash.attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal=causal,
                                          return_lse=True)
    seen = torch.isfinite(lse.detach())
    torch.autograd.backward((out, lse[seen]), (dout, dlse[seen]))
    assert relative_error(out, varlen_reference(q.detach(), k.detach(), v.detach(), cu_q, cu_k, causal)[0]) \
        < TOLERANCE[dtype]
    for got, want in zip((q.grad, k.grad, v.grad), grads_with_dlse(q, k, v, cu_q, cu_k, causal, dout, dlse)):
        assert relative_error(got, want) < GRAD_TOLERANCE[dtype]


def test_bad_lengths_say_how_to_fix():
    q, k, v, cu_q, cu_k = packed_batch([3, 4], [3, 4], 2, 2, 16, torch.float16)

    def call(cu_q=cu_q, cu_k=cu_k, max_q=4, max_k=4, **kwargs):
        return autoflash.attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)
    with pytest.raises(TypeError, match="int32 tensor of shape"):
        call(cu_q=cu_q.long())
    with pytest.raises(ValueError, match="rise .* from 0 to 7"):
        call(cu_q=torch.tensor([0, 5, 3], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="rise .* from 0 to 7"):
        call(cu_k=torch.tensor([0, 3, 6], dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="more than max_seqlen 3"):
        call(max_q=3)
    with pytest.raises(ValueError, match="one entry per sequence"):
        call(cu_k=torch.tensor([0, 7], dtype=torch.int32, device=DEVICE), max_k=7)
    with pytest.raises(ValueError, match="3-D"):
        autoflash.attention_varlen(q[None], k, v, cu_q, cu_k, 4, 4)
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="move it with .to"):
            call(cu_q=cu_q.to("meta"))
        with pytest.raises(TypeError, match="pass float16 or float32"):
            autoflash.attention_varlen(q.bfloat16(), k.bfloat16(), v.bfloat16(), cu_q, cu_k, 4, 4)


def test_offsets_read_once_while_unchanged(monkeypatch):
    """The lengths come to the host (a synchronisation on a GPU) once for a pair of offsets tensors while torch sees
    no write to them; a write in place, through a view too, is read again: the results follow the new values, bad
    ones are refused, and so is a max_seqlen the remembered lengths exceed."""
    q, k, v, cu_q, cu_k = packed_batch([3, 4], [5, 2], 2, 2, 16, torch.float32)
    reads, read = [], autoflash.varlen._read_lengths
    monkeypatch.setattr(autoflash.varlen, "_read_lengths", lambda *args: reads.append(args) or read(*args))
    for _ in range(3):
        autoflash.attention_varlen(q, k, v, cu_q, cu_k, 5, 5)
    assert len(reads) == 1
    with pytest.raises(ValueError, match="more than max_seqlen 4"):
        autoflash.attention_varlen(q, k, v, cu_q, cu_k, 5, 4)
    cu_q[1:2].fill_(5)  # queries 5 and 2
    cu_k[1:2].fill_(3)  # keys 3 and 4
    out = autoflash.attention_varlen(q, k, v, cu_q, cu_k, 5, 5)
    assert len(reads) == 3
    assert relative_error(out, varlen_reference(q, k, v, cu_q, cu_k, False)[0]) < TOLERANCE[torch.float32]
    cu_q[1:2].fill_(9)
    with pytest.raises(ValueError, match="rise .* from 0 to 7"):
        autoflash.attention_varlen(q, k, v, cu_q, cu_k, 5, 5)
    fresh = torch.tensor([0, 3, 7], dtype=torch.int32, device=DEVICE)  # a new tensor is read, whatever it holds
    autoflash.attention_varlen(q, k, v, fresh, cu_k, 5, 5)
    assert len(reads) == 5


def test_empty_batch_and_no_rows():
    q, k, v, cu_q, cu_k = packed_batch([0, 0], [0, 5], 2, 2, 16, torch.float16)
    out, lse = autoflash.attention_varlen(q, k, v, cu_q, cu_k, 0, 5, return_lse=True)
    assert out.shape == (0, 2, 16) and lse.shape == (2, 0)


def test_dispatch_key_and_families():
    """A varlen call is the Problem (sequences, longest lengths, VARLEN); plain keys are unchanged; fa1 refuses it
    (the Gluon forward and backward take it); the nearest tuned dense winner is fitted to the table's order and to pointer
    loads, or keeps device descriptors (tma) where the keys are not on pages."""
    from dataclasses import replace

    from autoflash import families, gpu as gpus
    from autoflash.families import fa1
    from autoflash.families.gluon.knobs import BwdKnobs as GluonBwdKnobs, FwdKnobs as GluonKnobs
    from autoflash.families.tl.defaults import fit
    from autoflash.families.tl.knobs import FwdKnobs
    from autoflash.problem import Problem
    from autoflash.varlen import problem_of

    q, k, _, _, _ = packed_batch([3, 4], [3, 4], 4, 2, 64, torch.float16)
    problem = problem_of(q, k, 2, 4, 9, True)  # the longest lengths rounded up to powers of two
    plain = Problem(2, 4, 2, 4, 16, 64, True, "float16")
    assert problem.key() == plain.key() + "-varlen" and plain.key() == "b2-hq4-hkv2-sq4-sk16-d64-causal-float16"
    assert problem.distance(plain) == 0.0, "dense records serve varlen problems"
    gpu = replace(gpus.current(q.device), family="h100", capability=(9, 0))
    assert any("tl family only" in why for why in families.violations(fa1.FwdKnobs(), problem, gpu))
    assert not any("tl family only" in why for why in families.violations(fa1.FwdKnobs(), plain, gpu))
    for knobs in (GluonKnobs(), GluonBwdKnobs()):  # their VARLEN gates
        assert not any("packed" in why for why in families.violations(knobs, problem, gpu))
    tuned = FwdKnobs(block_m=16, block_n=16, num_warps=2, loads="tma_host", schedule="longest_first")
    fitted = fit(tuned, problem, gpu)
    assert (fitted.loads, fitted.schedule) == ("pointer", "in_order") and not families.violations(fitted, problem, gpu)
    assert families.violations(tuned, problem, gpu) and fit(tuned, plain, gpu).loads == "tma_host"
    device_tma = replace(tuned, loads="tma")
    assert fit(device_tma, problem, gpu).loads == "tma" and not families.violations(fit(device_tma, problem, gpu),
                                                                                      problem, gpu)
    wide = replace(problem, seqlen_q=4096, seqlen_k=4096, head_dim=128)  # pointer loads, 128 x d128: 8 warps
    assert fit(FwdKnobs(block_m=128, block_n=64, num_warps=4, loads="tma_host"), wide, gpu).num_warps == 8
    assert fit(FwdKnobs(block_m=128, block_n=64, num_warps=4, loads="tma"), wide, gpu).num_warps == 4
    paged = problem_of(q, k, 2, 4, 9, True, 16)
    assert fit(device_tma, paged, gpu).loads == "pointer"
    assert any("not on pages" in why for why in families.violations(replace(device_tma, schedule="in_order"), paged,
                                                                          gpu))

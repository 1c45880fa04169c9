"""attention(..., out=...) refuses an out it would corrupt or be corrupted by: one that shares memory with q, k
or v, one whose elements share memory, one that requires grad. A disjoint out in the same buffer still works."""

import pytest
import torch

import autoflash
from conftest import DEVICE
from helpers import assert_matches_reference

SHAPE = (1, 2, 128, 32)  # q, k, v and out alike: out may alias any of them


def _buffer_and_inputs():
    """A buffer holding k and v and room for an output, and q of its own."""
    gen = torch.Generator().manual_seed(23)
    buffer = torch.randn((4, *SHAPE[1:]), generator=gen).to(torch.float16).to(DEVICE)
    q = torch.randn(SHAPE, generator=gen).to(torch.float16).to(DEVICE)
    return buffer, q, buffer[0:1], buffer[1:2]


OVERLAPPING = {
    "out=q": lambda buffer, q, k, v: q,
    "out=k": lambda buffer, q, k, v: k,
    "out=v": lambda buffer, q, k, v: v,
    # rows 64.. of k's batch entry and rows ..63 of v's: partly k, partly v
    "out partly over k": lambda buffer, q, k, v: buffer.view(-1)[k.numel() // 2:].view(-1)[:k.numel()].view(SHAPE),
    # out in (batch, seqlen, heads, dim) order over the whole buffer, interleaving with k and v
    "out transposed over the buffer": lambda buffer, q, k, v: buffer.view(-1)[:k.numel()].view(1, 128, 2, 32)
    .transpose(1, 2),
}


@pytest.mark.parametrize("make_out", OVERLAPPING.values(), ids=OVERLAPPING.keys())
def test_out_overlapping_an_input_is_refused(make_out):
    buffer, q, k, v = _buffer_and_inputs()
    before = buffer.clone(), q.clone()
    with pytest.raises(ValueError, match=r"out overlaps [qkv] in memory.*pass a separate output tensor"):
        autoflash.attention(q, k, v, out=make_out(buffer, q, k, v))
    assert torch.equal(buffer, before[0]) and torch.equal(q, before[1]), "a refused call must write nothing"


def test_overlap_is_checked_on_every_call_of_a_cached_plan():
    buffer, q, k, v = _buffer_and_inputs()
    out = torch.empty_like(q)
    autoflash.attention(q, k, v, out=out)  # builds the plan of this signature
    with pytest.raises(ValueError, match="out overlaps k"):
        autoflash.attention(q, k, v, out=buffer[0:1])  # same shapes, strides and alignment as out: same plan


def test_disjoint_out_in_the_same_buffer_works():
    buffer, q, k, v = _buffer_and_inputs()
    out = buffer[2:3].fill_(float("nan"))
    assert autoflash.attention(q, k, v, causal=True, out=out) is out
    assert_matches_reference(out, None, q, k, v, True)
    assert torch.equal(buffer[0:2], _buffer_and_inputs()[0][0:2]), "k and v must be left as they were"


HEAD = SHAPE[2] * SHAPE[3]  # elements of one head


@pytest.mark.parametrize("make_out", [
    lambda q: torch.empty(SHAPE[-1], dtype=q.dtype, device=q.device).expand(SHAPE),
    lambda q: torch.empty((1, 1, *SHAPE[2:]), dtype=q.dtype, device=q.device).expand(SHAPE),  # heads stride 0
    # each head starts halfway into the one before
    lambda q: torch.empty(HEAD * 3 // 2, dtype=q.dtype, device=q.device).as_strided(SHAPE, (HEAD, HEAD // 2, 32, 1)),
], ids=["expanded", "heads stride 0", "heads half-overlapping"])
def test_out_whose_elements_share_memory_is_refused(make_out):
    _, q, k, v = _buffer_and_inputs()
    with pytest.raises(ValueError, match="out has elements that share memory.*tensor of its own"):
        autoflash.attention(q, k, v, out=make_out(q))


def test_out_that_requires_grad_is_refused():
    _, q, k, v = _buffer_and_inputs()
    out = torch.empty_like(q).requires_grad_()
    for grad_mode in (torch.enable_grad, torch.no_grad):
        with grad_mode(), pytest.raises(ValueError, match="out requires grad.*does not"):
            autoflash.attention(q, k, v, out=out)
    autoflash.attention(q, k, v, out=out.detach())  # the same signature, allowed once it does not
    with pytest.raises(ValueError, match="out requires grad"):
        autoflash.attention(q, k, v, out=out)

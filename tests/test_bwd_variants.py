"""Every backward variant and the autograd path against the fp64 reference gradients, on odd shapes.

On the CPU this runs in Triton's interpreter at small sizes (fp16 and fp32); the `gpu` tests run
the same matrix at real sizes in fp16 and bf16. Gradients are poisoned (NaN) before each call.
"""

import itertools

import pytest
import torch

import autoflash
from autoflash import codegen
from autoflash.gpu import current
from autoflash.families import violations
from autoflash.families.tl.knobs import BwdKnobs
from autoflash.problem import Problem
from autoflash.reference import GRAD_TOLERANCE, attention_backward_reference, attention_reference, gradient_errors
from conftest import DEVICE
from helpers import assert_gradients_match, make_qkv
from test_fwd_variants import GPU_SHAPES, SMALL_SHAPES


def variants(blocks):
    """Every dQ strategy x causal split x (block_m, block_n, num_warps, num_stages)."""
    for dq, split in itertools.product(("separate", "atomic"), (True, False)):
        for block_m, block_n, warps, stages in blocks:
            yield BwdKnobs(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages, dq=dq,
                           causal_split=split)


def run_variant(knobs, shape, dtype, device, causal, transposed=False, seed=0) -> bool:
    """Check one backward variant on one problem, given the reference forward's out and lse; False
    when the validity function rules the pair out."""
    q, k, v = make_qkv(*shape, dtype, device, transposed=transposed, seed=seed)
    if violations(knobs, Problem.from_tensors(q, k, causal), current(q.device)):
        return False
    scale = 0.7 / shape[-1] ** 0.5
    out, lse = attention_reference(q, k, v, causal, scale)
    out, lse = out.to(dtype), lse.float()
    gen = torch.Generator(device="cpu").manual_seed(seed + 100)
    dout = torch.randn(q.shape, generator=gen).to(dtype=dtype, device=device)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    codegen.load(knobs).backward(q, k, v, out, lse, dout, *grads, scale, causal, None)
    refs = attention_backward_reference(q, k, v, dout, causal, scale)
    for name, err in zip(("dq", "dk", "dv"), gradient_errors(grads, refs)):
        assert err < GRAD_TOLERANCE[dtype], f"{knobs} {shape} causal={causal}: {name} relative error {err:.2e}"
    return True


def run_shapes(knobs, shapes, dtype, device):
    """Each shape causal and full, every other one in the transposed layout."""
    ran = [run_variant(knobs, shape, dtype, device, causal, transposed=i % 2 == 1, seed=i)
           for i, shape in enumerate(shapes) for causal in (False, True)]
    assert any(ran), f"{knobs} is valid for none of the shapes: the test checks nothing"


SMALL_BLOCKS = [(16, 32, 2, 1), (32, 16, 2, 2), (32, 64, 4, 2)]


@pytest.mark.parametrize("knobs", list(variants(SMALL_BLOCKS)), ids=str)
def test_variant_matches_reference(knobs):
    run_shapes(knobs, SMALL_SHAPES, torch.float16, DEVICE)


def test_float32():
    run_shapes(BwdKnobs(block_m=16, block_n=32, num_warps=2), [(1, 2, 1, 45, 61, 40)], torch.float32, DEVICE)


# -- through autoflash.attention (the autograd.Function) --

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 4, 2, 123, 77, 80), (1, 3, 1, 30, 100, 40), (1, 2, 2, 1, 7, 16)], ids=str)
def test_attention_gradients(shape, causal):
    q, k, v = make_qkv(*shape, torch.float16, DEVICE, seed=21)
    assert_gradients_match(q, k, v, causal)


def test_gradients_of_transposed_inputs_with_lse_and_scale():
    q, k, v = make_qkv(1, 4, 2, 57, 57, 64, torch.float16, DEVICE, transposed=True, seed=22)
    dq, dk, dv = assert_gradients_match(q, k, v, True, softmax_scale=0.2, with_lse=True)
    assert dq.stride() == q.stride() and dk.stride() == k.stride(), "gradients keep the (b, s, h, d) layout"


def test_gradient_layouts_of_one_call_signature():
    """The backward's plans are kept per layout of the incoming gradient: dout of two layouts, with and
    without dlse, through the same forward call signature."""
    q, k, v = make_qkv(1, 4, 2, 45, 45, 32, torch.float16, DEVICE, seed=26)
    for dout_transposed, with_lse in ((False, False), (True, False), (True, True), (False, False)):
        assert_gradients_match(q, k, v, True, with_lse=with_lse, dout_transposed=dout_transposed)


def test_gradients_float32_and_non_unit_last_stride():
    q, k, v = make_qkv(1, 2, 2, 20, 33, 32, torch.float32, DEVICE, seed=23)
    q_strided = torch.empty(*q.shape[:3], 64, dtype=q.dtype, device=q.device)[..., ::2]
    q_strided.copy_(q)
    assert_gradients_match(q_strided, k, v, False)


def test_deterministic_gradients_are_bitwise_repeatable():
    q, k, v = make_qkv(1, 4, 1, 70, 70, 32, torch.float16, DEVICE, seed=24)
    first = assert_gradients_match(q, k, v, True, deterministic=True)
    again = assert_gradients_match(q, k, v, True, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_only_some_inputs_require_grad():
    q, k, v = make_qkv(1, 2, 2, 16, 16, 16, torch.float16, DEVICE, seed=25)
    k.requires_grad_()
    autoflash.attention(q, k, v).float().sum().backward()
    assert k.grad is not None and q.grad is None and not torch.isnan(k.grad).any()


def test_empty_query_gives_zero_gradients():
    q, k, v = make_qkv(1, 2, 2, 0, 5, 32, torch.float16, DEVICE)
    k.requires_grad_()
    autoflash.attention(q, k, v).sum().backward()
    assert torch.equal(k.grad, torch.zeros_like(k))


# Real sizes compile three kernels per variant, dtype, head dim and causal flag: run with pytest -n 16.
GPU_VARIANTS = list(variants([(64, 128, 8, 2), (32, 64, 4, 3)]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("knobs", GPU_VARIANTS, ids=str)
def test_variant_matches_reference_gpu(knobs, dtype):
    run_shapes(knobs, GPU_SHAPES, dtype, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_attention_gradients_gpu(dtype):
    q, k, v = make_qkv(2, 8, 2, 1000, 1000, 128, dtype, "cuda", transposed=True, seed=26)
    assert_gradients_match(q, k, v, True, with_lse=True)
    first = assert_gradients_match(q, k, v, False, deterministic=True)
    assert all(torch.equal(a, b) for a, b in zip(first, assert_gradients_match(q, k, v, False, deterministic=True)))

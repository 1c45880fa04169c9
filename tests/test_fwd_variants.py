"""Every forward variant against the fp64 reference, on odd shapes, with poisoned outputs.

On the CPU this runs in Triton's interpreter at small sizes (fp16 and fp32: the interpreter's bf16
tl.dot is broken); the `gpu` tests run the same matrix at real sizes in fp16 and bf16.
"""

import itertools

import pytest
import torch

from autoflash import codegen
from autoflash.gpu import current
from autoflash.knobs import FwdKnobs, violations
from autoflash.problem import Problem
from conftest import DEVICE
from helpers import assert_matches_reference, make_qkv, poisoned_outputs


def variants(blocks, fa1_blocks):
    """Every loop order x exponent x causal split x tile loading x schedule x (block_m, block_n, num_warps,
    num_stages)."""
    for loop_order, exp, split, loads, schedule in itertools.product(
            ("fa2", "fa1"), ("exp2", "exp"), (True, False), ("pointer", "tma"), ("in_order", "longest_first")):
        if loop_order == "fa1" and (loads, schedule) != ("pointer", "in_order"):
            continue
        for block_m, block_n, warps, stages in blocks if loop_order == "fa2" else fa1_blocks:
            yield FwdKnobs(loop_order=loop_order, block_m=block_m, block_n=block_n, num_warps=warps,
                           num_stages=stages, exp=exp, causal_split=split, loads=loads, schedule=schedule)


def run_variant(knobs, shape, dtype, device, causal, transposed=False, seed=0) -> bool:
    """Check one variant on one problem; False when the validity function rules the pair out."""
    head_dim = shape[-1]
    q, k, v = make_qkv(*shape, dtype, device, transposed=transposed, seed=seed)
    if violations(knobs, Problem.from_tensors(q, k, causal), current(q.device)):
        return False
    out, lse = poisoned_outputs(q)
    scale = 0.7 / head_dim ** 0.5
    codegen.load(knobs).forward(q, k, v, out, lse, scale, causal)
    assert_matches_reference(out, lse, q, k, v, causal, scale)
    return True


def run_shapes(knobs, shapes, dtype, device):
    """Each shape causal and full, every other one in the transposed layout."""
    ran = [run_variant(knobs, shape, dtype, device, causal, transposed=i % 2 == 1, seed=i)
           for i, shape in enumerate(shapes) for causal in (False, True)]
    assert any(ran), f"{knobs} is valid for none of the shapes: the test checks nothing"


# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim): lengths 1, 7, 123, 200 that no block
# divides, cross-attention both ways, GQA 4/2 and MQA 3/1, head dims 40 and 96 (not powers of 2).
SMALL_SHAPES = [
    (1, 1, 1, 1, 1, 16),
    (2, 2, 2, 7, 7, 40),
    (1, 4, 2, 123, 123, 64),
    (1, 3, 1, 200, 77, 96),
    (1, 2, 2, 77, 200, 32),
]
SMALL_BLOCKS = [(16, 16, 2, 2), (32, 64, 2, 2), (64, 32, 2, 2)]
SMALL_VARIANTS = list(variants(SMALL_BLOCKS, SMALL_BLOCKS))


@pytest.mark.parametrize("knobs", SMALL_VARIANTS, ids=str)
def test_variant_matches_reference(knobs):
    run_shapes(knobs, SMALL_SHAPES, torch.float16, DEVICE)


@pytest.mark.parametrize("loop_order", ["fa2", "fa1"])
def test_float32(loop_order):
    knobs = FwdKnobs(loop_order=loop_order, block_m=32, block_n=16, num_warps=2)
    run_shapes(knobs, [(1, 2, 1, 45, 61, 40)], torch.float32, DEVICE)


GPU_SHAPES = [
    (2, 4, 4, 1000, 1000, 128),
    (1, 8, 2, 4097, 4097, 64),
    (3, 2, 1, 257, 1000, 80),
    (1, 4, 4, 1000, 257, 96),
    (1, 2, 2, 1, 4097, 256),
    (2, 3, 3, 123, 123, 40),
]
# Real sizes compile one kernel per variant, dtype, head dim and causal flag: run with pytest -n 16.
GPU_VARIANTS = list(variants([(64, 64, 4, 2), (128, 128, 8, 3)], [(64, 64, 4, 2)]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("knobs", GPU_VARIANTS, ids=str)
def test_variant_matches_reference_gpu(knobs, dtype):
    run_shapes(knobs, GPU_SHAPES, dtype, "cuda")

"""Every forward variant against the fp64 reference, on odd shapes, with poisoned outputs.

On the CPU this runs in Triton's interpreter at small sizes (fp16 and fp32: the interpreter's bf16
tl.dot is broken); the `gpu` tests run the same matrix at real sizes in fp16 and bf16.
"""

import itertools
import os

import pytest
import torch

from autoflash import codegen, families
from autoflash.families import fa1
from autoflash.families.tl.knobs import FwdKnobs
from autoflash.gpu import current
from autoflash.problem import Problem
from conftest import DEVICE
from helpers import assert_matches_reference, make_qkv, poisoned_outputs


def variants(blocks, fa1_blocks):
    """The fa1 family x exponent x causal split x (block_m, block_n, num_warps, num_stages); then the tl
    family: causal split x tile loading (pointer, tma) x schedule x key splits x blocks, with exp2 (exp:
    pointer loads only, the exponent is loop code that loading does not touch); then host-built descriptors
    (tma_host) and packed query heads (pointer loads only), each x causal split x key splits (x schedule for
    packing, which changes the grid); then the head dim as two column tiles, for every way of loading tiles
    (packed heads included) x key splits (with the causal split, without key splits; masking every block,
    with them)."""
    for exp, split in itertools.product(("exp2", "exp"), (True, False)):
        for block_m, block_n, warps, stages in fa1_blocks:
            yield fa1.FwdKnobs(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages, exp=exp,
                               causal_split=split)
    for exp, split, loads, schedule, kv_splits in itertools.product(
            ("exp2", "exp"), (True, False), ("pointer", "tma"), ("in_order", "longest_first"), (1, 4)):
        if exp == "exp" and loads != "pointer":
            continue
        for block_m, block_n, warps, stages in blocks:
            yield FwdKnobs(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages, exp=exp,
                           causal_split=split, loads=loads, schedule=schedule, kv_splits=kv_splits)
    for split, kv_splits in itertools.product((True, False), (1, 4)):
        for block_m, block_n, warps, stages in blocks:
            yield FwdKnobs(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages, causal_split=split,
                           kv_splits=kv_splits, loads="tma_host")
    for split, kv_splits, schedule in itertools.product((True, False), (1, 4), ("in_order", "longest_first")):
        for block_m, block_n, warps, stages in blocks:
            yield FwdKnobs(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages, causal_split=split,
                           kv_splits=kv_splits, schedule=schedule, pack_gqa=True)
    for loads, pack, kv_splits in itertools.product(("pointer", "tma", "tma_host"), (False, True), (1, 4)):
        if pack and loads != "pointer":
            continue
        for block_m, block_n, warps, stages in blocks:
            yield FwdKnobs(block_m=block_m, block_n=block_n, num_warps=warps, num_stages=stages, loads=loads,
                           pack_gqa=pack, kv_splits=kv_splits, causal_split=kv_splits == 1, head_dim_split=True)


def run_variant(knobs, shape, dtype, device, causal, transposed=False, seed=0) -> bool:
    """Check one variant on one problem; False when the validity function rules the pair out."""
    head_dim = shape[-1]
    q, k, v = make_qkv(*shape, dtype, device, transposed=transposed, seed=seed)
    if families.violations(knobs, Problem.from_tensors(q, k, causal), current(q.device)):
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
TILE_NUMBERS = ("block_m", "block_n", "num_warps", "num_stages")


def one_tile_each(knobs_list):
    """Each combination of the knobs that shape the source once, its tile numbers taken in turn from those
    `variants` gave it, so that every tile shape still runs; AUTOFLASH_TEST_ALL=1 keeps the full product (3x the
    interpreter time: CI runs the sample)."""
    if os.environ.get("AUTOFLASH_TEST_ALL", "0") not in ("", "0"):
        return knobs_list
    groups: dict[tuple, list] = {}
    for knobs in knobs_list:
        shape = tuple((name, value) for name, value in knobs.as_point().items() if name not in TILE_NUMBERS)
        groups.setdefault(shape, []).append(knobs)
    return [group[i % len(group)] for i, group in enumerate(groups.values())]


SMALL_VARIANTS = one_tile_each(list(variants(SMALL_BLOCKS, SMALL_BLOCKS)))


def shapes_in_turn(index: int) -> list:
    """Three of SMALL_SHAPES for the index-th sampled variant, taken in turn, so that every shape still runs on
    three fifths of the variants (every one with AUTOFLASH_TEST_ALL=1): the interpreter's time in CI."""
    if os.environ.get("AUTOFLASH_TEST_ALL", "0") not in ("", "0"):
        return SMALL_SHAPES
    return [SMALL_SHAPES[(index + i) % len(SMALL_SHAPES)] for i in range(3)]


@pytest.mark.parametrize("index, knobs", list(enumerate(SMALL_VARIANTS)), ids=lambda x: str(x))
def test_variant_matches_reference(index, knobs):
    run_shapes(knobs, shapes_in_turn(index), torch.float16, DEVICE)


@pytest.mark.parametrize("knobs", [k for k in SMALL_VARIANTS if getattr(k, "pack_gqa", False) and k.block_m == 16],
                         ids=str)
def test_pack_gqa_decode(knobs):
    """Packed query heads where the group fills less than a tile (decode, GQA 8/2) and where a tile's
    rows start and end inside a position (GQA 12/2 at 6 positions: 36 rows in tiles of 16)."""
    run_shapes(knobs, [(2, 8, 2, 1, 50, 32), (1, 12, 2, 6, 40, 16)], torch.float16, DEVICE)


@pytest.mark.parametrize("loads", ["pointer", "tma", "tma_host"])
def test_head_dim_split_wide_and_narrow_remainders(loads):
    """Two column tiles where the second holds few real columns (72 = 64 + 8 in a tile of 16) and where the
    first is 128 wide (160 = 128 + 32), GQA, lengths no block divides."""
    knobs = FwdKnobs(block_m=16, block_n=16, num_warps=2, num_stages=2, loads=loads, head_dim_split=True)
    run_shapes(knobs, [(1, 2, 1, 33, 47, 72), (1, 2, 2, 20, 9, 160)], torch.float16, DEVICE)


@pytest.mark.parametrize("knobs_class", [FwdKnobs, fa1.FwdKnobs], ids=lambda c: c.__module__)
def test_float32(knobs_class):
    knobs = knobs_class(block_m=32, block_n=16, num_warps=2)
    run_shapes(knobs, [(1, 2, 1, 45, 61, 40)], torch.float32, DEVICE)


@pytest.mark.parametrize("exp", ["exp2", "exp"])
def test_softmax_range(exp):
    """Scores that jump by a factor of e^100 and more late in the key loop (keys scaled up from the middle
    on: every earlier term is rescaled to nothing), and rows whose every score is far below -126 in log2
    units, in a causal problem with more queries than keys (its first rows see no key): no overflow, no
    underflow to 0, no nan."""
    knobs = FwdKnobs(block_m=16, block_n=16, num_warps=2, num_stages=2, exp=exp)
    q, k, v = make_qkv(1, 2, 2, 40, 37, 32, torch.float32, DEVICE, seed=5)
    k[:, :, 20:] *= 30.0  # scores of up to ~1e3 after 20 keys of ~1
    for scale, causal, sign in ((0.2, False, 1), (0.2, True, 1), (100.0, True, -1)):  # -1: every score -1e3 or less
        q_run = -q.abs() if sign < 0 else q
        k_run = k.abs() if sign < 0 else k
        out, lse = poisoned_outputs(q_run)
        codegen.load(knobs).forward(q_run, k_run, v, out, lse, scale, causal)
        assert_matches_reference(out, lse, q_run, k_run, v, causal, scale)


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

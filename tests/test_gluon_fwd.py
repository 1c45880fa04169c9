"""The Gluon forward on the GPU against the fp64 reference: every kind of variant, ragged and unequal
sequence lengths, causal and full, GQA and MQA, head dims 40..256, fp16 and bf16, (B,S,H,D) views, mask_mods;
outputs and lse poisoned before each call. Launched through the family's launcher (codegen renders it; no
dispatcher), but the mask_mods' gradients (autoflash.attention: this forward and the Gluon backward)."""

import pytest
import torch

from autoflash import checks, codegen, families
from autoflash.families.gluon.defaults import default_knobs
from autoflash.families.gluon.knobs import FwdKnobs
from autoflash.families.gluon.limits import violations
from autoflash.gpu import current
from autoflash.mask_mod import MaskMod
from autoflash.problem import Problem

from helpers import (assert_forward_kernels_match, assert_gradients_match, assert_matches_reference, make_qkv,
                     poisoned_outputs)
from test_attention_variants import CASES as VARIANT_CASES, run_forward
from test_mask_mod import documents, prefix_lm, same_document

pytestmark = pytest.mark.gpu

VARIANTS = {
    "overlap": {},
    "pingpong": dict(pingpong=True),
    "sequential": dict(overlap=False),
    "one consumer": dict(consumers=1),
    "tile per program": dict(persistent=False),
    "dynamic": dict(dynamic=True),
    "dynamic, two q tiles": dict(dynamic=True, q_buffers=2),
    "o in q": dict(stage_o_in_q=True, num_buffers=3),
    "two q tiles": dict(q_buffers=2),
    "two q tiles, o in q": dict(q_buffers=2, stage_o_in_q=True),
    "three consumers": dict(consumers=3, consumer_regs=160, block_n=64),
}
LENGTHS = [(1, 1), (7, 7), (123, 123), (1000, 1000), (4097, 4097), (123, 1000), (1000, 123), (7, 4097)]
# tile_overlap (plain problems, persistent, two Q tiles): a tile's block 0 under the last tile's last P V. What
# violations() allows: full attention, a static grid, two consumers (causal, dynamic and three consumers computed
# wrong results on the H100, NOTES G9), with O in its own tile or in Q, with or without ping-pong.
TILE_OVERLAP = {
    "tile overlap": dict(q_buffers=2, tile_overlap=True),
    "tile overlap, pingpong": dict(q_buffers=2, pingpong=True, tile_overlap=True),
    "tile overlap, o in q": dict(q_buffers=2, stage_o_in_q=True, tile_overlap=True),
    "tile overlap, o in q, pingpong": dict(q_buffers=2, stage_o_in_q=True, pingpong=True, tile_overlap=True),
}
# The same shapes without tile_overlap (two Q tiles, several tiles a program: test_variants' 2 x 4 heads give a
# program at most 2 tiles, so a Q slot's second phase ran there never). They passed on the H100 where NOTES G9's
# refused cases failed: those faults are tile_overlap's cross-tile step's, not the two-Q-tile path's.
TWO_Q_TILES = {
    "two q tiles": dict(q_buffers=2),
    "two q tiles, dynamic": dict(q_buffers=2, dynamic=True),
    "two q tiles, three consumers, dynamic": dict(q_buffers=2, consumers=3, consumer_regs=160, block_n=64,
                                                  dynamic=True),
    "two q tiles, o in q, pingpong": dict(q_buffers=2, stage_o_in_q=True, pingpong=True),
}
# consumer_keys (causal, plain problems): each consumer computes the key blocks to its own rows' diagonal, the
# producer releases the tile's later ones for it (NOTES 120), with 64- and 128-key blocks, three consumers, the
# sequential path on a static grid.
CONSUMER_KEYS = {
    "consumer keys, 64 keys": dict(consumer_keys=True, block_n=64, num_buffers=3, dynamic=True),
    "consumer keys": dict(consumer_keys=True, q_buffers=2, dynamic=True),
    "consumer keys, three consumers": dict(consumer_keys=True, consumers=3, consumer_regs=160, block_n=64,
                                           q_buffers=2, dynamic=True),
    "consumer keys, sequential": dict(consumer_keys=True, block_n=64, overlap=False),
}

# Two and three programs an SM (one consumer warpgroup each, that share of the registers and shared memory): the
# persistent grid of that many programs an SM, with two Q tiles, a program per tile; 64-key blocks past head dim 64
# (claimed from the counter, outputs were left unwritten: refused, NOTES 147, 149). Three: head dim 64 and 64-key
# blocks only (80 registers a thread at launch).
PROGRAMS_PER_SM = {
    "two programs an SM": dict(consumers=1, programs_per_sm=2),
    "two programs an SM, two q tiles": dict(consumers=1, programs_per_sm=2, q_buffers=2),
    "two programs an SM, a program per tile": dict(consumers=1, programs_per_sm=2, persistent=False),
    "three programs an SM": dict(consumers=1, programs_per_sm=3, block_n=64),
    "three programs an SM, two q tiles": dict(consumers=1, programs_per_sm=3, block_n=64, q_buffers=2),
}

def run(knobs, q, k, v, causal, with_lse=True):
    problem = Problem.from_tensors(q, k, causal)
    assert violations(knobs, problem, current(q.device)) == []
    out, lse = poisoned_outputs(q)
    lse = lse if with_lse else None
    forward = codegen.load(knobs).forward_plan(q, k, v, out, lse, q.shape[-1] ** -0.5, causal)
    forward(q, k, v, out, lse)
    return out, lse


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("seqlen_q, seqlen_k", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_variants(variant, seqlen_q, seqlen_k, causal):
    head_dim = 64 if variant == "three consumers" else 128
    q, k, v = make_qkv(2, 4, 2, seqlen_q, seqlen_k, head_dim, torch.float16, "cuda")
    out, lse = run(FwdKnobs(**VARIANTS[variant]), q, k, v, causal)
    assert_matches_reference(out, lse, q, k, v, causal)


def _several_tiles_a_program(knobs, head_dim, seqlen_q, seqlen_k, causal):
    """64 batch x heads up to 1000 queries, 16 past: several tiles a program on the H100's 132 SMs."""
    batch, heads = (4, 16) if seqlen_q <= 1000 else (2, 8)
    dtype = torch.bfloat16 if causal else torch.float16
    q, k, v = make_qkv(batch, heads, heads // 4, seqlen_q, seqlen_k, head_dim, dtype, "cuda", seed=seqlen_q)
    out, lse = run(knobs, q, k, v, causal)
    assert_matches_reference(out, lse, q, k, v, causal)


@pytest.mark.parametrize("variant", TILE_OVERLAP)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlen_q, seqlen_k", LENGTHS)
def test_tile_overlap(variant, head_dim, seqlen_q, seqlen_k):
    """Several tiles a program, so a tile's block 0 runs under the last one's last P V; short tiles (one key
    block: the step is that block's P V alone), unequal lengths. Full attention only (violations, NOTES G9)."""
    _several_tiles_a_program(FwdKnobs(**TILE_OVERLAP[variant]), head_dim, seqlen_q, seqlen_k, False)


@pytest.mark.parametrize("variant", TWO_Q_TILES)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(1000, 1000), (4097, 4097), (1000, 123)])
@pytest.mark.parametrize("causal", [False, True])
def test_two_q_tiles_several_tiles_a_program(variant, head_dim, seqlen_q, seqlen_k, causal):
    """The two-Q-tile path without tile_overlap at test_tile_overlap's shapes (each Q slot through both phases)."""
    if "three consumers" in variant and head_dim != 64:
        pytest.skip("three consumers: the head dim 64 defaults' shape")
    _several_tiles_a_program(FwdKnobs(**TWO_Q_TILES[variant]), head_dim, seqlen_q, seqlen_k, causal)


@pytest.mark.parametrize("variant", PROGRAMS_PER_SM)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlen_q, seqlen_k", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_programs_per_sm(variant, head_dim, seqlen_q, seqlen_k, causal):
    """Several tiles a program, GQA, unequal lengths."""
    if "three" in variant and head_dim != 64:
        pytest.skip("three programs an SM: head dim 64 (the registers)")
    knobs = PROGRAMS_PER_SM[variant] | (dict(block_n=64) if head_dim > 64 else {})
    _several_tiles_a_program(FwdKnobs(**knobs), head_dim, seqlen_q, seqlen_k, causal)


@pytest.mark.parametrize("variant", CONSUMER_KEYS)
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("seqlen_q, seqlen_k", LENGTHS)
def test_consumer_keys(variant, head_dim, seqlen_q, seqlen_k):
    """Causal, several tiles a program (the ring's positions run on past the blocks a consumer skips), GQA,
    unequal lengths (more queries than keys: consumers whose rows see no key)."""
    if "three consumers" in variant and head_dim != 64:
        pytest.skip("three consumers: the head dim 64 defaults' shape")
    _several_tiles_a_program(FwdKnobs(**CONSUMER_KEYS[variant]), head_dim, seqlen_q, seqlen_k, True)


@pytest.mark.parametrize("case", [c for c in VARIANT_CASES if c[0] and c[1] == (-1, -1)]
                         + [(True, (-1, -1), 50.0, None)], ids=str)
def test_consumer_keys_softcap_alibi(case):
    """consumer_keys with softcapping and ALiBi (the scores alone change), and over two column tiles."""
    for i, (shape, knobs) in enumerate([((2, 8, 2, 1000, 1000, 128), FwdKnobs(**CONSUMER_KEYS["consumer keys"])),
                                        ((1, 4, 2, 4097, 123, 64), FwdKnobs(**CONSUMER_KEYS["consumer keys, 64 keys"])),
                                        ((1, 4, 2, 777, 1234, 160), FwdKnobs(consumer_keys=True, head_dim_split=True,
                                                                             block_n=64, stage_o_in_q=True))]):
        assert run_forward(knobs, shape, torch.bfloat16, case, seed=i), f"{knobs} cannot run {shape} {case}"


def test_tile_overlap_repeats():
    """The same plan again (every mbarrier phase starts over), on new inputs."""
    knobs = FwdKnobs(**TILE_OVERLAP["tile overlap"])
    q, k, v = make_qkv(4, 16, 4, 1000, 1000, 128, torch.float16, "cuda")
    out, lse = poisoned_outputs(q)
    forward = codegen.load(knobs).forward_plan(q, k, v, out, lse, q.shape[-1] ** -0.5, False)
    for seed in range(3):
        q, k, v = make_qkv(4, 16, 4, 1000, 1000, 128, torch.float16, "cuda", seed=seed)
        out, lse = poisoned_outputs(q)
        forward(q, k, v, out, lse)
        assert_matches_reference(out, lse, q, k, v, False)


# head_dim_split: the head dim as two column tiles (160 = 128 + 32, 192 = 128 + 64, 96 = 64 + 32, 80 = 64 + 16,
# 72 = 64 + 16, 40 = 32 + 16: columns past head_dim in the second tile read as 0 and are never written), on the
# knob sets of each head dim's winners and the paths the template splits (overlap or not, ping-pong, O in Q or its
# own tile), at the head dims where each fits.
HEAD_DIM_SPLIT = {
    "split": (dict(head_dim_split=True), (40, 72, 80, 96)),
    "split, sequential, one consumer": (dict(head_dim_split=True, overlap=False, consumers=1), (40, 80, 96, 160)),
    "split, two q tiles, dynamic": (dict(head_dim_split=True, q_buffers=2, dynamic=True), (40, 72, 80, 96)),
    "split, o in q": (dict(head_dim_split=True, stage_o_in_q=True), (160,)),
    "split, o in q, 64 keys": (dict(head_dim_split=True, block_n=64, stage_o_in_q=True), (96, 160, 192)),
    "split, o in q, 64 keys, pingpong": (dict(head_dim_split=True, block_n=64, stage_o_in_q=True, pingpong=True),
                                         (160, 192)),
}


@pytest.mark.parametrize("variant, head_dim", [(name, d) for name, (_, dims) in HEAD_DIM_SPLIT.items() for d in dims])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_split(variant, head_dim, causal):
    knobs = FwdKnobs(**HEAD_DIM_SPLIT[variant][0])
    for i, (seqlen_q, seqlen_k) in enumerate(LENGTHS):
        q, k, v = make_qkv(2, 8, 2, seqlen_q, seqlen_k, head_dim, (torch.float16, torch.bfloat16)[i % 2], "cuda",
                           seed=i)
        out, lse = run(knobs, q, k, v, causal)
        assert_matches_reference(out, lse, q, k, v, causal)


def test_head_dim_split_with_variants_and_a_mask_mod():
    """The fixed variants and a mask_mod touch the scores alone: split, they run as unsplit."""
    knobs = FwdKnobs(head_dim_split=True, block_n=64, stage_o_in_q=True)
    for i, case in enumerate(VARIANT_CASES):
        assert run_forward(knobs, (1, 4, 2, 1000, 4097, 160), torch.bfloat16, case, seed=i), case
    for causal in (False, True):
        run_mask_mod(knobs, (2, 8, 2, 1000, 4097, 192), torch.bfloat16, "documents", causal)


@pytest.mark.parametrize("head_dim", [40, 64, 72, 96, 128, 160, 192, 256])  # 72-192: split by default
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_q, heads_kv", [(8, 2), (4, 1)])
def test_defaults(head_dim, dtype, causal, heads_q, heads_kv):
    for seqlen_q, seqlen_k in ((1000, 1000), (123, 4097), (4097, 123)):
        q, k, v = make_qkv(2, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, dtype, "cuda")
        knobs = default_knobs(Problem.from_tensors(q, k, causal), current(q.device))
        out, lse = run(knobs, q, k, v, causal)
        assert_matches_reference(out, lse, q, k, v, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_seqlen_heads_layout_and_no_lse(causal):
    q, k, v = make_qkv(2, 8, 2, 1000, 777, 128, torch.bfloat16, "cuda", transposed=True)
    for knobs in (FwdKnobs(), FwdKnobs(persistent=False)):
        out, _ = run(knobs, q, k, v, causal, with_lse=False)
        assert_matches_reference(out, None, q, k, v, causal)


def test_many_tiles_per_program():
    """Several tiles a persistent program, causal runs of heads longer than one (and a last run shorter)."""
    q, k, v = make_qkv(3, 5, 5, 1000, 1000, 128, torch.float16, "cuda")
    launcher = codegen.load(FwdKnobs()).launcher
    budget = launcher.L2_BYTES_PER_RUN
    try:
        launcher.L2_BYTES_PER_RUN = 1 << 20  # runs of 2 heads
        for knobs in (FwdKnobs(), FwdKnobs(dynamic=True)):
            for causal in (False, True):
                out, lse = run(knobs, q, k, v, causal)
                assert_matches_reference(out, lse, q, k, v, causal)
    finally:
        launcher.L2_BYTES_PER_RUN = budget


def test_dynamic_tiles_repeat_and_streams():
    """The claimed-tile counter is back at 0 after every launch: the same plan run again, on new inputs, and on
    a second stream (its own counter) still computes every tile."""
    knobs = FwdKnobs(dynamic=True, q_buffers=2)
    q, k, v = make_qkv(2, 6, 3, 1000, 1000, 128, torch.float16, "cuda")
    out, lse = poisoned_outputs(q)
    forward = codegen.load(knobs).forward_plan(q, k, v, out, lse, q.shape[-1] ** -0.5, True)
    side = torch.cuda.Stream()
    for seed in range(3):
        q, k, v = make_qkv(2, 6, 3, 1000, 1000, 128, torch.float16, "cuda", seed=seed)
        for stream in (torch.cuda.current_stream(), side):
            out, lse = poisoned_outputs(q)
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                forward(q, k, v, out, lse)
            stream.synchronize()
            assert_matches_reference(out, lse, q, k, v, True)


@pytest.mark.parametrize("variant", ["overlap", "pingpong", "sequential", "dynamic, two q tiles", "o in q"])
@pytest.mark.parametrize("case", VARIANT_CASES + [(True, (4096, -1), 0.0, None), (True, (-1, -1), 50.0, None),
                                                  (True, (256, -1), 30.0, "heads")], ids=str)
def test_window_softcap_alibi(variant, case):
    """The Gluon forward's fixed variants (rendered with their gates) against the fp64 reference, GQA, ragged and
    unequal lengths; head dim 256 with O in Q."""
    for i, (shape, knobs) in enumerate([((2, 8, 2, 1000, 1000, 128), FwdKnobs(**VARIANTS[variant])),
                                        ((1, 4, 2, 4097, 123, 64), FwdKnobs(**VARIANTS[variant])),
                                        ((1, 4, 2, 123, 4097, 256), FwdKnobs(block_n=64, stage_o_in_q=True))]):
        assert run_forward(knobs, shape, torch.bfloat16, case, seed=i), f"{knobs} cannot run {shape} {case}"


def rows_that_see_nothing(b, h, q_idx, kv_idx):
    """Every third query row sees no key, nor any from 300 on (whole tiles with empty lists)."""
    return (q_idx % 3 != 1) & (q_idx < 300) & (kv_idx <= q_idx + 40)


def heads_apart(b, h, q_idx, kv_idx):
    """Even query heads see up to 50 x h keys past their diagonal (17 more in batch entry 1), odd ones none (the
    backward's walk over a KV head's query heads passes over them; the tables have batch and head dimensions)."""
    return (h % 2 == 0) & (kv_idx <= q_idx + 50 * h + 17 * b)


def mask_mod(name, seqlen):
    """Issue 16's masks for up to `seqlen` positions: documents of uneven lengths (one of a single token) from a
    captured tensor, prefix-LM, a mask that leaves rows without a key (out 0, lse -inf, as tl's), and one per
    batch entry and head."""
    if name == "documents":
        return MaskMod(same_document, documents(5, 1, 17, 300, 1000, max(seqlen - 1323, 1)))
    return MaskMod({"prefix-lm": prefix_lm, "rows that see nothing": rows_that_see_nothing,
                    "heads apart": heads_apart}[name])


def run_mask_mod(knobs, shape, dtype, name, causal, seed=0):
    """One launch of the Gluon forward with the mask_mod `name` (knobs None: the family's default) into poisoned
    outputs, against the fp64 reference."""
    q, k, v = make_qkv(*shape, dtype, "cuda", seed=seed)
    mod = mask_mod(name, max(shape[3:5]))
    problem = Problem.from_tensors(q, k, causal, mask_mod=mod.fingerprint())
    knobs = knobs or default_knobs(problem, current(q.device))
    assert violations(knobs, problem, current(q.device)) == []
    variant = checks.variant_args(causal, (-1, -1), shape[3], shape[4], 0.0, None, mod)
    kernels = codegen.load(knobs, problem.gates(), mod.rendered)
    assert_forward_kernels_match(kernels, variant, q, k, v, causal, shape[-1] ** -0.5, mask_mod=mod)


MASK_MODS = ["documents", "prefix-lm", "rows that see nothing"]


@pytest.mark.parametrize("name", MASK_MODS)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_mask_mods(name, head_dim, causal):
    """The defaults (dynamic tiles, two Q tiles; O in Q past head dim 128) with each mask, GQA 4:1, bf16, the
    lengths of issue 16's list and unequal ones."""
    for seed, (seqlen_q, seqlen_k) in enumerate([(1, 1), (7, 7), (123, 123), (1000, 1000), (4097, 4097),
                                                 (123, 1000), (1000, 123)]):
        run_mask_mod(None, (2, 8, 2, seqlen_q, seqlen_k, head_dim), torch.bfloat16, name, causal, seed)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", MASK_MODS)
def test_mask_mods_on_every_knob(variant, name):
    """Every kind of knob set (the ring, overlap or not, ping-pong, one and three consumers: the table's tile
    follows block_m x consumers), fp16, causal and not."""
    head_dim = 64 if variant == "three consumers" else 128
    for causal in (False, True):
        run_mask_mod(FwdKnobs(**VARIANTS[variant]), (1, 4, 2, 1000, 4097, head_dim), torch.float16, name, causal)


@pytest.mark.parametrize("name", MASK_MODS)
@pytest.mark.parametrize("causal", [False, True])
def test_mask_mod_gradients(name, causal):
    """Through autoflash.attention (its defaults: this forward from 512 queries, the Gluon backward), lse's
    gradient too."""
    q, k, v = make_qkv(2, 8, 2, 1000, 1000, 128, torch.bfloat16, "cuda", seed=3)
    mod = mask_mod(name, 1000)
    problem = Problem.from_tensors(q, k, causal, mask_mod=mod.fingerprint())
    assert families.default_knobs(problem, current(q.device)).family == "gluon"
    assert families.default_knobs(problem, current(q.device), "bwd").family == "gluon"
    assert_gradients_match(q, k, v, causal, with_lse=True, mask_mod=mod)

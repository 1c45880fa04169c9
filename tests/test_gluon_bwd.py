"""The Gluon backward on the GPU against the fp64 reference gradients (dq, dk, dv poisoned with NaN before each
call): every knob point, ragged and unequal sequence lengths, causal and full, GQA and MQA, head dims 32..256, fp16
and bf16, (B,S,H,D) views, the gradient of a returned lse, a plan run again, the fixed variants and mask_mods. Launched through the family's launcher
(codegen renders it; no dispatcher: every knob point, not only those dispatch picks)."""

import dataclasses
import itertools

import pytest
import torch

from autoflash import checks, codegen
from autoflash.families.gluon.defaults import default_knobs
from autoflash.families.gluon.knobs import BwdKnobs
from autoflash.families.gluon.limits import violations
from autoflash.gpu import KNOWN, current
from autoflash.problem import Problem
from autoflash.reference import GRAD_TOLERANCE, attention_backward_reference, attention_reference, gradient_errors

from helpers import make_qkv
from test_attention_variants import CASES as VARIANT_CASES, _slopes as variant_slopes
from test_bwd_variants import run_variant
from test_gluon_fwd import MASK_MODS, mask_mod

pytestmark = pytest.mark.gpu

H100 = KNOWN["h100"]
LENGTHS = [(1, 1), (7, 7), (123, 123), (1000, 1000), (4097, 4097), (123, 1000), (1000, 123), (7, 4097)]


def _largest_head_dim(knobs):
    """Of 32, 64, 128 and 256, the largest head dim `knobs` runs (128-row steps hold dK and dV of 32 columns,
    32-row steps are for head dims past 128)."""
    return max((d for d in (32, 64, 128, 256) if not violations(knobs, Problem(2, 4, 2, 1000, 1000, d, False, "float16"), H100)),
               default=None)


# Every knob point, at the largest head dim it runs (query_splits 1: test_query_splits splits the steps).
_CHOICES = {name: values for name, values in BwdKnobs.choices().items() if name != "query_splits"}
VARIANTS = [(knobs, head_dim) for values in itertools.product(*_CHOICES.values())
            if (head_dim := _largest_head_dim(knobs := BwdKnobs(**dict(zip(_CHOICES, values)))))]


@pytest.mark.parametrize("knobs, head_dim", VARIANTS, ids=str)
@pytest.mark.parametrize("seqlen_q, seqlen_k", LENGTHS)
@pytest.mark.parametrize("causal", [False, True])
def test_variants(knobs, head_dim, seqlen_q, seqlen_k, causal):
    shape = (2, 4, 2, seqlen_q, seqlen_k, head_dim)
    assert run_variant(knobs, shape, torch.float16, "cuda", causal, transposed=seqlen_q == 123, seed=seqlen_k)


@pytest.mark.parametrize("head_dim", [32, 40, 64, 80, 96, 128, 192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads_q, heads_kv", [(8, 2), (4, 1), (3, 3), (7, 1)])  # 7:1: split unevenly from 2k causal
def test_defaults(head_dim, dtype, causal, heads_q, heads_kv):
    for seqlen_q, seqlen_k in ((1000, 1000), (123, 4097), (4097, 123)):
        shape = (2, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim)
        problem = Problem(*shape, causal, str(dtype).removeprefix("torch."))
        knobs = default_knobs(problem, current(torch.device("cuda")), "bwd")
        assert knobs is not None and run_variant(knobs, shape, dtype, "cuda", causal, transposed=heads_q == 3)


@pytest.mark.parametrize("group_splits", [2, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_group_splits(group_splits, head_dim, causal):
    """A KV head's 8 query heads over 2, 4 or 8 programs, whose fp32 dK and dV add up (MQA, and GQA 8:1)."""
    for shape in ((2, 8, 1, 1000, 1000, head_dim), (1, 16, 2, 123, 4097, head_dim), (1, 16, 2, 4097, 123, head_dim)):
        knobs = BwdKnobs(block_m=64 if head_dim <= 128 else 32, group_splits=group_splits)
        assert not violations(knobs, Problem(*shape, causal, "bfloat16"), H100)
        assert run_variant(knobs, shape, torch.bfloat16, "cuda", causal, transposed=shape[3] == 123)


@pytest.mark.parametrize("query_splits", [2, 4, 8, 16])
@pytest.mark.parametrize("head_dim", [40, 64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_query_splits(query_splits, head_dim, causal):
    """A key block's steps over 2-16 programs, whose fp32 dK and dV add up (NOTES 107): cross-attention over 77
    keys, ragged and unequal lengths, runs of unequal length (steps the splits do not divide), GQA with split groups
    and unevenly split ones, the ring's slots and dQ's turns."""
    for i, (shape, changes) in enumerate([((2, 8, 8, 4096, 77, head_dim), {}),
                                          ((1, 8, 2, 1000, 123, head_dim), dict(group_splits=2)),
                                          ((2, 4, 4, 577, 1000, head_dim), dict(num_buffers=3)),
                                          ((1, 6, 2, 123, 7, head_dim), dict(group_splits=2, uneven_groups=True)),
                                          ((1, 3, 3, 4097, 123, head_dim), dict(dq_turns=head_dim <= 64))]):
        knobs = BwdKnobs(block_m=64 if head_dim <= 128 else 32, query_splits=query_splits, **changes)
        why = violations(knobs, Problem(*shape, causal, "bfloat16"), H100)
        if why:  # (4 steps over 8 programs or 16, 10 over 16: some would walk none)
            assert all("without one" in w or "shared memory" in w for w in why), why
            continue
        assert run_variant(knobs, shape, torch.bfloat16, "cuda", causal, transposed=i % 2 == 1, seed=i)


@pytest.mark.parametrize("group_splits", [2, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_uneven_group_splits(group_splits, head_dim, causal):
    """Groups the splits do not divide (MQA 71:1, GQA 7:1 and 3:1): ceil(group / splits) query heads a program, the
    last of each group fewer, their fp32 dK and dV added up (8 programs with three ring slots: the wide groups'
    default at head dim 64, NOTES 102)."""
    for shape in ((1, 71, 1, 1000, 1000, head_dim), (2, 14, 2, 123, 4097, head_dim), (1, 6, 2, 4097, 123, head_dim)):
        knobs = BwdKnobs(group_splits=group_splits, uneven_groups=True, num_buffers=3 if group_splits == 8 else 2)
        if violations(knobs, Problem(*shape, causal, "bfloat16"), H100):  # (3 heads over 4 programs: one empty)
            assert shape[1] // shape[2] < group_splits
            continue
        assert run_variant(knobs, shape, torch.bfloat16, "cuda", causal, transposed=shape[3] == 123)


@pytest.mark.parametrize("head_dim", [16, 40, 64])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_dq_turns(head_dim, dtype, causal):
    """The two warpgroups adding dQ's whole tile in turns: odd step counts (a program's last step is either
    warpgroup's turn), ragged and unequal lengths, a key block past seqlen_k, MHA and GQA 4:1 split over programs."""
    for i, (shape, splits) in enumerate([((2, 4, 4, 1000, 1000, head_dim), 1), ((1, 4, 1, 123, 4097, head_dim), 1),
                                         ((1, 8, 2, 4097, 123, head_dim), 4), ((3, 2, 2, 7, 65, head_dim), 1),
                                         ((2, 4, 1, 577, 577, head_dim), 2)]):
        knobs = BwdKnobs(dq_turns=True, group_splits=splits, num_buffers=2 + i % 2)
        assert not violations(knobs, Problem(*shape, causal, str(dtype).removeprefix("torch.")), H100)
        assert run_variant(knobs, shape, dtype, "cuda", causal, transposed=i % 2 == 1, seed=i)


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_dv_late(head_dim, dtype, causal):
    """dV's wgmma issued after dS^T is stored (NOTES G-bwd21): one-row and odd lengths (1, 7, 123, 1000, 4097),
    unequal ones, a key block past seqlen_k, MHA, MQA and GQA 4:1 (split over programs or not), 2 and 3 slots, with
    the dQ writer or dq_turns where they run; gradients poisoned, against the fp64 reference."""
    block_m = 64 if head_dim <= 128 else 32
    for i, (shape, extra) in enumerate([((2, 4, 4, 1000, 1000, head_dim), {}),
                                        ((1, 4, 1, 123, 4097, head_dim), dict(num_buffers=3)),
                                        ((1, 8, 2, 4097, 123, head_dim), dict(group_splits=2)),
                                        ((3, 2, 2, 7, 7, head_dim), dict(dq_writer=True)),
                                        ((2, 2, 1, 1, 1, head_dim), {}),
                                        ((2, 4, 1, 577, 1000, head_dim), dict(dq_turns=head_dim <= 64))]):
        knobs = BwdKnobs(block_m=block_m, dv_late=True, **extra)
        assert not violations(knobs, Problem(*shape, causal, str(dtype).removeprefix("torch.")), H100)
        assert run_variant(knobs, shape, dtype, "cuda", causal, transposed=i % 2 == 1, seed=i)


@pytest.mark.parametrize("knobs", [BwdKnobs(), BwdKnobs(group_splits=2), BwdKnobs(dq_writer=True), BwdKnobs(block_m=32),
                                   BwdKnobs(dq_turns=True), BwdKnobs(dv_late=True),
                                   BwdKnobs(dq_turns=True, dv_late=True), BwdKnobs(dq_writer=True, dv_late=True)],
                         ids=str)
@pytest.mark.parametrize("case", VARIANT_CASES + [(True, (4096, -1), 0.0, None), (True, (-1, -1), 50.0, None),
                                                  (True, (256, -1), 30.0, "heads")], ids=str)
def test_window_softcap_alibi(knobs, case):
    """The Gluon backward's fixed variants (rendered with their gates) against the fp64 reference's gradients, GQA,
    ragged and unequal lengths; head dims past 128 in 32-row steps."""
    shapes = ([(2, 8, 2, 1000, 1000, 128), (1, 4, 2, 4097, 123, 64), (1, 4, 2, 123, 4097, 64)]
              if knobs.block_m == 64 else [(1, 4, 2, 1000, 1000, 256), (1, 2, 1, 123, 777, 192)])
    _check_fixed_variants(knobs, case, [s for s in shapes if not knobs.dq_turns or s[-1] <= 64])  # (dq_turns: to d64)


def _check_fixed_variants(knobs, case, shapes):
    """`case` (causal, window, softcap, ALiBi) on each of `shapes` against the fp64 reference's gradients."""
    causal, window, softcap, alibi = case
    for i, shape in enumerate(shapes):
        q, k, v = make_qkv(*shape, torch.bfloat16, "cuda", seed=i)
        slopes = variant_slopes(alibi, q, i)
        problem = Problem.from_tensors(q, k, causal, window, softcap > 0, slopes is not None)
        assert not violations(knobs, problem, current(q.device)), violations(knobs, problem, current(q.device))
        scale = 0.7 / shape[-1] ** 0.5
        out, lse = attention_reference(q, k, v, causal, scale, window_size=window, softcap=softcap,
                                       alibi_slopes=slopes)
        out, lse = out.to(q.dtype), lse.float()
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(i)).to(q)
        grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
        variant = checks.variant_args(problem.causal, problem.window, shape[3], shape[4], softcap, slopes)
        codegen.load(knobs, problem.gates()).backward(q, k, v, out, lse, dout, *grads, scale, problem.causal,
                                                      variant=variant)
        expected = attention_backward_reference(q, k, v, dout, causal, scale, window_size=window, softcap=softcap,
                                                alibi_slopes=slopes)
        for name, error in zip(("dq", "dk", "dv"), gradient_errors(grads, expected)):
            assert error < GRAD_TOLERANCE[q.dtype], f"{shape} {case}: {name} relative error {error:.2e}"


@pytest.mark.parametrize("head_dim", [80, 96, 144, 160, 192])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dim_split_backward(head_dim, dtype, causal):
    """The head dim in two column tiles (NOTES G-bwd23: 144 = 128 + 16, 160 = 128 + 32, 192 = 128 + 64), both
    warpgroups on the program's 64 keys, each one tile's dK, dV and dQ: the eight lengths of LENGTHS (odd, one-row,
    unequal), GQA 4:1 (its query heads over one or two programs) and MHA, with dV's late wgmma and 32-row steps
    where they run, gradients poisoned, against the fp64 reference. Refused at 80 and 96 (rendered past 128)."""
    changes = [{}, dict(dv_late=True), dict(group_splits=2), dict(block_m=32 if head_dim == 192 else 64)]
    for i, (seqlen_q, seqlen_k) in enumerate(LENGTHS):
        shape = (2, 8, 2, seqlen_q, seqlen_k, head_dim) if i % 2 == 0 else (1, 4, 4, seqlen_q, seqlen_k, head_dim)
        knobs = BwdKnobs(head_dim_split=True, **changes[i % len(changes)])
        why = violations(knobs, Problem(*shape, causal, str(dtype).removeprefix("torch.")), H100)
        if head_dim <= 128:
            assert any("past head dim 128" in w for w in why), why
            continue
        assert not why, why
        assert run_variant(knobs, shape, dtype, "cuda", causal, transposed=i % 4 == 1, seed=i)


@pytest.mark.parametrize("case", VARIANT_CASES[:2] + VARIANT_CASES[5:7] + [(True, (256, -1), 30.0, "heads")], ids=str)
def test_head_dim_split_backward_with_variants(case):
    """The split backward with the fixed variants (window, softcap, ALiBi: S^T's path, over both column tiles)."""
    _check_fixed_variants(BwdKnobs(head_dim_split=True), case, [(1, 4, 2, 1000, 1000, 160), (1, 2, 1, 123, 777, 192)])


SPLIT_KEYS = BwdKnobs(block_m=64, num_buffers=1, split_keys=True)
SPLIT_KEYS_TILES = BwdKnobs(block_m=64, split_keys=True, head_dim_split=True)  # (two ring slots)


@pytest.mark.parametrize("head_dim", [136, 160, 192, 256])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
def test_split_keys(head_dim, dtype, causal):
    """Past head dim 128 the two warpgroups on 32 keys each, every column of their dK and dV (split_keys, NOTES
    114)."""
    _check_split_keys(SPLIT_KEYS, head_dim, dtype, causal)


@pytest.mark.parametrize("head_dim", [136, 160, 192])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("num_buffers", [1, 2])
def test_split_keys_over_column_tiles(head_dim, dtype, causal, num_buffers):
    """split_keys with the columns in two tiles, 128 and 64 (NOTES 118), one or two ring slots."""
    _check_split_keys(dataclasses.replace(SPLIT_KEYS_TILES, num_buffers=num_buffers), head_dim, dtype, causal)


def _check_split_keys(base, head_dim, dtype, causal):
    """The eight lengths of LENGTHS (odd, one-row, unequal), GQA 4:1 and MHA, the query heads over one or two
    programs, a key block's steps over two, gradients poisoned, against the fp64 reference."""
    changes = [{}, dict(group_splits=2), dict(query_splits=2), dict(group_splits=2, query_splits=2)]
    for i, (seqlen_q, seqlen_k) in enumerate(LENGTHS):
        change = changes[i % len(changes)]  # (MHA at the fifth and seventh lengths: split groups need GQA)
        gqa = "group_splits" in change or i < len(changes)
        shape = (2, 8, 2, seqlen_q, seqlen_k, head_dim) if gqa else (1, 4, 4, seqlen_q, seqlen_k, head_dim)
        knobs = dataclasses.replace(base, **change)
        why = violations(knobs, Problem(*shape, causal, str(dtype).removeprefix("torch.")), H100)
        if knobs.query_splits > 1 and any("query_splits" in w for w in why):  # (one-row sequences: one step)
            knobs = dataclasses.replace(knobs, query_splits=1)
            why = violations(knobs, Problem(*shape, causal, str(dtype).removeprefix("torch.")), H100)
        assert not why, why
        assert run_variant(knobs, shape, dtype, "cuda", causal, transposed=i % 4 == 1, seed=i)


@pytest.mark.parametrize("case", VARIANT_CASES[:2] + VARIANT_CASES[4:6] + [(True, (256, -1), 30.0, None)], ids=str)
def test_split_keys_with_variants(case):
    """split_keys with windows and softcapping (S's path, over a warpgroup's 32 keys), over one padded tile and two
    column tiles."""
    _check_fixed_variants(SPLIT_KEYS, case, [(1, 4, 2, 1000, 1000, 256), (1, 2, 1, 123, 777, 192)])
    _check_fixed_variants(SPLIT_KEYS_TILES, case, [(1, 4, 2, 1000, 1000, 192), (1, 2, 1, 123, 777, 160)])


@pytest.mark.parametrize("causal", [False, True])
def test_lse_gradient_and_plan_reuse(causal):
    """dlse (the gradient of a returned lse) folds into delta; one plan, run on new inputs, writes every
    gradient again."""
    knobs = BwdKnobs()
    q, k, v = make_qkv(2, 6, 3, 777, 1000, 128, torch.bfloat16, "cuda")
    scale = 0.6 / 128 ** 0.5
    plan = None
    for seed in range(2):
        q, k, v = make_qkv(2, 6, 3, 777, 1000, 128, torch.bfloat16, "cuda", seed=seed)
        out, lse = attention_reference(q, k, v, causal, scale)
        out, lse = out.to(q.dtype), lse.float()
        gen = torch.Generator(device="cpu").manual_seed(seed + 7)
        dout = torch.randn(q.shape, generator=gen).to(dtype=q.dtype, device="cuda")
        dlse = torch.randn(lse.shape, generator=gen).to("cuda")
        grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
        if plan is None:
            plan = codegen.load(knobs).backward_plan(q, k, v, out, lse, dout, *grads, scale, causal, dlse)
        plan(q, k, v, out, lse, dout, *grads, dlse)
        refs = attention_backward_reference(q, k, v, dout, causal, scale, dlse=dlse)
        for name, err in zip(("dq", "dk", "dv"), gradient_errors(grads, refs)):
            assert err < GRAD_TOLERANCE[q.dtype], f"seed {seed}: {name} relative error {err:.2e}"


def run_mask_mod(knobs, shape, dtype, name, causal, seed=0):
    """One launch of the Gluon backward with the mask_mod `name` (test_gluon_fwd.mask_mod; knobs None: the family's
    default) from the fp64 reference's out and lse, with random dout and dlse (the returned lse's gradient), into
    NaN-poisoned gradients, against the fp64 reference's (rows and keys the mask leaves alone get exact zeros)."""
    q, k, v = make_qkv(*shape, dtype, "cuda", seed=seed)
    mod = mask_mod(name, max(shape[3:5]))
    problem = Problem.from_tensors(q, k, causal, mask_mod=mod.fingerprint())
    knobs = knobs or default_knobs(problem, current(q.device), "bwd")
    assert violations(knobs, problem, current(q.device)) == [], violations(knobs, problem, current(q.device))
    scale = 0.7 / shape[-1] ** 0.5
    out, lse = attention_reference(q, k, v, causal, scale, mask_mod=mod)
    out, lse = out.to(dtype), lse.float()
    gen = torch.Generator().manual_seed(seed + 100)
    dout = torch.randn(q.shape, generator=gen).to(q)
    dlse = torch.randn(lse.shape, generator=gen).to(lse)
    grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
    variant = checks.variant_args(causal, (-1, -1), shape[3], shape[4], 0.0, None, mod)
    codegen.load(knobs, problem.gates(), mod.rendered).backward(q, k, v, out, lse, dout, *grads, scale, causal, dlse,
                                                                variant=variant)
    expected = attention_backward_reference(q, k, v, dout, causal, scale, dlse, mask_mod=mod)
    for grad_name, error in zip(("dq", "dk", "dv"), gradient_errors(grads, expected)):
        assert error < GRAD_TOLERANCE[dtype], f"{knobs} {shape} {name} causal={causal}: {grad_name} error {error:.2e}"


BWD_MASK_MODS = MASK_MODS + ["heads apart"]


@pytest.mark.parametrize("name", BWD_MASK_MODS)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_mask_mods(name, head_dim, causal):
    """The defaults (32-row steps past head dim 128; groups split under causal masking from 2k queries) with each
    mask, GQA 4:1 at issue 16's lengths and unequal ones, MHA, bf16."""
    for seed, (seqlen_q, seqlen_k) in enumerate([(1, 1), (7, 7), (123, 123), (1000, 1000), (4097, 4097),
                                                 (123, 1000), (1000, 123)]):
        run_mask_mod(None, (2, 8, 2, seqlen_q, seqlen_k, head_dim), torch.bfloat16, name, causal, seed)
    run_mask_mod(None, (1, 4, 4, 1000, 4097, head_dim), torch.bfloat16, name, causal, seed=9)


@pytest.mark.parametrize("knobs, head_dim", [(k, d) for k, d in VARIANTS if not k.split_keys], ids=str)
@pytest.mark.parametrize("name", ["documents", "heads apart"])
def test_mask_mods_on_every_knob(knobs, head_dim, name):
    """Every knob point (step rows 32/64/128, one or two warpgroups, three ring slots, split groups, the dQ
    writer; not split_keys, which refuses mask mods) at the largest head dim it runs, GQA 4:1, fp16, causal and
    not: the document mask (a capture, a 1-token document) and the per-head one (query heads with no listed block;
    keys no row sees)."""
    for causal in (False, True):
        run_mask_mod(knobs, (1, 8, 2, 777, 1234, head_dim), torch.float16, name, causal, seed=int(causal))


@pytest.mark.parametrize("group_splits", [2, 4, 8])
@pytest.mark.parametrize("name", BWD_MASK_MODS)
def test_mask_mods_in_split_groups(group_splits, name):
    """A KV head's 8 query heads over 2, 4 or 8 programs (some with no listed block at all under `heads apart`)."""
    for causal in (False, True):
        run_mask_mod(BwdKnobs(group_splits=group_splits), (1, 16, 2, 1000, 1000, 128), torch.bfloat16, name, causal)

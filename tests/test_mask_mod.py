"""Issue 16's user-written masks (mask_mod) in the `tl` family: checking and rendering a mod, the problem's identity,
the block table against a brute-force one, and the kernels against the fp64 reference forward and backward (a
document mask from a captured tensor, a prefix-LM mask; with and without causal masking, seqlen_q != seqlen_k, GQA,
odd lengths; fp16/fp32 under the interpreter)."""

import pytest
import torch

import autoflash
from autoflash import checks, codegen
from autoflash.families.tl.knobs import FwdKnobs
from autoflash.launch import compile_launch
from autoflash.mask_mod import MaskMod
from autoflash.problem import Problem
from autoflash.resources import launcher
from conftest import DEVICE
from helpers import (MOD_BWD_KNOBS, MOD_FWD_KNOBS, MOD_SHAPES, assert_backward_kernels_match,
                     assert_forward_kernels_match, assert_gradients_match, assert_matches_reference,
                     assert_mods_match_on_the_gpu, make_qkv)


def same_document(b, h, q_idx, kv_idx, document_id):
    return document_id[q_idx] == document_id[kv_idx]


def prefix_lm(b, h, q_idx, kv_idx):
    """The first 16 keys visible to every query, causal after them."""
    return (kv_idx < 16) | (kv_idx <= q_idx)


def documents(*lengths):
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)]).to(DEVICE)


def mods(seqlen):
    """The two masks, for keys and queries of up to `seqlen` positions: documents of 5, 17 and the rest."""
    return [MaskMod(same_document, documents(5, 17, max(seqlen - 22, 1))), MaskMod(prefix_lm)]


# -- checking and rendering --


def test_rendered_source_and_what_it_reads():
    rendered = MaskMod(same_document, documents(3)).rendered
    assert rendered.source == ("@triton.jit\ndef _mask_mod(b, h, q_idx, kv_idx, document_id):\n"
                               "    return _capture(document_id, q_idx) == _capture(document_id, kv_idx)\n")
    assert (rendered.captures, rendered.per_batch, rendered.per_head) == (1, False, False)

    def per_head(b, h, q_idx, kv_idx):
        """(a docstring is not rendered)"""
        near = torch.abs(q_idx - kv_idx) <= h
        return near & ~(b == 1)
    rendered = MaskMod(per_head).rendered
    assert "tl.abs" in rendered.source and '"""' not in rendered.source and (rendered.per_batch, rendered.per_head) \
        == (True, True)


def bad_if(b, h, q_idx, kv_idx):
    if q_idx > kv_idx:
        return True
    return False


def bad_and(b, h, q_idx, kv_idx):
    return (q_idx > 0) and (kv_idx > 0)


def bad_chain(b, h, q_idx, kv_idx):
    return 0 <= kv_idx <= q_idx


def bad_call(b, h, q_idx, kv_idx):
    return torch.sigmoid(q_idx) > kv_idx


def bad_global(b, h, q_idx, kv_idx):
    return kv_idx < WINDOW  # noqa: F821


def bad_index(b, h, q_idx, kv_idx):
    return q_idx[0] > kv_idx


def bad_name(b, h, q_idx, kv_idx):
    _x = q_idx
    return _x > kv_idx


def three(b, h, q_idx):
    return q_idx > 0


@pytest.mark.parametrize("mod, error, message", [
    (bad_if, TypeError, "bad_if: line .* is a If.*control flow"),
    (bad_and, TypeError, "and/or/not"),
    (bad_chain, TypeError, r"chained comparison .* \(a < b\) & \(b < c\)"),
    (bad_call, TypeError, "calls torch.sigmoid"),
    (bad_global, TypeError, "reads 'WINDOW'.*captures"),
    (bad_index, TypeError, "only a capture"),
    (bad_name, TypeError, "rename '_x'"),
    (three, TypeError, "three takes 3 parameters"),
    (lambda b, h, q_idx, kv_idx: q_idx > kv_idx, TypeError, "lambda: write it as a def"),
    (MaskMod(prefix_lm), ValueError, "with window_size .* write the window into the mod"),
])
def test_bad_mods_are_refused_by_name(mod, error, message):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float32, DEVICE)
    window = (4, 4) if isinstance(mod, MaskMod) else (-1, -1)
    with pytest.raises(error, match=message):
        autoflash.attention(q, k, v, mask_mod=mod, window_size=window)


@pytest.mark.parametrize("captures, message", [
    ((), "takes 1 captured tensor.*0 were given"),
    ((torch.zeros(4),), "int32 or int64 tensor, got torch.float32"),
    ((torch.zeros(2, 2, dtype=torch.int32),), "1-D contiguous"),
    ((torch.zeros(8, dtype=torch.int64)[::2],), "1-D contiguous"),
])
def test_bad_captures(captures, message):
    with pytest.raises(TypeError, match=f"mask_mod same_document[: ].*{message}"):
        MaskMod(same_document, *captures)


# -- identity --


def test_identity_is_the_source_and_the_captures_kinds():
    mod = MaskMod(same_document, documents(3, 4))
    assert mod.fingerprint() == MaskMod(same_document, documents(1, 1, 9)).fingerprint()  # data aside
    assert mod.fingerprint() != MaskMod(same_document, documents(7).long()).fingerprint()
    assert mod.fingerprint() != MaskMod(prefix_lm).fingerprint()
    plain = Problem(1, 4, 2, 100, 120, 64, True, "float16")
    problem = plain.with_variants(mask_mod=mod.fingerprint())
    assert problem.key() == plain.key() + f"-mask{mod.fingerprint()}" and problem.gates() == {"MASK_MOD"}
    assert problem.validate() is problem and problem.distance(plain) is None
    assert plain.with_stored_variants(problem.stored_variants()) == problem
    with pytest.raises(ValueError, match="mask_mod"):
        plain.with_variants((8, -1), mask_mod=mod.fingerprint()).validate()
    knobs = FwdKnobs()
    keys = {codegen.kernel_key(knobs), codegen.kernel_key(knobs, frozenset({"MASK_MOD"}), mod.rendered),
            codegen.kernel_key(knobs, frozenset({"MASK_MOD"}), MaskMod(prefix_lm).rendered)}
    assert len(keys) == 3
    with pytest.raises(ValueError, match="rendered with its mask_mod"):
        codegen.render(knobs, variants=frozenset({"MASK_MOD"}))


def test_its_files_count_for_mask_mod_problems_alone():
    plain = {d: codegen.template_fingerprint("tl", d) for d in ("fwd", "bwd")}
    masked = {d: codegen.template_fingerprint("tl", d, frozenset({"MASK_MOD"})) for d in ("fwd", "bwd")}
    assert all(plain[d] != masked[d] for d in plain)
    source = codegen.render(FwdKnobs(), variants=frozenset({"MASK_MOD"}), mask_mod=MaskMod(prefix_lm).rendered)
    assert "_mask_mod_states" in source and "_mask_mod_states" not in codegen.render(FwdKnobs())


# -- the block table --


def brute_force_states(mod, batch, heads, seqlen_q, seqlen_k, block_m, block_n, causal):
    """{0, 1, 2} per (b, h, query block, key block) from the full mask: no pair, some, every pair of the whole tile."""
    mask = mod.mask(batch, heads, seqlen_q, seqlen_k, DEVICE)
    if causal:
        mask = mask & torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=DEVICE).tril(seqlen_k - seqlen_q)
    rows, cols = -(-seqlen_q // block_m), -(-seqlen_k // block_n)
    padded = torch.zeros(batch, heads, rows * block_m, cols * block_n, dtype=torch.bool, device=DEVICE)
    padded[:, :, :seqlen_q, :seqlen_k] = mask
    seen = padded.unflatten(2, (rows, block_m)).unflatten(4, (cols, block_n)).sum((3, 5))
    return torch.where(seen == 0, 0, torch.where(seen == block_m * block_n, 2, 1)).to(torch.int8)


@pytest.mark.parametrize("causal", [False, True])
def test_block_table_counts_the_blocks(causal):
    """Every tile's state as the brute force over the full mask gives it; the lists hold those blocks, in order."""
    def per_head(b, h, q_idx, kv_idx, document_id):
        return (document_id[q_idx] == document_id[kv_idx]) | (h == 1)
    batch, heads, seqlen_q, seqlen_k = 2, 3, 123, 77
    mod = MaskMod(per_head, documents(5, 17, 101))
    q, k, _ = make_qkv(batch, heads, heads, seqlen_q, seqlen_k, 16, torch.float16, DEVICE)
    kernels = codegen.load(FwdKnobs(block_m=16, block_n=32), frozenset({"MASK_MOD"}), mod.rendered).kernels
    variant = checks.variant_args(causal, (-1, -1), seqlen_q, seqlen_k, 0.0, None, mod)
    tables = launcher("tl", "mask_mod")._Tables(kernels, variant, q, k, causal, [("Mask_rows", 16, 32)],
                                                compile_launch)
    states = tables.evaluated(0, mod.captures)
    expected = brute_force_states(mod, 1, heads, seqlen_q, seqlen_k, 16, 32, causal)
    assert states.shape == (1, heads, 8, 3) and torch.equal(states, expected)
    assert (expected == 0).any() and (expected == 2).any() and (expected == 1).any()  # all three kinds occur
    (rows,) = tables.of(mod.captures)
    for state, half in ((1, rows[..., :4]), (2, rows[..., 4:])):
        count = (expected == state).sum(-1)
        assert torch.equal(half[..., 0], count.int())
        listed = [half[0, h, r, 1:1 + count[0, h, r]].tolist() for h in range(heads) for r in range(8)]
        assert listed == [torch.nonzero(expected[0, h, r] == state).flatten().tolist()
                          for h in range(heads) for r in range(8)]


def test_masked_blocks_are_skipped():
    """Keys in blocks the mod masks whole hold NaN: a kernel that loaded them would spread it (0 * NaN); their dK,
    dV are 0. (The tiles are 32 keys and 32 queries, the defaults here: keys 32..95 are two whole blocks.)"""
    def two_ends(b, h, q_idx, kv_idx):
        return (kv_idx < 32) | (kv_idx >= 96)
    q, k, v = make_qkv(1, 2, 1, 40, 128, 32, torch.float32, DEVICE, seed=7)
    assert all('"block_m": 32, "block_n": 32' in line for line in autoflash.explain(q, k, v).splitlines()
               if "knobs" in line), "the test's blocks are not the defaults' tiles"
    clean = [t.clone() for t in (k, v)]
    k[:, :, 32:96], v[:, :, 32:96] = float("nan"), float("nan")
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = autoflash.attention(q, k, v, mask_mod=two_ends)
    out.backward(torch.ones_like(out))
    assert_matches_reference(out.detach(), None, q.detach(), *clean, False, mask_mod=two_ends)
    assert not q.grad.isnan().any() and (k.grad[:, :, 32:96] == 0).all() and (v.grad[:, :, 32:96] == 0).all()


def test_new_captures_get_new_tables():
    """A capture changed in place, or another tensor, is read at the next call (not the first call's table)."""
    q, k, v = make_qkv(1, 2, 2, 30, 30, 16, torch.float32, DEVICE, seed=5)
    document_id = documents(10, 20)
    for change in (lambda d: d, lambda d: d.fill_(0), lambda d: documents(25, 5)):
        document_id = change(document_id)
        mod = MaskMod(same_document, document_id)
        out, lse = autoflash.attention(q, k, v, mask_mod=mod, return_lse=True)
        assert_matches_reference(out, lse, q, k, v, False, mask_mod=mod)


# -- the kernels --

def _run(knobs, shape, dtype, mod, causal, seed):
    q, k, v = make_qkv(*shape, dtype, DEVICE, seed=seed)
    problem = Problem.from_tensors(q, k, causal, mask_mod=mod.fingerprint())
    variant = checks.variant_args(problem.causal, problem.window, shape[3], shape[4], 0.0, None, mod)
    return q, k, v, codegen.load(knobs, problem.gates(), mod.rendered), variant


@pytest.mark.parametrize("knobs", MOD_FWD_KNOBS, ids=str)
def test_forward_matches_reference(knobs):
    """Each mod, causal and not, on each knob set, the shapes in turn."""
    for n, (mod_index, causal) in enumerate([(0, False), (1, True), (0, True), (1, False)]):
        shape = MOD_SHAPES[(n + MOD_FWD_KNOBS.index(knobs)) % len(MOD_SHAPES)]
        mod = mods(max(shape[3:5]))[mod_index]
        q, k, v, kernels, variant = _run(knobs, shape, torch.float16, mod, causal, seed=n)
        assert_forward_kernels_match(kernels, variant, q, k, v, causal, 0.7 / shape[-1] ** 0.5, mask_mod=mod)


@pytest.mark.parametrize("knobs", MOD_BWD_KNOBS, ids=str)
def test_backward_matches_reference(knobs):
    for n, (mod_index, causal) in enumerate([(0, True), (1, False), (1, True)]):
        shape = MOD_SHAPES[(n + MOD_BWD_KNOBS.index(knobs)) % len(MOD_SHAPES)]
        mod = mods(max(shape[3:5]))[mod_index]
        q, k, v, kernels, variant = _run(knobs, shape, torch.float32 if n % 2 else torch.float16, mod, causal, seed=n)
        assert_backward_kernels_match(kernels, variant, q, k, v, causal, n, mask_mod=mod)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_gradients(causal):
    """Through autoflash.attention (autograd, with lse's gradient), both mods: GQA, odd lengths."""
    for mod in mods(50):
        q, k, v = make_qkv(2, 4, 2, 33, 50, 24, torch.float32, DEVICE, seed=3)
        assert_gradients_match(q, k, v, causal, with_lse=True, mask_mod=mod)


def test_bfloat16_under_the_interpreter_carries_the_mod():
    q, k, v = make_qkv(1, 2, 1, 20, 30, 16, torch.bfloat16, DEVICE, seed=4)
    assert_gradients_match(q, k, v, False, mask_mod=mods(30)[0], softcap=3.0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_mask_mods_on_the_gpu(causal, dtype):
    assert_mods_match_on_the_gpu(causal, dtype, "mask_mod", lambda shape: mods(max(shape[3:5])))

"""Issue 16's user-written score transforms (score_mod) in the `tl` family: checking, rendering and differentiating a
mod, the problem's identity, and the kernels against the fp64 reference (autograd through the mod for the
gradients), forward and backward: a softcap written as a mod (against the fixed softcap too), ALiBi from a captured
float slope per head (against the fixed ALiBi too), a relative-position bias, a torch.where mod with causal masking
and with a document mask_mod; GQA, lengths 1, 7, 123; fp16/fp32 under the interpreter."""

import types

import pytest
import torch

import autoflash
from autoflash import checks, codegen
from autoflash.families.tl.knobs import FwdKnobs
from autoflash.mask_mod import MaskMod
from autoflash.problem import Problem
from autoflash.reference import attention_backward_reference
from autoflash.score_mod import ScoreMod
from conftest import DEVICE
from helpers import (MOD_BWD_KNOBS, MOD_FWD_KNOBS, MOD_SHAPES, assert_backward_kernels_match,
                     assert_forward_kernels_match, assert_gradients_match, assert_matches_reference,
                     assert_mods_match_on_the_gpu, make_qkv)


def softcap(score, b, h, q_idx, kv_idx):
    return 3.0 * torch.tanh(score / 3.0)


def alibi(score, b, h, q_idx, kv_idx, slope):
    return score - slope[h] * torch.abs(q_idx - kv_idx)


def relative(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.01


def halved_ahead(score, b, h, q_idx, kv_idx):
    """Keys ahead of the query: half the score, less a sigmoid of it; the rest as they are, floored at -2."""
    ahead = kv_idx > q_idx
    return torch.where(ahead, score * 0.5 - torch.sigmoid(score), torch.where(score < -2.0, -2.0, score))


def same_document(b, h, q_idx, kv_idx, document_id):
    return document_id[q_idx] == document_id[kv_idx]


def slopes(heads):
    return torch.tensor([2.0 ** -(i + 1) for i in range(heads)], dtype=torch.float32, device=DEVICE)


def documents(*lengths):
    return torch.cat([torch.full((n,), i, dtype=torch.int32) for i, n in enumerate(lengths)]).to(DEVICE)


# -- checking, rendering, the derivative --


def test_rendered_mod_and_derivative():
    rendered = ScoreMod(softcap).rendered
    assert rendered.source.startswith("@triton.jit\ndef _score_mod(score, b, h, q_idx, kv_idx):\n    return 3.0 * "
                                      "(2.0 * tl.sigmoid(2.0 * (score / 3.0)) - 1.0)\n")
    assert "def _score_mod_grad(" in rendered.source and not rendered.unit_grad
    assert (rendered.captures, rendered.per_batch, rendered.per_head) == (0, False, False)
    bias = ScoreMod(alibi, slopes(2)).rendered  # d/d score of a bias is 1: no derivative to render, none to apply
    assert bias.unit_grad and "_score_mod_grad" not in bias.source and bias.per_head and bias.captures == 1
    assert "tl.where(ahead" in ScoreMod(halved_ahead).rendered.source


def chained(score, b, h, q_idx, kv_idx, scale):
    x = score * scale[h]
    x = x * x / 8.0 - x
    score = score + 0.5 * x
    y = torch.exp(x / 4.0) - torch.abs(score)
    return torch.log(torch.sigmoid(y) + 1.0) / (1.0 + torch.minimum(x, y) * 0.1) - -x


def flat(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx == kv_idx, 2.0, 1.0)  # (its derivative: a tensor of zeros)


def capped(score, b, h, q_idx, kv_idx, scale):
    return scale[1] * torch.tanh(score / scale[1])  # (a capture read inside tanh: its rendering once raised)


@pytest.mark.parametrize("mod", [softcap, halved_ahead, chained, flat, capped], ids=lambda mod: mod.__name__)
def test_derivative_matches_autograd(mod):
    """The rendered derivative, run by torch (tl's functions as torch's), against autograd of the mod."""
    captures = (torch.tensor([0.5, 2.0]),) if mod in (chained, capped) else ()
    grad = _as_torch(ScoreMod(mod, *captures).rendered.source, "_score_mod_grad")
    score = torch.linspace(-4, 4, 40, dtype=torch.float64).view(1, 1, 5, 8).expand(1, 2, 5, 8).clone()
    score.requires_grad_()
    b, h, q, k = (torch.arange(n).view([-1 if d == i else 1 for d in range(4)]) for i, n in enumerate((1, 2, 5, 8)))
    value = mod(score, b, h, q, k, *captures)
    expected = torch.autograd.grad(value.sum(), score)[0] if value.requires_grad else torch.zeros_like(score)
    got = grad(score.detach(), b, h, q, k, *captures)
    torch.testing.assert_close(torch.as_tensor(got, dtype=torch.float64).expand_as(score), expected)


def _as_torch(source: str, name: str):
    """A rendered function as torch runs it: tl.f -> torch.f, _capture(c, i) -> c[i]."""
    tl = types.SimpleNamespace(**{f: getattr(torch, f) for f in ("where", "minimum", "maximum", "abs", "exp", "log",
                                                                 "sigmoid", "float32")},
                               full=lambda shape, value, dtype: torch.full(shape, value, dtype=torch.float64))
    namespace = {"tl": tl, "triton": types.SimpleNamespace(jit=lambda fn: fn), "_capture": lambda c, i: c[i]}
    exec(source, namespace)
    return namespace[name]


def floor_div(score, b, h, q_idx, kv_idx):
    return score // 2.0


def bit_and(score, b, h, q_idx, kv_idx):
    return score + (score & 1)


def indexed_by_score(score, b, h, q_idx, kv_idx, table):
    return score + table[score]


def no_score(b, h, q_idx, kv_idx):
    return q_idx


def branchy(score, b, h, q_idx, kv_idx):
    if q_idx > kv_idx:
        return score
    return -score


def sine(score, b, h, q_idx, kv_idx):
    return torch.sin(score)


@pytest.mark.parametrize("mod, captures, message", [
    (floor_div, (), "score_mod floor_div, line .*: FloorDiv .*depends on the score and has no derivative"),
    (bit_and, (), "score_mod bit_and, line .*: BitAnd"),
    (indexed_by_score, (torch.zeros(4),), "score_mod indexed_by_score, line .*: a capture's index"),
    (no_score, (), "score_mod no_score takes 4 parameters; it takes \\(score, b, h, q_idx, kv_idx\\)"),
    (branchy, (), "score_mod branchy: line .* is a If.*control flow"),
    (sine, (), "score_mod sine, line .*: calls torch.sin; a score_mod calls only torch.where"),
    (alibi, (torch.zeros(2, dtype=torch.float64),), "score_mod alibi: capture 0 must be a 1-D contiguous int32, "
                                                    "int64 or float32 tensor, got torch.float64.*to.torch.float32"),
    (alibi, (), "score_mod alibi takes 1 captured tensor.*0 were given: ScoreMod\\(alibi"),
])
def test_bad_mods_are_refused_by_name(mod, captures, message):
    with pytest.raises(TypeError, match=message):
        ScoreMod(mod, *captures)


def test_refused_at_the_call():
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float32, DEVICE)
    with pytest.raises(TypeError, match="score_mod floor_div"):
        autoflash.attention(q, k, v, score_mod=floor_div)
    with pytest.raises(ValueError, match="score_mod alibi: capture 0 is on meta"):
        autoflash.attention(q, k, v, score_mod=ScoreMod(alibi, torch.zeros(2, device="meta")))


# -- identity --


def test_identity_is_the_source_and_the_captures_kinds():
    mod = ScoreMod(alibi, slopes(4))
    assert mod.fingerprint() == ScoreMod(alibi, slopes(8)).fingerprint()  # data aside
    assert mod.fingerprint() != ScoreMod(alibi, slopes(4).int()).fingerprint()
    assert mod.fingerprint() != ScoreMod(relative).fingerprint()
    plain = Problem(1, 4, 2, 100, 120, 64, True, "float16")
    problem = plain.with_variants(score_mod=mod.fingerprint())
    assert problem.key() == plain.key() + f"-score{mod.fingerprint()}" and problem.gates() == {"SCORE_MOD"}
    assert problem.validate() is problem and problem.distance(plain) is None
    assert plain.with_stored_variants(problem.stored_variants()) == problem
    with pytest.raises(ValueError, match="score_mod"):
        Problem(1, 4, 2, 100, 120, 64, True, "float16", score_mod="x").validate()
    knobs = FwdKnobs()
    keys = {codegen.kernel_key(knobs), codegen.kernel_key(knobs, frozenset({"SCORE_MOD"}), score_mod=mod.rendered),
            codegen.kernel_key(knobs, frozenset({"SCORE_MOD"}), score_mod=ScoreMod(relative).rendered)}
    assert len(keys) == 3
    with pytest.raises(ValueError, match="rendered with its score_mod"):
        codegen.render(knobs, variants=frozenset({"SCORE_MOD"}))
    for direction in ("fwd", "bwd"):
        assert codegen.template_fingerprint("tl", direction) != \
            codegen.template_fingerprint("tl", direction, frozenset({"SCORE_MOD"}))


# -- the kernels --

def mods(heads):
    return [ScoreMod(softcap), ScoreMod(alibi, slopes(heads)), ScoreMod(relative), ScoreMod(halved_ahead)]


def _run(knobs, shape, dtype, mod, causal, seed):
    q, k, v = make_qkv(*shape, dtype, DEVICE, seed=seed)
    problem = Problem.from_tensors(q, k, causal, score_mod=mod.fingerprint())
    variant = checks.variant_args(problem.causal, problem.window, shape[3], shape[4], 0.0, None, score_mod=mod)
    return q, k, v, codegen.load(knobs, problem.gates(), score_mod=mod.rendered), variant


@pytest.mark.parametrize("knobs", MOD_FWD_KNOBS, ids=str)
def test_forward_matches_reference(knobs):
    """Each mod on each knob set (exp2 and exp units, key splits, two column tiles), causal and not."""
    for n in range(4):
        shape = MOD_SHAPES[(n + MOD_FWD_KNOBS.index(knobs)) % len(MOD_SHAPES)]
        mod, causal = mods(shape[1])[n], n % 2 == 1
        q, k, v, kernels, variant = _run(knobs, shape, torch.float16, mod, causal, seed=n)
        assert_forward_kernels_match(kernels, variant, q, k, v, causal, 0.7 / shape[-1] ** 0.5, score_mod=mod)


@pytest.mark.parametrize("knobs", MOD_BWD_KNOBS, ids=str)
def test_backward_matches_reference(knobs):
    for n in range(4):
        shape = MOD_SHAPES[(n + MOD_BWD_KNOBS.index(knobs)) % len(MOD_SHAPES)]
        mod, causal = mods(shape[1])[n], n in (0, 3)
        q, k, v, kernels, variant = _run(knobs, shape, torch.float32 if n % 2 else torch.float16, mod, causal, seed=n)
        assert_backward_kernels_match(kernels, variant, q, k, v, causal, n, score_mod=mod)


def test_softcap_and_alibi_as_mods_match_the_fixed_variants():
    """Through autoflash.attention: the mods' output and gradients are the fixed variants' (seqlen_q = seqlen_k, so
    |q_idx - kv_idx| is ALiBi's distance from the diagonal)."""
    q, k, v = make_qkv(1, 4, 2, 21, 21, 16, torch.float32, DEVICE, seed=2)
    for mod, fixed in ((ScoreMod(softcap), dict(softcap=3.0)), (ScoreMod(alibi, slopes(4)),
                                                                dict(alibi_slopes=slopes(4)))):
        grads = assert_gradients_match(q, k, v, True, score_mod=mod)
        out, lse = autoflash.attention(q, k, v, causal=True, score_mod=mod, return_lse=True)
        assert_matches_reference(out, lse, q, k, v, True, **fixed)
        for got, expected in zip(grads, attention_backward_reference(q, k, v, torch.randn(
                q.shape, generator=torch.Generator().manual_seed(1)).to(q), True, **fixed)):  # (helpers' dout)
            torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True])
def test_with_a_mask_mod(causal):
    """A score_mod with captures beside a mask_mod with its own: both tensors reach their functions."""
    q, k, v = make_qkv(1, 4, 2, 50, 50, 16, torch.float32, DEVICE, seed=3)
    score_mod, mask_mod = ScoreMod(alibi, slopes(4)), MaskMod(same_document, documents(5, 17, 28))
    out, lse = autoflash.attention(q, k, v, causal=causal, score_mod=score_mod, mask_mod=mask_mod, return_lse=True)
    assert_matches_reference(out, lse, q, k, v, causal, score_mod=score_mod, mask_mod=mask_mod)
    assert_gradients_match(q, k, v, causal, with_lse=True, score_mod=ScoreMod(halved_ahead), mask_mod=mask_mod)


def every_third_row_unseen(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx % 3 == 0, torch.log(score * 0.0), score)  # (log 0: -inf)


@pytest.mark.filterwarnings("ignore:divide by zero")
def test_rows_the_mod_leaves_no_key():
    """Rows whose every score the mod makes -inf, in blocks no mask touches: output 0, lse -inf, no NaN."""
    q, k, v = make_qkv(1, 2, 1, 40, 64, 16, torch.float32, DEVICE, seed=5)
    out, lse = autoflash.attention(q, k, v, score_mod=every_third_row_unseen, return_lse=True)
    assert (lse[:, :, ::3] == float("-inf")).all() and (out[:, :, ::3] == 0).all()
    assert_matches_reference(out, lse, q, k, v, False, score_mod=every_third_row_unseen)


def test_with_the_fixed_variants_and_bfloat16():
    """After softcap and ALiBi, inside a window; bfloat16 runs in float32 under the interpreter, the mod carried."""
    q, k, v = make_qkv(1, 2, 1, 30, 40, 16, torch.bfloat16, DEVICE, seed=4)
    assert_gradients_match(q, k, v, False, score_mod=relative, softcap=3.0, alibi_slopes=slopes(2),
                           window_size=(9, 4))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True])
def test_score_mods_on_the_gpu(causal, dtype):
    assert_mods_match_on_the_gpu(causal, dtype, "score_mod", lambda shape: mods(shape[1]))

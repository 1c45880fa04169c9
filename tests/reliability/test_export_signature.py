"""An exported package's `attention` is called and checked as autoflash.attention is: return_lse, out= and
deterministic work (the deterministic backward is exported beside the tuned one), and bad arguments get the same
one-line errors. Run in-process under the interpreter; tests/test_export.py runs a package without autoflash."""

import importlib
import inspect
import sys

import pytest
import torch
from click.testing import CliRunner

import autoflash
from autoflash import codegen
from autoflash.cli import main
from autoflash.db.store import Store
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.gpu import INTERPRETER
from autoflash.problem import Problem
from conftest import DEVICE
from helpers import assert_gradients_match, assert_matches_reference, make_qkv, poisoned_outputs

PROBLEM = Problem(1, 2, 1, 40, 33, 32, True, "float16")
FWD = FwdKnobs(block_m=32, block_n=16, num_warps=2, num_stages=2, exp="exp")
ATOMIC_BWD = BwdKnobs(block_m=16, block_n=32, num_warps=2, dq="atomic", causal_split=False)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A package exported from a database where PROBLEM's fastest backward adds dQ with atomics."""
    folder = tmp_path_factory.mktemp("export")
    store = Store(folder / "tuned.db")
    for knobs in (FWD, ATOMIC_BWD):
        store.record_trial(INTERPRETER, PROBLEM, knobs.to_json(), codegen.template_fingerprint("tl", knobs.DIRECTION),
                           "ok", 1.0, direction=knobs.DIRECTION)
    store.close()
    shapes = folder / "shapes.yaml"
    shapes.write_text("problems:\n  - {batch: 1, heads_q: 2, heads_kv: 1, seqlen_q: 40, seqlen_k: 33, head_dim: 32,"
                      " causal: true}\n")
    result = CliRunner().invoke(main, ["export", "--gpu", "interpreter", "--db", str(folder / "tuned.db"),
                                       "--shapes", str(shapes), "--out", str(folder / "edges_export")])
    assert result.exit_code == 0, result.output
    sys.path.insert(0, str(folder))
    yield importlib.import_module("edges_export")
    sys.path.remove(str(folder))


def inputs(seed=0, transposed=False):
    return make_qkv(1, 2, 1, 40, 33, 32, torch.float16, DEVICE, transposed=transposed, seed=seed)


def test_the_signature_is_autoflash_attentions(exported):
    assert inspect.signature(exported.attention) == inspect.signature(autoflash.attention)


def test_the_deterministic_backward_is_exported(exported):
    [variants] = exported.PROBLEMS.values()
    assert variants["bwd"][2]["dq"] == "atomic" and variants["bwd_deterministic"][2]["dq"] == "separate"


@pytest.mark.parametrize("transposed", [False, True], ids=["bhsd", "bshd"])
def test_out_and_lse(exported, transposed):
    q, k, v = inputs(transposed=transposed)
    out, _ = poisoned_outputs(q)
    given = out.transpose(1, 2).contiguous().transpose(1, 2) if transposed else out
    result, lse = exported.attention(q, k, v, causal=True, return_lse=True, out=given)
    assert result is given and lse.shape == q.shape[:3] and lse.dtype == torch.float32
    assert_matches_reference(result, lse, q, k, v, True)
    assert exported.attention(q, k, v, causal=True, out=given) is given


@pytest.mark.parametrize("deterministic", [False, True])
def test_gradients_through_out_and_lse(exported, deterministic):
    q, k, v = inputs(seed=1)
    first = assert_gradients_match(q, k, v, True, 0.3, with_lse=True, deterministic=deterministic,
                                   attention=exported.attention)
    if deterministic:
        again = assert_gradients_match(q, k, v, True, 0.3, with_lse=True, deterministic=True,
                                       attention=exported.attention)
        assert all(torch.equal(a, b) for a, b in zip(first, again)), "deterministic gradients are bitwise the same"


BAD_CALLS = {  # name -> (q, k, v, out) -> keyword arguments of a call that must be refused
    "out is q": lambda q, k, v, out: dict(out=q),
    "out expanded": lambda q, k, v, out: dict(out=out[:, :1].expand_as(out)),
    "out shaped wrong": lambda q, k, v, out: dict(out=out[:, :, :-1]),
    "out of another dtype": lambda q, k, v, out: dict(out=out.float()),
    "out requires grad": lambda q, k, v, out: dict(out=out.clone().requires_grad_()),
    "out not a tensor": lambda q, k, v, out: dict(out=[1.0]),
    "return_lse 1": lambda q, k, v, out: dict(return_lse=1),
    "deterministic 'yes'": lambda q, k, v, out: dict(deterministic="yes"),
    "causal None": lambda q, k, v, out: dict(causal=None),
    "scale nan": lambda q, k, v, out: dict(softmax_scale=float("nan")),
    "scale a string": lambda q, k, v, out: dict(softmax_scale="0.1"),
    "k of fp32": lambda q, k, v, out: dict(k=k.float()),
    "v 3-D": lambda q, k, v, out: dict(v=v[0]),
    "no keys": lambda q, k, v, out: dict(k=k[:, :, :0], v=v[:, :, :0]),
}


@pytest.mark.parametrize("bad", BAD_CALLS)
def test_bad_arguments_get_autoflash_attentions_errors(exported, bad):
    q, k, v = inputs()
    arguments = dict(q=q, k=k, v=v, causal=True) | BAD_CALLS[bad](q, k, v, torch.empty_like(q))
    errors = []
    for attention in (autoflash.attention, exported.attention):
        with pytest.raises((ValueError, TypeError, RuntimeError)) as refused:
            attention(**arguments)
        errors.append((type(refused.value), str(refused.value)))
    assert errors[0] == errors[1] and "\n" not in errors[0][1], errors


@pytest.mark.parametrize("kind", ["mask_mod", "score_mod"])
def test_a_mod_the_export_lacks_is_refused_by_name(exported, kind):
    """This export holds no mods: a mod is refused, named, rather than ignored (a plain function, which the
    package cannot fingerprint without autoflash, by what to pass instead; autoflash's mod by its fingerprint)."""
    def below_diagonal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def halved(score, b, h, q_idx, kv_idx):
        return score * 0.5

    q, k, v = inputs()
    fn = {"mask_mod": below_diagonal, "score_mod": halved}[kind]
    wrapper = {"mask_mod": autoflash.MaskMod, "score_mod": autoflash.ScoreMod}[kind]
    with pytest.raises(TypeError, match=f"{kind} must be this package's {wrapper.__name__}\\(name"):
        exported.attention(q, k, v, causal=True, **{kind: fn})
    with pytest.raises(ValueError, match=rf"\(fingerprint {wrapper(fn).fingerprint()}\) is not in this export"):
        exported.attention(q, k, v, causal=True, **{kind: wrapper(fn)})

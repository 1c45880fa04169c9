"""Issue 16's fixed variants (sliding window, softcap, ALiBi) in the `tl` family: the problem's identity, the
templates' gates (plain problems render today's source), and the kernels against the fp64 reference, forward and
backward, on odd sizes with poisoned outputs (fp16/fp32 under the interpreter; the `gpu` tests at real sizes)."""

import itertools
import os
import random
import re
from pathlib import Path

import jinja2
import pytest
import torch

import autoflash
from autoflash import checks, codegen, families
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.gpu import current
from autoflash.problem import VARIANTS, Problem
from autoflash.reference import (GRAD_TOLERANCE, attention_backward_reference, attention_reference, gradient_errors,
                                relative_error)
from autoflash.resources import data_dir
from conftest import DEVICE
from helpers import assert_gradients_match, assert_matches_reference, make_qkv, poisoned_outputs

PLAIN = Problem(2, 8, 2, 1000, 1000, 128, True, "bfloat16")
FIXED = ("WINDOW", "SOFTCAP", "ALIBI")  # this file's variants (of problem.VARIANTS)


# -- the problem --


def test_plain_keys_do_not_change():
    """The shipped database is keyed by these."""
    assert PLAIN.key() == "b2-hq8-hkv2-sq1000-sk1000-d128-causal-bfloat16"
    assert PLAIN.with_variants() == PLAIN and PLAIN.gates() == frozenset() and PLAIN.stored_variants() == {}


@pytest.mark.parametrize("causal, window, expected_causal, expected_window", [
    (False, (-1, -1), False, (-1, -1)),
    (False, (-1, 0), True, (-1, -1)),  # a right bound of 0 is causal masking
    (True, (5, 7), True, (5, -1)),  # causal sets right to 0 (flash-attn)
    (False, (999, 998), False, (-1, -1)),  # bounds that reach every key are none
    (False, (998, 997), False, (998, 997)),
    (False, (0, 3), False, (0, 3)),
])
def test_canonical_window(causal, window, expected_causal, expected_window):
    problem = Problem(1, 2, 2, 999, 1000, 64, causal, "float16").with_variants(window)
    assert (problem.causal, problem.window) == (expected_causal, expected_window)
    assert problem.validate() is problem


def test_variant_keys_labels_and_gates():
    problem = PLAIN.with_variants((256, -1), softcap=True, alibi=True)
    assert problem.key() == PLAIN.key() + "-wl256-softcap-alibi"
    assert problem.label().endswith("causal bf16 wl256 softcap alibi")
    assert problem.gates() == frozenset(FIXED)
    full = Problem(1, 2, 2, 100, 100, 64, False, "float16")
    assert full.with_variants((-1, 3)).gates() == {"WINDOW"} and full.with_variants(alibi=True).gates() == {"ALIBI"}
    assert PLAIN.with_variants((-1, 3)).gates() == frozenset()  # causal masking bounds the right side already
    assert problem.stored_variants() == {"window": [256, -1], "softcap": True, "alibi": True}


def test_variants_are_another_kind_for_distance():
    near = Problem(2, 8, 2, 2000, 2000, 128, True, "bfloat16")
    assert PLAIN.distance(near) is not None
    assert PLAIN.with_variants((64, -1)).distance(near.with_variants((64, -1))) is not None
    assert PLAIN.with_variants((64, -1)).distance(near.with_variants((128, -1))) is None
    assert PLAIN.with_variants(softcap=True).distance(near) is None


@pytest.mark.parametrize("causal, window", [(False, (5, 3)), (True, (7, -1)), (False, (-1, 4)), (False, (2, 1)),
                                            (False, (0, 0))])
@pytest.mark.parametrize("seqlen_q, seqlen_k", [(37, 53), (53, 37), (1, 20)])
def test_visible_pairs_count_the_mask(causal, window, seqlen_q, seqlen_k):
    problem = Problem(1, 1, 1, seqlen_q, seqlen_k, 16, causal, "float32").with_variants(window)
    q, k, v = (torch.zeros(1, 1, n, 16) for n in (seqlen_q, seqlen_k, seqlen_k))
    v = torch.ones_like(v)
    _, lse = attention_reference(q, k, v, causal, window_size=window)
    assert problem.visible_pairs() == int(torch.exp(lse).nan_to_num(0).sum().round())  # exp(lse) = keys seen
    assert problem.fwd_flops() == 4.0 * problem.visible_pairs() * 16 or problem.window == (-1, -1)


@pytest.mark.parametrize("bad, message", [
    (dict(window=(-2, 0)), "two integers >= -1"),
    (dict(window=[1, 2]), "two integers >= -1"),
    (dict(window=(5000, -1)), "canonical"),
    (dict(softcap=1), "true or false"),
])
def test_validate_names_the_field(bad, message):
    from dataclasses import replace
    with pytest.raises(ValueError, match=message):
        replace(PLAIN, **bad).validate()


# -- the templates: gates off render today's source --

_TAG = re.compile(r"{%-?\s*(if|else|endif)\b\s*(.*?)\s*-?%}\n?")


def pruned(text: str) -> str:
    """`text` with every variant gate's code taken out, as if all were false: `{% if WINDOW %}...{% endif %}`
    removed, `{% if not WINDOW %}A{% else %}B{% endif %}` kept as A (tags eat their newline, as trim_blocks does)."""
    out, pos, stack = [], 0, []  # per open `if`: None for other tests, [negated, in_else] for a gate

    def keeping():
        return all(gate is None or gate[0] != gate[1] for gate in stack)
    for match in _TAG.finditer(text):
        kind, test = match.groups()
        if keeping():
            out.append(text[pos:match.start()])
        pos = match.end()
        gate = re.fullmatch(r"(not\s+)?(\w+)", test)
        if kind == "if":
            stack.append([bool(gate.group(1)), False] if gate and gate.group(2) in VARIANTS else None)
            if stack[-1] is not None:
                continue
        elif stack[-1] is not None:
            if kind == "else":
                stack[-1][1] = True
            else:
                stack.pop()
            continue
        elif kind == "endif":
            stack.pop()
        if keeping():
            out.append(match.group(0))
    out.append(text[pos:])
    return "".join(out)


def test_gate_tests_are_bare_names():
    """The fingerprint prunes gates by their test: each names one variant, at most negated."""
    for path in data_dir("templates").rglob("*.jinja"):
        for test in re.findall(r"{%-?\s*if\s+(.*?)\s*-?%}", path.read_text()):
            names = set(re.findall(r"\b[A-Z_]+\b", test)) & set(VARIANTS)
            assert not names or re.fullmatch(rf"(not )?({'|'.join(VARIANTS)})", test), f"{path.name}: {test}"


def _sample_knobs(knobs_class, count=50):
    space = knobs_class.search_space()
    points = list(itertools.product(*space.values()))
    sample = random.Random(16).sample(points, min(count, len(points)))
    return [knobs_class(**dict(zip(space, point))) for point in sample]


@pytest.mark.parametrize("family, direction", [(f.name, d) for f in families.FAMILIES.values() for d in f.knobs])
def test_plain_source_is_the_gateless_templates(family, direction, tmp_path, monkeypatch):
    root = data_dir("templates")
    for path in root.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            target = tmp_path / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(pruned(path.read_text()))
    knobs_list = _sample_knobs(families.FAMILIES[family].knobs[direction])
    plain = [codegen.render(knobs) for knobs in knobs_list]
    monkeypatch.setattr(codegen, "_env", jinja2.Environment(
        loader=jinja2.FileSystemLoader(tmp_path), undefined=jinja2.StrictUndefined, trim_blocks=True,
        lstrip_blocks=True, keep_trailing_newline=True))
    assert [codegen.render(knobs) for knobs in knobs_list] == plain
    assert all(not any(name.lower() in source for name in ("window_left", "softcap", "alibi")) for source in plain)


def test_gates_render_their_code_and_keys():
    knobs = FwdKnobs()
    assert codegen.kernel_key(knobs) == codegen.kernel_key(knobs, frozenset())
    sources = {gate: codegen.render(knobs, variants=frozenset({gate})) for gate in FIXED}
    for gate, word in zip(FIXED, ("window_left", "softcap", "Alibi")):
        assert word in sources[gate] and word not in codegen.render(knobs)
    assert len({codegen.kernel_key(knobs, frozenset({gate})) for gate in FIXED} | {codegen.kernel_key(knobs)}) == 4


# -- the kernels --

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim): lengths 1, 7, 123 no block divides, GQA, both ways round
SHAPES = [(1, 2, 1, 1, 7, 16), (2, 4, 2, 45, 61, 32), (1, 1, 1, 123, 77, 40)]
# (causal, window_size, softcap, alibi slopes' shape: "heads" (heads_q,), "batch, heads" (batch, heads_q), or None)
CASES = [
    (False, (5, 3), 0.0, None),
    (True, (9, -1), 0.0, None),  # causal + window
    (False, (12, -1), 0.0, None),  # left only
    (False, (-1, 6), 0.0, None),  # right only
    (False, (2, 1), 0.0, None),  # more queries than keys: rows that see no key
    (False, (-1, -1), 5.0, None),
    (True, (-1, -1), 0.0, "heads"),
    (False, (-1, -1), 0.0, "batch, heads"),
    (True, (16, -1), 3.0, "batch, heads"),  # all three
    (False, (0, 0), 2.0, "heads"),  # the diagonal alone
]


def _slopes(shape_of, q, seed):
    if shape_of is None:
        return None
    gen = torch.Generator().manual_seed(seed)
    shape = q.shape[1:2] if shape_of == "heads" else q.shape[:2]
    return torch.rand(shape, generator=gen).to(q.device)  # ALiBi's slopes lie in (0, 1)


def sampled(cases, knobs_list, knobs):
    """The cases `knobs` runs: every one with AUTOFLASH_TEST_ALL=1; in CI each case on two of the knob sets (the
    interpreter is slow), so that every case and every knob set still runs."""
    if os.environ.get("AUTOFLASH_TEST_ALL", "0") not in ("", "0"):
        return list(enumerate(cases))
    j, n = knobs_list.index(knobs), len(knobs_list)
    return [(i, case) for i, case in enumerate(cases) if j in (i % n, (i + n // 2) % n)]


def run_forward(knobs, shape, dtype, case, seed=0) -> bool:
    causal, window, softcap, alibi = case
    q, k, v = make_qkv(*shape, dtype, DEVICE, seed=seed)
    slopes = _slopes(alibi, q, seed)
    problem = Problem.from_tensors(q, k, causal, window, softcap > 0, slopes is not None)
    if families.violations(knobs, problem, current(q.device)):
        return False
    out, lse = poisoned_outputs(q)
    scale = 0.7 / shape[-1] ** 0.5
    variant = checks.variant_args(problem.causal, problem.window, shape[3], shape[4], softcap, slopes)
    codegen.load(knobs, problem.gates()).forward(q, k, v, out, lse, scale, problem.causal, variant=variant)
    assert_matches_reference(out, lse, q, k, v, causal, scale, window_size=window, softcap=softcap,
                             alibi_slopes=slopes)
    return True


FWD_KNOBS = [
    FwdKnobs(block_m=16, block_n=16, num_warps=2, num_stages=2),
    FwdKnobs(block_m=32, block_n=16, num_warps=2, num_stages=2, causal_split=False),
    FwdKnobs(block_m=16, block_n=32, num_warps=2, num_stages=2, exp="exp", kv_splits=2),
    FwdKnobs(block_m=16, block_n=16, num_warps=2, num_stages=2, pack_gqa=True),
    FwdKnobs(block_m=16, block_n=16, num_warps=2, num_stages=2, loads="tma", kv_splits=2),
    FwdKnobs(block_m=16, block_n=16, num_warps=2, num_stages=2, loads="tma_host", head_dim_split=True),
]


@pytest.mark.parametrize("knobs", FWD_KNOBS, ids=str)
def test_forward_matches_reference(knobs):
    """The cases on each tile layout (sampled: `sampled`), the shapes in turn."""
    ran = [run_forward(knobs, SHAPES[(n + FWD_KNOBS.index(knobs)) % len(SHAPES)], torch.float16, case, seed=i)
           for n, (i, case) in enumerate(sampled(CASES, FWD_KNOBS, knobs))]
    assert any(ran), f"{knobs} ran none of the cases: the test checks nothing"


def test_forward_float32_and_a_long_window():
    run_forward(FwdKnobs(block_m=32, block_n=32, num_warps=4, num_stages=1), (1, 2, 1, 300, 1000, 16),
                torch.float32, (True, (200, -1), 10.0, "heads"))


BWD_KNOBS = [
    BwdKnobs(block_m=16, block_n=32, num_warps=2, num_stages=1),
    BwdKnobs(block_m=32, block_n=16, num_warps=2, num_stages=1, dq="atomic"),
    BwdKnobs(block_m=16, block_n=16, num_warps=2, num_stages=1, causal_split=False),
]


@pytest.mark.parametrize("knobs", BWD_KNOBS, ids=str)
def test_backward_matches_reference(knobs):
    for n, (i, case) in enumerate(sampled(CASES, BWD_KNOBS, knobs)):
        causal, window, softcap, alibi = case
        shape = SHAPES[(n + BWD_KNOBS.index(knobs)) % len(SHAPES)]
        dtype = torch.float32 if i % 2 else torch.float16
        q, k, v = make_qkv(*shape, dtype, DEVICE, seed=i)
        slopes = _slopes(alibi, q, i)
        problem = Problem.from_tensors(q, k, causal, window, softcap > 0, slopes is not None)
        variant = checks.variant_args(problem.causal, problem.window, shape[3], shape[4], softcap, slopes)
        out, lse = attention_reference(q, k, v, causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
        out, lse = out.to(dtype), lse.float()
        dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(i)).to(q)
        grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
        codegen.load(knobs, problem.gates()).backward(q, k, v, out, lse, dout, *grads, shape[-1] ** -0.5,
                                                      problem.causal, variant=variant)
        expected = attention_backward_reference(q, k, v, dout, causal, window_size=window, softcap=softcap,
                                                alibi_slopes=slopes)
        for name, error in zip(("dq", "dk", "dv"), gradient_errors(grads, expected)):
            assert error < GRAD_TOLERANCE[dtype], f"case {case}: {name} error {error:.2e}"


@pytest.mark.parametrize("case", [CASES[1], CASES[3], CASES[8]], ids=str)
def test_attention_gradients(case):
    """Through autoflash.attention (autograd, with lse's gradient): GQA, odd lengths."""
    causal, window, softcap, alibi = case
    q, k, v = make_qkv(2, 4, 2, 33, 50, 24, torch.float32, DEVICE, seed=3)
    assert_gradients_match(q, k, v, causal, with_lse=True, window_size=window, softcap=softcap,
                           alibi_slopes=_slopes(alibi, q, 3))


def test_window_skips_the_blocks_it_masks():
    """Keys no query sees hold NaN: a kernel that loaded their blocks would spread it (0 * NaN); their dK, dV
    are 0 and nothing else changes."""
    q, k, v = make_qkv(1, 2, 1, 16, 256, 32, torch.float32, DEVICE, seed=7)
    k[:, :, :208], v[:, :, :208] = float("nan"), float("nan")  # row i sees keys 240 + i - 16 ... 240 + i
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = autoflash.attention(q, k, v, causal=True, window_size=(16, -1))
    out.backward(torch.ones_like(out))
    clean = [t.detach()[:, :, 208:] for t in (k, v)]
    ref = attention_reference(q.detach(), *(torch.cat([torch.zeros_like(t[:, :, :208]), t], 2) for t in clean),
                              True, window_size=(16, -1))[0]
    assert relative_error(out, ref) < 1e-5
    assert not q.grad.isnan().any() and (k.grad[:, :, :208] == 0).all() and (v.grad[:, :, :208] == 0).all()


def test_rows_that_see_no_key():
    """A window beside every key of some rows (more queries than keys): output 0, lse -inf, gradients 0."""
    q, k, v = make_qkv(1, 2, 2, 40, 10, 16, torch.float32, DEVICE, seed=2)
    out, lse = autoflash.attention(q, k, v, window_size=(3, 2), return_lse=True)
    unseen = torch.isinf(attention_reference(q, k, v, window_size=(3, 2))[1])
    assert unseen.any() and (out[unseen] == 0).all() and (lse[unseen] == float("-inf")).all()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(window_size=(-2, 0)), ValueError, "-1 .unbounded. or a number of keys"),
    (dict(window_size=4), TypeError, "pair of integers"),
    (dict(window_size=(1.5, 0)), TypeError, "pair of integers"),
    (dict(softcap=-1.0), ValueError, "finite and >= 0"),
    (dict(softcap=float("inf")), ValueError, "finite and >= 0"),
    (dict(softcap="30"), TypeError, "must be a number"),
    (dict(alibi_slopes=torch.ones(3)), ValueError, r"shape \(2,\) or \(1, 2\)"),
    (dict(alibi_slopes=torch.ones(2, dtype=torch.float64)), TypeError, "float32"),
    (dict(alibi_slopes=torch.ones(2, 2)[:, 0]), ValueError, "last stride 1"),
    (dict(alibi_slopes=[0.5, 0.25]), TypeError, "torch.Tensor"),
])
def test_bad_variant_arguments(kwargs, error, message):
    q, k, v = make_qkv(1, 2, 2, 8, 8, 16, torch.float32, DEVICE)
    with pytest.raises(error, match=message):
        autoflash.attention(q, k, v, **kwargs)


def test_slopes_have_no_gradient_and_are_data():
    """New slopes (and softcap values) in later calls of one signature are used, not the first call's."""
    q, k, v = make_qkv(1, 2, 1, 20, 30, 16, torch.float32, DEVICE, seed=4)
    for slopes, cap in ((torch.tensor([0.5, 0.25]), 4.0), (torch.tensor([0.1, 0.9]), 2.0)):
        out = autoflash.attention(q, k, v, softcap=cap, alibi_slopes=slopes)
        assert relative_error(out, attention_reference(q, k, v, softcap=cap, alibi_slopes=slopes)[0]) < 1e-5


def test_bfloat16_under_the_interpreter_carries_the_variants():
    q, k, v = make_qkv(1, 2, 1, 20, 30, 16, torch.bfloat16, DEVICE, seed=4)
    slopes = torch.tensor([0.5, 0.25], device=q.device)
    assert_gradients_match(q, k, v, False, window_size=(4, 4), softcap=3.0, alibi_slopes=slopes)


GPU_SHAPES = [(2, 8, 2, 1000, 1000, 128), (1, 4, 4, 4097, 4097, 64), (1, 8, 1, 1, 8000, 128), (3, 2, 1, 257, 1000, 80)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("case", CASES + [(True, (4096, -1), 0.0, None), (True, (-1, -1), 50.0, None)], ids=str)
def test_variants_on_the_gpu(case, dtype):
    causal, window, softcap, alibi = case
    for i, shape in enumerate(GPU_SHAPES):
        q, k, v = make_qkv(*shape, dtype, "cuda", seed=i)
        slopes = _slopes(alibi, q, i)
        out, lse = autoflash.attention(q, k, v, causal=causal, window_size=window, softcap=softcap,
                                       alibi_slopes=slopes, return_lse=True)
        assert_matches_reference(out, lse, q, k, v, causal, window_size=window, softcap=softcap, alibi_slopes=slopes)
        assert_gradients_match(q, k, v, causal, window_size=window, softcap=softcap, alibi_slopes=slopes)


# -- the database --


def test_a_schema_1_database_is_read_and_upgraded_losslessly(tmp_path, monkeypatch):
    """A schema-1 database (before variants: tests/data/h100_schema1.db, six problems of tuning_db/h100.db as it
    shipped then): read as it is (its plain records dispatch), then brought up to date by a store that writes, every
    record kept; a window problem's record then round-trips."""
    import shutil
    import sqlite3

    from autoflash.db import records
    from autoflash.db.store import Store
    from autoflash.dispatch import Dispatcher
    from autoflash.gpu import INTERPRETER, Gpu

    path = tmp_path / "old.db"
    shutil.copyfile(Path(__file__).parent / "data" / "h100_schema1.db", path)
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version FROM autoflash_schema").fetchall() == [(1,)], "not a schema-1 database"
        fingerprints = [f for (f,) in db.execute("SELECT DISTINCT fingerprint FROM autoflash_variants "
                                                 "WHERE direction = 'fwd'")]
    before = records.best_trials(str(path), "h100", "fwd", fingerprints)
    assert before and all(b.problem.gates() == frozenset() for b in before)
    tl_record = next(b for b in before if '"family": "tl"' in b.knobs)
    monkeypatch.setattr(codegen, "current_fingerprints", lambda direction: {"tl": tl_record.fingerprint})
    hopper = Gpu("h100", "NVIDIA H100", (9, 0), 132, 232448, 65536)
    choice = Dispatcher([str(path)]).choice(tl_record.problem, hopper)
    assert choice.tuned is not None and choice.tuned.problem == tl_record.problem and choice.source.endswith("old.db")
    assert sorted(map(str, Store(str(path), readonly=True).best("h100", fingerprints[0]))) == \
        sorted(str(b) for b in before if b.fingerprint == fingerprints[0])  # a read-only store reads it as it is
    store = Store(str(path))  # upgrades
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT version FROM autoflash_schema").fetchall() == [(2,)]
        assert db.execute("SELECT DISTINCT variants FROM autoflash_problems").fetchall() == [("{}",)]
    assert records.best_trials(str(path), "h100", "fwd", fingerprints) == before
    window = Problem(1, 2, 1, 40, 33, 32, True, "float16").with_variants((5, -1), softcap=True)
    store.record_trial(INTERPRETER, window, FwdKnobs().to_json(), "f" * 16, "ok", median_ms=1.0)
    assert [b.problem for b in records.best_trials(str(path), INTERPRETER.family, "fwd", ["f" * 16])] == [window]
    assert [b.problem for b in store.best(INTERPRETER.family, "f" * 16)] == [window]
    assert [p for p, _, _ in store.summary(INTERPRETER.family, "f" * 16)] == [window]
    store.close()


def test_the_tl_and_gluon_families_run_variants():
    from autoflash.families import fa1, gluon
    from autoflash.gpu import Gpu

    hopper = Gpu("h100", "NVIDIA H100", (9, 0), 132, 232448, 65536)
    problem = Problem(1, 8, 8, 1024, 1024, 128, True, "float16").with_variants((256, -1), softcap=True)
    assert not families.violations(FwdKnobs(), problem, hopper)
    why = families.violations(fa1.FwdKnobs(), problem, hopper)
    assert any("SOFTCAP, WINDOW" in reason for reason in why), why
    if gluon.limits.gluon_available():  # and both directions' defaults on Hopper (families.default_order)
        assert not families.violations(gluon.FwdKnobs(), problem, hopper)
        assert not families.violations(gluon.BwdKnobs(), problem, hopper)
        assert families.default_knobs(problem, hopper, "fwd").family == "gluon"
        assert families.default_knobs(problem, hopper, "bwd").family == "gluon"
    assert families.default_knobs(problem, hopper, "fwd", skip=frozenset({"gluon"})).family == "tl"
    # a mask_mod: Gluon both ways (the forward's default from 512 queries); a score_mod: tl's both ways
    mod = Problem(1, 8, 8, 1024, 1024, 128, True, "float16").with_variants(mask_mod="f00d")
    scored = Problem(1, 8, 8, 1024, 1024, 128, True, "float16").with_variants(score_mod="f00d")
    for knobs in (gluon.FwdKnobs(), gluon.BwdKnobs()):
        assert any("SCORE_MOD" in reason for reason in families.violations(knobs, scored, hopper))
    if gluon.limits.gluon_available():
        for direction, knobs in (("fwd", gluon.FwdKnobs()), ("bwd", gluon.BwdKnobs())):
            assert not families.violations(knobs, mod, hopper)
            assert families.default_knobs(mod, hopper, direction).family == "gluon"


def test_explain_names_the_variant_problem():
    q, k, v = make_qkv(1, 2, 1, 20, 30, 16, torch.float32, DEVICE)
    text = autoflash.explain(q, k, v, causal=True, window_size=(8, -1), alibi_slopes=torch.ones(2, device=q.device))
    assert "-causal-float32-wl8-alibi" in text.splitlines()[0]


def test_torch_compile_carries_the_variants():
    """One graph, no break: the custom op takes the window, softcap and slopes (gradients as eager's)."""
    q, k, v = make_qkv(1, 2, 1, 20, 30, 16, torch.float32, DEVICE, seed=6)
    compiled = torch.compile(lambda q, k, v, **kwargs: autoflash.attention(q, k, v, **kwargs), backend="aot_eager",
                             fullgraph=True)
    assert_gradients_match(q, k, v, False, with_lse=True, window_size=(4, 2), softcap=3.0,
                           alibi_slopes=torch.tensor([0.5, 0.25], device=q.device), attention=compiled)


def test_the_variants_launcher_counts_for_its_problems_alone(tmp_path, monkeypatch):
    """templates/common/launch_window_softcap_alibi.py is in the fingerprint of problems using one of its variants,
    not in plain (or packed) problems': their tuned records stay valid when it changes."""
    import shutil

    shutil.copytree(data_dir("templates"), tmp_path, dirs_exist_ok=True)
    monkeypatch.setattr(codegen, "data_dir", lambda name: tmp_path)
    sets = [frozenset(), frozenset({"WINDOW"}), frozenset({"ALIBI"}), frozenset({"VARLEN"})]

    def fingerprints():
        codegen.template_fingerprint.cache_clear()
        return [codegen.template_fingerprint("tl", direction, v) for v in sets for direction in ("fwd", "bwd")]
    try:
        before = fingerprints()
        path = tmp_path / "common" / f"launch_{codegen.FIXED_VARIANTS}.py"
        path.write_text(path.read_text() + "\n# edit\n")
        changed = [b != a for b, a in zip(before, fingerprints())]
        assert changed == [False, False, True, True, True, True, False, False]
    finally:
        codegen.template_fingerprint.cache_clear()

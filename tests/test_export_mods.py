"""Export of mask_mod and score_mod problems (issue 16): the package carries each mod's rendered kernels and launchers
and runs it where autoflash cannot be imported, found by the fingerprint of the mod it is given (this package's
MaskMod/ScoreMod by name, or autoflash's); a mod not exported is refused by its fingerprint, never run as the plain
kernel. Lengths 1, 7 and 123, fp16 and fp32, against an fp64 reference, outputs poisoned."""

import importlib.util
import sys
import textwrap

import pytest
import torch
from click.testing import CliRunner

import autoflash
from autoflash import gpu as gpus
from autoflash.cli import main
from autoflash.dispatch import Dispatcher
from autoflash.export import chosen, export
from autoflash.problem import Problem
from test_export import run_exported

# No database holds a mod problem (they are not tuned): each export reads a missing one, for an untuned GPU family.
pytestmark = pytest.mark.filterwarnings("ignore:autoflash ignores the tuning database", "ignore:autoflash has no tuned")

MODS = textwrap.dedent("""
    import torch

    import autoflash


    def same_document(b, h, q_idx, kv_idx, document_id):
        return document_id[q_idx] == document_id[kv_idx]


    def alibi_like(score, b, h, q_idx, kv_idx, slope):
        return score - slope[h] * torch.abs(q_idx - kv_idx)


    # What an export takes: the captures' dtypes and ranks, not their data.
    DOCUMENTS = autoflash.MaskMod(same_document, torch.zeros(1, dtype=torch.int32))
    SLOPES = autoflash.ScoreMod(alibi_like, torch.zeros(2))
""")

# (batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, dtype): 1, 7 and 123 tokens, GQA, both dtypes.
SHAPES = [(1, 2, 1, 1, 7, 16, False, "float16"), (1, 2, 2, 7, 7, 16, True, "float32"),
          (1, 2, 1, 123, 123, 32, True, "float16")]

# Runs in a fresh interpreter without autoflash: each exported problem against the fp64 reference (out= poisoned,
# lse, gradients), then the refusals. MOD: "mask" or "score".
SCRIPT = textwrap.dedent("""
    import math, sys
    sys.modules["autoflash"] = None  # the export must not need autoflash
    import torch
    sys.path.insert(0, sys.argv[1])
    from exported import MaskMod, ScoreMod, attention, PROBLEMS, MODS

    MOD, SHAPES = sys.argv[2], eval(sys.argv[3])
    assert len(PROBLEMS) == len(SHAPES) and len(MODS) == 1, (PROBLEMS, MODS)
    rel = lambda a, b: ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()
    gen = torch.Generator().manual_seed(3)
    for batch, hq, hkv, sq, sk, d, causal, dtype in SHAPES:
        dtype = getattr(torch, dtype)
        q = torch.randn(batch, hq, sq, d, generator=gen).to(dtype)
        k, v = (torch.randn(batch, hkv, sk, d, generator=gen).to(dtype) for _ in range(2))
        rows, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]  # (FlexAttention's q_idx, kv_idx)
        visible = (j <= rows + (sk - sq)) if causal else torch.ones(sq, sk, dtype=torch.bool)
        if MOD == "mask":
            document_id = torch.cat([torch.zeros(3), torch.ones(2), torch.full((max(sq, sk),), 2.0)]).int()
            mod = MaskMod("same_document", document_id)
            visible = visible & (document_id[rows] == document_id[j])
        else:
            slope = torch.tensor([0.5, 0.125])
            mod = ScoreMod("alibi_like", slope)

        def reference(q, k, v):
            s = q @ k.repeat_interleave(hq // hkv, 1).transpose(-1, -2) / math.sqrt(d)
            if MOD == "score":
                s = s - slope.double()[:, None, None] * (rows - j).abs()
            s = s.masked_fill(~visible, float("-inf"))
            return torch.nan_to_num(torch.softmax(s, -1)) @ v.repeat_interleave(hq // hkv, 1), torch.logsumexp(s, -1)

        q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
        ref, ref_lse = reference(q64, k64, v64)
        kwargs = dict(causal=causal, **{f"{MOD}_mod": mod})
        out = torch.full_like(q, float("nan"))
        got, lse = attention(q, k, v, out=out, return_lse=True, **kwargs)
        assert got is out and rel(out, ref) < 2e-3, (sq, rel(out, ref))
        seen = ref_lse.isfinite()
        assert seen.all() and (lse.double() - ref_lse).abs().max() < 1e-2, (sq, lse, ref_lse)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        dout = torch.randn(q.shape, generator=gen).to(dtype)
        attention(qg, kg, vg, **kwargs).backward(dout)
        ref.backward(dout.double())
        for name, t, t64 in (("dq", qg, q64), ("dk", kg, k64), ("dv", vg, v64)):
            assert rel(t.grad, t64.grad) < 4e-3, (sq, name, rel(t.grad, t64.grad))

    def refused(call, *words):
        try:
            call()
        except (ValueError, TypeError) as e:
            assert all(w in str(e) for w in words), str(e)
        else:
            raise AssertionError(f"not refused: {words}")

    if MOD == "mask":
        other = MaskMod("same_document", document_id.long())  # int64 captures: another fingerprint
        refused(lambda: attention(q, k, v, causal=causal, mask_mod=other), other.fingerprint(),
                "not in this export", "autoflash export --shapes FILE --mask-mod MODULE:NAME")
        refused(lambda: MaskMod("prefix_lm"), "no mask_mod named 'prefix_lm'", "same_document")
    else:
        refused(lambda: attention(q, k, v, causal=causal, score_mod=ScoreMod("alibi_like", slope.double())),
                "not in this export", "--score-mod")
    refused(lambda: attention(q, k, v, causal=causal), "this export covers", "export it")  # never the plain kernel
    print("exported ok")
""")


def shapes_file(tmp_path, shapes=SHAPES):
    path = tmp_path / "shapes.yaml"
    path.write_text("problems:\n" + "".join(
        f"  - {{batch: {b}, heads_q: {hq}, heads_kv: {hkv}, seqlen_q: {sq}, seqlen_k: {sk}, head_dim: {d}, "
        f"causal: {str(c).lower()}, dtype: {t}}}\n" for b, hq, hkv, sq, sk, d, c, t in shapes))
    return path


@pytest.fixture
def mods(tmp_path, monkeypatch):
    """The module of MODS, importable as export_mods_defs from tmp_path (the folder export runs in)."""
    (tmp_path / "export_mods_defs.py").write_text(MODS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("export_mods_defs", None)
    yield importlib.import_module("export_mods_defs")
    sys.modules.pop("export_mods_defs", None)


def run_script(tmp_path, mod: str) -> None:
    run_exported(tmp_path, SCRIPT, mod, repr(SHAPES))


def test_export_of_a_mask_mod(tmp_path, mods):
    """autoflash export --mask-mod: the documents mask, captured int32 ids, in the package; its MaskMod by name gives
    autoflash's fingerprint, and autoflash's MaskMod of another source is refused by its own."""
    result = CliRunner().invoke(main, ["export", "--gpu", "interpreter", "--db", f"sqlite:///{tmp_path / 'none.db'}",
                                       "--shapes", str(shapes_file(tmp_path)), "--mask-mod",
                                       "export_mods_defs:DOCUMENTS", "--out", str(tmp_path / "exported")])
    assert result.exit_code == 0, result.output
    assert f"mask_mod same_document (fingerprint {mods.DOCUMENTS.fingerprint()})" in result.output
    assert "MaskMod('same_document', *captures)" in result.output
    files = {p.name for p in (tmp_path / "exported").iterdir()}
    assert {"launch_tl_mask_mod.py", "launch_tl_variants.py", "_checks.py"} <= files
    run_script(tmp_path, "mask")

    package = _imported(tmp_path / "exported")
    ids = torch.tensor([0, 0, 1], dtype=torch.int32)
    assert package.MaskMod("same_document", ids).fingerprint() == autoflash.MaskMod(mods.same_document, ids) \
        .fingerprint() == mods.DOCUMENTS.fingerprint()

    def same_head(b, h, q_idx, kv_idx):
        return h == 0
    q = torch.zeros(1, 2, 7, 16, dtype=torch.float32)
    fingerprint = autoflash.MaskMod(same_head).fingerprint()
    with pytest.raises(ValueError, match=f"mask_mod same_head \\(fingerprint {fingerprint}\\) is not in this export, "
                                         "whose mask_mods are same_document"):
        package.attention(q, q, q, causal=True, mask_mod=autoflash.MaskMod(same_head))


def test_export_of_a_score_mod(tmp_path, mods):
    """The Python API: export(chosen(problems with the mod's fingerprint), mods=[the ScoreMod]), a slope per head."""
    gpu = gpus.by_family("interpreter")
    problems = [Problem(*shape).with_variants(score_mod=mods.SLOPES.fingerprint()) for shape in SHAPES]
    export(chosen(problems, gpu, Dispatcher([f"sqlite:///{tmp_path / 'none.db'}"])), tmp_path / "exported",
           "interpreter", mods=(mods.SLOPES,))
    assert not (tmp_path / "exported" / "launch_tl_mask_mod.py").exists()
    run_script(tmp_path, "score")


def test_a_mod_problem_needs_its_mod(tmp_path, mods):
    """A problem names its mod by fingerprint: export without the mod, or a window with a mask_mod, is refused."""
    gpu = gpus.by_family("interpreter")
    problem = Problem(*SHAPES[0]).with_variants(mask_mod=mods.DOCUMENTS.fingerprint())
    choices = chosen([problem], gpu, Dispatcher([f"sqlite:///{tmp_path / 'none.db'}"]))
    with pytest.raises(ValueError, match=f"mask_mod of fingerprint {mods.DOCUMENTS.fingerprint()}, and no such mod "
                                         "was given .*--mask-mod MODULE:NAME"):
        export(choices, tmp_path / "exported", "interpreter", mods=(mods.SLOPES,))
    window = tmp_path / "window.yaml"
    window.write_text("problems:\n  - {batch: 1, heads_q: 2, heads_kv: 1, seqlen_q: 64, seqlen_k: 64, head_dim: 16, "
                      "causal: true, window_size: [8, -1]}\n")
    runner = CliRunner()
    for args, words in (([f"--shapes={window}", "--mask-mod=export_mods_defs:DOCUMENTS"], "a mod takes no window"),
                        (["--mask-mod=export_mods_defs:same_document"], "takes 1 captured tensor"),
                        (["--score-mod=export_mods_defs:nothing"], "has no attribute 'nothing'"),
                        (["--mask-mod=export_mods_defs:DOCUMENTS"], "nothing tuned with mask_mod same_document")):
        result = runner.invoke(main, ["export", "--gpu", "interpreter", "--db", f"sqlite:///{tmp_path / 'none.db'}",
                                      "--out", str(tmp_path / "refused"), *args])
        assert result.exit_code != 0 and words in result.output, result.output


def test_gluon_export_carries_the_block_tables(tmp_path, mods):
    """On Hopper a mask_mod runs in the Gluon family both ways: its launcher is exported with the `tl` one whose block
    tables it builds on (rendered, not run: no GPU here)."""
    export_args = ["export", "--gpu", "h100", "--db", f"sqlite:///{tmp_path / 'none.db'}", "--out",
                   str(tmp_path / "exported"), "--mask-mod", "export_mods_defs:DOCUMENTS", "--shapes",
                   str(shapes_file(tmp_path, [(1, 8, 2, 4096, 4096, 128, True, "bfloat16")]))]
    result = CliRunner().invoke(main, export_args)
    assert result.exit_code == 0, result.output
    package = _imported(tmp_path / "exported")
    (variants,) = package.PROBLEMS.values()
    assert variants["fwd"][1] == "gluon" and variants["bwd"][1] == "gluon"
    files = {p.name for p in (tmp_path / "exported").iterdir()}
    assert {"launch_gluon_mask_mod.py", "launch_tl_mask_mod.py", "launch_gluon_variants.py"} <= files
    for direction in ("fwd", "bwd"):
        assert "_mask_mod" in (tmp_path / "exported" / f"{variants[direction][0]}.py").read_text()


def _imported(folder):
    """The package in `folder`, imported under a name of its own."""
    name = f"exported_{abs(hash(str(folder)))}"
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

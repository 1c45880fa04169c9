"""Rendering: deterministic, valid Python for every family's knob combinations, cached under its family's
fingerprint."""

import itertools
import shutil
import subprocess
import sys

import pytest

from autoflash import codegen
from autoflash.families import FAMILIES, fa1
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs


# Knobs the templates only substitute as numbers (tiles, the Gluon warpgroups' registers) or leave to the launch
# (the Gluon forward's programs an SM); every other knob shapes the source.
TILE_NUMBERS = ("block_m", "block_n", "num_warps", "num_stages", "consumer_regs", "producer_regs", "programs_per_sm")


def all_knobs():
    """Every combination of the knobs that shape the source, with the default numbers; then every value of each
    number once (the full product renders for an hour and proves no more)."""
    for cls in (cls for family in FAMILIES.values() for cls in family.knobs.values()):
        space = {name: values for name, values in cls.choices().items() if name not in TILE_NUMBERS}
        for values in itertools.product(*space.values()):
            yield cls(**dict(zip(space, values)))
        for name in TILE_NUMBERS:
            for value in cls.choices().get(name, ()):
                yield cls(**{name: value})


def test_every_combination_renders_valid_python():
    sources = set()
    for knobs in set(all_knobs()):
        source = codegen.render(knobs)
        compile(source, codegen.template_name(knobs), "exec")
        assert knobs.to_json() in source
        sources.add(hash(source))
    assert len(sources) == len(set(all_knobs())), "two knob sets rendered the same source"


def test_rendering_is_deterministic_across_processes():
    knobs = FwdKnobs(block_m=64, exp="exp", loads="tma")
    script = ("from autoflash import codegen; from autoflash.families.tl.knobs import FwdKnobs; import sys; "
              f"sys.stdout.write(codegen.render(FwdKnobs.from_json({knobs.to_json()!r})))")
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert other == codegen.render(knobs)


def test_fingerprint_names_the_template_text(tmp_path, monkeypatch):
    fingerprint, bwd = codegen.template_fingerprint("tl"), codegen.template_fingerprint("tl", "bwd")
    fa1_fingerprint = codegen.template_fingerprint("fa1")
    assert len(fingerprint) == 16 and codegen.template_fingerprint("tl") == fingerprint and bwd != fingerprint
    assert fingerprint in codegen.render(FwdKnobs()) and bwd in codegen.render(BwdKnobs())
    assert codegen.current_fingerprints("fwd") == {"tl": fingerprint, "gluon": codegen.template_fingerprint("gluon"),
                                                   "fa1": fa1_fingerprint}
    gluon = {d: codegen.template_fingerprint("gluon", d) for d in ("fwd", "bwd")}
    assert codegen.current_fingerprints("bwd") == {"tl": bwd, "gluon": gluon["bwd"]}, "families with backward kernels"
    shutil.copytree(codegen.data_dir("templates"), tmp_path, dirs_exist_ok=True)
    monkeypatch.setattr(codegen, "data_dir", lambda name: tmp_path)

    def edit(path, expect_changed):
        (tmp_path / path).write_text((tmp_path / path).read_text() + "\n# edit\n")
        codegen.template_fingerprint.cache_clear()
        now = {(f, d): codegen.template_fingerprint(f, d) for f, d in before}
        changed = {key for key, value in now.items() if value != before[key]}
        assert changed == set(expect_changed), (path, changed)
        before.update(now)

    before = {("tl", "fwd"): fingerprint, ("tl", "bwd"): bwd, ("fa1", "fwd"): fa1_fingerprint,
              ("gluon", "fwd"): gluon["fwd"], ("gluon", "bwd"): gluon["bwd"]}
    try:
        edit("tl/attn_fwd.py.jinja", [("tl", "fwd")])  # the backward's and the other family's records stay valid
        edit("tl/attn_bwd.py.jinja", [("tl", "bwd")])
        edit("tl/launch.py", [("tl", "fwd"), ("tl", "bwd")])  # the launcher serves both directions
        edit("fa1/attn_fwd.py.jinja", [("fa1", "fwd")])
        edit("gluon/launch_bwd.py", [("gluon", "bwd")])  # a direction's own launcher
        edit("gluon/launch.py", [("gluon", "fwd"), ("gluon", "bwd")])
        edit("common/_bounds.py.jinja", list(before))  # shared by all
        # The Gluon family's packed and mask_mod kernels build on tl's tables (launchers the loader hands theirs,
        # a template included): tl's files count for those problems' Gluon fingerprints too, not for plain ones.
        for variant, tl_file in (("VARLEN", "tl/launch_varlen.py"), ("MASK_MOD", "tl/launch_mask_mod.py"),
                                 ("MASK_MOD", "tl/_mask_mod.py.jinja")):
            packed = {d: codegen.template_fingerprint("gluon", d, frozenset({variant})) for d in ("fwd", "bwd")}
            edit(tl_file, [])
            assert all(codegen.template_fingerprint("gluon", d, frozenset({variant})) != packed[d]
                       for d in ("fwd", "bwd") if d == "fwd" or variant == "VARLEN"), tl_file
    finally:
        codegen.template_fingerprint.cache_clear()


def test_variant_gates_leave_other_problems_fingerprints(tmp_path, monkeypatch):
    """Code added under `{% if WINDOW %}` changes the fingerprint of window problems alone; code outside every
    gate changes all of them (design: a plain problem's records survive a variant being added)."""
    shutil.copytree(codegen.data_dir("templates"), tmp_path, dirs_exist_ok=True)
    monkeypatch.setattr(codegen, "data_dir", lambda name: tmp_path)
    template = tmp_path / "tl/attn_fwd.py.jinja"
    plain, window, softcap = frozenset(), frozenset({"WINDOW"}), frozenset({"SOFTCAP"})

    def fingerprints():
        codegen.template_fingerprint.cache_clear()
        return {v: codegen.template_fingerprint("tl", "fwd", v) for v in (plain, window, softcap)}

    def insert(text):  # after the template's first line, which is plain text
        first, rest = template.read_text().split("\n", 1)
        template.write_text(first + "\n" + text + rest)

    try:
        before = fingerprints()
        insert("{% if WINDOW %}\n    lo = hi - WINDOW_LEFT\n{% endif %}\n")
        after = fingerprints()
        assert after[plain] == before[plain] and after[softcap] == before[softcap] and after[window] != before[window]
        insert("    {% if not SOFTCAP %}\nplain_only = 1\n    {% else %}\ncapped = 1\n    {% endif %}\n")
        again = fingerprints()
        assert again[window] != after[window] and again[plain] != after[plain] and again[softcap] != after[softcap]
        insert("# outside every gate\n")
        latest = fingerprints()
        assert all(latest[v] != again[v] for v in again)
        varlen = frozenset({"VARLEN"})
        before_varlen = codegen.template_fingerprint("tl", "fwd", varlen)
        varlen_launcher = tmp_path / "tl/launch_varlen.py"  # a file named for a variant counts for it alone
        varlen_launcher.write_text(varlen_launcher.read_text() + "\n# edit\n")
        assert fingerprints() == latest
        assert codegen.template_fingerprint("tl", "fwd", varlen) != before_varlen
    finally:
        codegen.template_fingerprint.cache_clear()


@pytest.mark.parametrize("text, unused, expect", [
    ("a\n{% if WINDOW %}\nb\n{% endif %}\nc\n", {"WINDOW"}, "a\nc\n"),
    ("a\n{% if WINDOW %}\nb\n{% endif %}\nc\n", set(), "a\n{% if WINDOW %}\nb\n{% endif %}\nc\n"),
    ("a\n  {% if WINDOW %}\nb\n  {% else %}\nd\n  {% endif %}\nc\n", {"WINDOW"}, "a\nd\nc\n"),
    ("a\n{% if not ALIBI %}\nb\n{% else %}\nd\n{% endif %}\nc\n", {"ALIBI"}, "a\nb\nc\n"),
    ("x = s{% if SOFTCAP %} * cap{% endif %} + 1\n", {"SOFTCAP"}, "x = s + 1\n"),
    ("{% if WINDOW %}\n{% if ALIBI %}\nb\n{% endif %}\nw\n{% endif %}\n", {"ALIBI"}, "{% if WINDOW %}\nw\n{% endif %}\n"),
    ("{% if IS_CAUSAL %}\n{% if WINDOW %}\nb\n{% endif %}\nc\n{% endif %}\n", {"WINDOW"},
     "{% if IS_CAUSAL %}\nc\n{% endif %}\n"),
])
def test_ungated_cuts_unused_variants(text, unused, expect):
    assert codegen._ungated(text, frozenset(unused)) == expect


@pytest.mark.parametrize("text, error", [
    ("{% if WINDOW and IS_CAUSAL %}\nb\n{% endif %}\n", "tests one name"),
    ("{% if WINDOW %}\nb\n{% elif IS_CAUSAL %}\nc\n{% endif %}\n", "no elif"),
    ("{% if WINDOW %}\nb\n", "no endif"),
])
def test_ungated_refuses_gates_it_cannot_cut(text, error):
    with pytest.raises(ValueError, match=error):
        codegen._ungated(text, frozenset({"WINDOW"}))


def test_load_writes_once_and_imports_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOFLASH_CACHE_DIR", str(tmp_path))
    knobs = FwdKnobs(block_m=32, block_n=32, num_warps=2, exp="exp")
    monkeypatch.setattr(codegen, "_variants", {})
    variant = codegen.load(knobs)
    assert codegen.load(knobs) is variant
    files = list(tmp_path.glob("attn_*.py"))
    assert [f.name for f in files] == [f"attn_{codegen.kernel_key(knobs)}.py"]
    assert variant.kernels.__file__ == str(files[0]) and files[0].read_text() == codegen.render(knobs)
    assert codegen.kernel_key(fa1.FwdKnobs()) != codegen.kernel_key(knobs)

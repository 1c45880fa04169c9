"""Rendering: deterministic, valid Python for every knob combination, cached under its fingerprint."""

import itertools
import subprocess
import sys

from autoflash import codegen
from autoflash.knobs import KNOBS, BwdKnobs, FwdKnobs


# Knobs the templates only substitute as numbers; every other knob shapes the source.
TILE_NUMBERS = ("block_m", "block_n", "num_warps", "num_stages")


def all_knobs():
    """Every combination of the knobs that shape the source, with the default tile numbers; then every value
    of each tile number once (the full product renders for an hour and proves no more)."""
    for cls in KNOBS.values():
        space = {name: values for name, values in cls.choices().items() if name not in TILE_NUMBERS}
        for values in itertools.product(*space.values()):
            yield cls(**dict(zip(space, values)))
        for name in TILE_NUMBERS:
            for value in cls.choices()[name]:
                yield cls(**{name: value})


def test_every_combination_renders_valid_python():
    sources = set()
    for knobs in set(all_knobs()):
        source = codegen.render(knobs)
        compile(source, knobs.template, "exec")
        assert knobs.to_json() in source
        sources.add(hash(source))
    assert len(sources) == len(set(all_knobs())), "two knob sets rendered the same source"


def test_rendering_is_deterministic_across_processes():
    knobs = FwdKnobs(block_m=64, exp="exp", loads="tma")
    script = ("from autoflash import codegen; from autoflash.knobs import FwdKnobs; import sys; "
              f"sys.stdout.write(codegen.render(FwdKnobs.from_json({knobs.to_json()!r})))")
    other = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert other == codegen.render(knobs)


def test_fingerprint_names_the_template_text(tmp_path, monkeypatch):
    fingerprint, bwd = codegen.template_fingerprint(), codegen.template_fingerprint("bwd")
    assert len(fingerprint) == 16 and codegen.template_fingerprint() == fingerprint and bwd != fingerprint
    assert fingerprint in codegen.render(FwdKnobs()) and bwd in codegen.render(BwdKnobs())
    for path in codegen.data_dir("templates").glob("*.jinja"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "attn_fwd_fa2.py.jinja").write_text((tmp_path / "attn_fwd_fa2.py.jinja").read_text() + "\n# edit\n")
    monkeypatch.setattr(codegen, "data_dir", lambda name: tmp_path)
    codegen.template_fingerprint.cache_clear()
    try:
        assert codegen.template_fingerprint() != fingerprint
        assert codegen.template_fingerprint("bwd") == bwd, "a forward template edit leaves the backward's records valid"
        (tmp_path / "_header.py.jinja").write_text((tmp_path / "_header.py.jinja").read_text() + "\n# edit\n")
        codegen.template_fingerprint.cache_clear()
        assert codegen.template_fingerprint("bwd") != bwd, "the shared header is part of both fingerprints"
    finally:
        codegen.template_fingerprint.cache_clear()


def test_load_writes_once_and_imports_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOFLASH_CACHE_DIR", str(tmp_path))
    knobs = FwdKnobs(block_m=32, block_n=32, num_warps=2, exp="exp")
    monkeypatch.setattr(codegen, "_modules", {})
    module = codegen.load(knobs)
    assert codegen.load(knobs) is module
    files = list(tmp_path.glob("attn_*.py"))
    assert [f.name for f in files] == [f"attn_{codegen.kernel_key(knobs)}.py"]
    assert module.__file__ == str(files[0]) and files[0].read_text() == codegen.render(knobs)

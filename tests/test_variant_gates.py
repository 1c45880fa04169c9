"""With every variant gate off, the tl family's templates render each plain knob point byte for byte as main's
templates did before the VARLEN and PAGED code was added: plain problems keep their kernels, fingerprints and
tuned records (design: variants; codegen.template_fingerprint)."""

import random
import shutil
import subprocess

import jinja2
import pytest

from autoflash import codegen
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.problem import VARIANTS

# The commit the varlen work started from: its templates are the plain source.
BASE = "0e96921"
SAMPLE = 50


def _base_templates(tmp_path):
    root = codegen.data_dir("templates")
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    for relative in ("tl/attn_fwd.py.jinja", "tl/attn_bwd.py.jinja", "common/_bounds.py.jinja",
                     "common/_header.py.jinja"):
        try:
            text = subprocess.run(["git", "show", f"{BASE}:templates/{relative}"], cwd=root.parent, check=True,
                                  capture_output=True, text=True).stdout
        except (subprocess.CalledProcessError, FileNotFoundError):
            pytest.skip("needs the git history of a source checkout")
        (tmp_path / relative).write_text(text)
    return tmp_path


def _sample(cls, seed):
    space = cls.choices()
    rng = random.Random(seed)
    return {cls(**{name: rng.choice(values) for name, values in space.items() if name != "family"})
            for _ in range(SAMPLE)}


@pytest.mark.parametrize("cls", [FwdKnobs, BwdKnobs])
def test_plain_render_is_the_base_commits(cls, tmp_path, monkeypatch):
    base = jinja2.Environment(loader=jinja2.FileSystemLoader(_base_templates(tmp_path)),
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                              keep_trailing_newline=True)
    gates_off = {name: False for name in VARIANTS}
    for knobs in _sample(cls, seed=17):
        now = codegen.render(knobs)
        monkeypatch.setattr(codegen, "_env", base)
        before = codegen.render(knobs)
        monkeypatch.undo()
        assert now == before, knobs
        assert codegen.render(knobs, variants=frozenset()) == codegen.render_template(
            codegen.template_name(knobs), TEMPLATE=codegen.template_name(knobs),
            FINGERPRINT=codegen.template_fingerprint(knobs.family, knobs.DIRECTION), KNOBS_JSON=knobs.to_json(),
            EXTRA_HEADER=(), **gates_off, **knobs.template_context())


@pytest.mark.parametrize("variants", [{"VARLEN"}, {"VARLEN", "PAGED"}])
def test_variant_renders_are_python(variants):
    for knobs in _sample(FwdKnobs, seed=3) | _sample(BwdKnobs, seed=4):
        source = codegen.render(knobs, variants=frozenset(variants))
        compile(source, codegen.template_name(knobs), "exec")
        assert "Cu_seqlens_q" in source

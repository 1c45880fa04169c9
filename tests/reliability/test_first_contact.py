"""What a new user meets first (issue 23, "first contact"): `show` before any tuning shows the shipped database,
`bench --plot` without matplotlib names the extra to install before timing anything, refused `tune` runs create
no database, and TRITON_INTERPRET set after `import autoflash` is one clear error."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from autoflash.cli import main
from autoflash.cli.bench import row_json
from autoflash.dispatch import shipped_urls
from autoflash.problem import Problem

SHAPES = "problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 16, head_dim: 16}\n"


@pytest.fixture
def fresh_install(tmp_path, monkeypatch):
    """No user database: $AUTOFLASH_DB unset, the default file's folder empty."""
    monkeypatch.delenv("AUTOFLASH_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    return tmp_path / "data" / "autoflash" / "tuning.db"


def test_show_on_a_fresh_install_shows_the_shipped_database(fresh_install):
    shipped = shipped_urls()  # tuning_db/h100.db, h200.db
    assert [url.rsplit("/", 1)[-1] for url in shipped] == ["h100.db", "h200.db"]
    result = CliRunner().invoke(main, ["show", "--gpu", "h100"])
    assert result.exit_code == 0, result.output
    first, header, *rest = result.output.splitlines()
    assert first.startswith("no user database yet (autoflash tune writes one at ") and str(fresh_install) in first
    assert header.startswith(f"{shipped[0]}: GPU family h100") and "b32 h32 s512 d64 fp16" in result.output
    assert not any(line.startswith(shipped[1]) for line in rest), "the H200's database holds no h100 trial"
    assert not fresh_install.parent.exists(), "show creates nothing"


def test_show_on_a_fresh_install_names_the_families_it_could_show(fresh_install):
    result = CliRunner().invoke(main, ["show", "--gpu", "a100"])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output.splitlines()[-1] == ("Error: nothing tuned for GPU family 'a100' with the current templates "
                                              "in the shipped databases; they hold trials of h100, h200: pass --gpu "
                                              "h100")


def test_bench_plot_without_matplotlib_names_the_extra_first(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text(SHAPES)
    result = CliRunner().invoke(main, ["bench", "--shapes", str(shapes), "--plot", str(tmp_path / "b.png")])
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert result.output == ("Error: main bench needs matplotlib, which is not installed: "
                             "pip install 'autoflash[plot]'\n")


def test_the_plot_extra_declares_matplotlib():
    import tomllib

    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert any(r.startswith("matplotlib") for r in pyproject["project"]["optional-dependencies"]["plot"])


@pytest.mark.parametrize("args, refusal", [
    (["--interpret", "--gpu", "a100"], "--gpu a100 does not match the GPU here"),
    ([], "no CUDA GPU here: pass --interpret"),
    (["--interpret", "--bf16"], "cannot be tuned in Triton's interpreter"),
    (["--interpret", "--huge"], "for its tensors alone"),
], ids=["another gpu", "no gpu", "bf16 in the interpreter", "larger than memory"])
@pytest.mark.parametrize("named", [True, False], ids=["--db", "default database"])
def test_refused_tune_runs_create_no_database(tmp_path, fresh_install, args, refusal, named):
    shapes = tmp_path / "shapes.yaml"
    dtype = "bfloat16" if "--bf16" in args else "float16"
    seqlen = 10 ** 12 if "--huge" in args else 16
    shapes.write_text(f"problems:\n  - {{batch: 1, heads_q: 2, seqlen_q: {seqlen}, head_dim: 16, dtype: {dtype}}}\n")
    db = tmp_path / "new" / "tuning.db"
    args = [a for a in args if a not in ("--bf16", "--huge")] + (["--db", str(db)] if named else [])
    result = CliRunner().invoke(main, ["tune", "--shapes", str(shapes), *args])
    assert result.exit_code == 1 and refusal in result.output, result.output
    assert not db.parent.exists() and not fresh_install.parent.exists(), "a refused run creates no database"


LATE_INTERPRET = textwrap.dedent("""
    import os, torch
    import autoflash
    os.environ["TRITON_INTERPRET"] = "1"  # too late: triton is imported
    q = torch.randn(1, 2, 16, 32)
    try:
        autoflash.attention(q, q, q)
    except RuntimeError as e:
        print(e)
""")


def test_triton_interpret_set_after_import_is_one_clear_error():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", LATE_INTERPRET], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("TRITON_INTERPRET=1 was set after Triton was imported"), done.stdout
    assert "before any import of autoflash or triton" in done.stdout and done.stdout.count("\n") == 1


def test_bench_rows_of_problems_with_variants_are_json():
    """`bench --out` wrote nothing on a GPU: a problem's variants are a frozenset (empty for plain problems),
    which json refused."""
    problem = Problem(1, 4, 4, 128, 128, 64, True, "float16").with_variants(window_size=(64, 0))
    line = json.loads(row_json({"backend": "autoflash", "ms": 1.0}, problem, {"gpu": "test"}))
    assert line["problem"]["variants"] == [] and line["problem"]["window"] == list(problem.window)
    assert line["backend"] == "autoflash" and line["gpu"] == "test"

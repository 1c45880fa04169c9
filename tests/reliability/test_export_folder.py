"""`autoflash export --out` writes only into a new or empty folder or over an earlier export, unless --force."""

import pytest
from click.testing import CliRunner

from autoflash.cli import main
from autoflash.db.store import Store


@pytest.fixture
def export(tmp_path):
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 40, head_dim: 32}\n")
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    Store(db)  # an empty database: every problem gets its default variant

    def run(out, *extra):
        return CliRunner().invoke(main, ["export", "--gpu", "interpreter", "--shapes", str(shapes),
                                         "--db", db, "--out", str(out), *extra])
    return run


def test_a_new_or_empty_folder_or_an_earlier_export_is_written(export, tmp_path):
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "new", tmp_path / "empty", tmp_path / "new"):  # the last: over the earlier export
        result = export(out)
        assert result.exit_code == 0, result.output
        assert (out / "__init__.py").read_text().startswith("# Exported by autoflash")


@pytest.mark.parametrize("foreign", [{"__init__.py": "import mine\n"}, {"notes.txt": "keep me\n"},
                                     {"__init__.py": "\n# Exported by autoflash\n"}])
def test_a_folder_holding_something_else_is_refused_unless_forced(export, tmp_path, foreign):
    out = tmp_path / "package"
    out.mkdir()
    for name, text in foreign.items():
        (out / name).write_text(text)
    refused = export(out)
    assert refused.exit_code == 1
    [line] = refused.output.strip().splitlines()
    assert str(out) in line and "empty or new folder" in line and "--force" in line, line
    assert {p.name: p.read_text() for p in out.iterdir()} == foreign, "a refused export must not write anything"
    forced = export(out, "--force")
    assert forced.exit_code == 0, forced.output
    assert (out / "__init__.py").read_text().startswith("# Exported by autoflash")

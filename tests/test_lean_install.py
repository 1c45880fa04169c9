"""A plain install (no `tune` extra) runs attention, explain, dispatch from the shipped database, the CLI's help and
export, and exported packages; tune, show and merge say which extra to install. Proved without uninstalling
anything: the child process refuses to import sqlalchemy and optuna."""

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import importlib.abc, os, sys

    BLOCKED = ("sqlalchemy", "optuna")

    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {name!r} (blocked by the test)", name=name)
            return None

    sys.meta_path.insert(0, Blocked())
    tests, tmp = sys.argv[1], sys.argv[2]
    sys.path.insert(0, tests)

    import torch
    from click.testing import CliRunner

    import autoflash
    from autoflash import codegen, dispatch, gpu as gpus
    from autoflash.cli import main
    from autoflash.db import records
    from helpers import assert_matches_reference, make_qkv

    q, k, v = make_qkv(1, 4, 2, 40, 33, 32, torch.float16, "cpu", seed=3)
    out, lse = autoflash.attention(q, k, v, causal=True, return_lse=True)
    assert_matches_reference(out, lse, q, k, v, True)
    assert "fwd source:" in autoflash.explain(q, k, v, causal=True)
    print("checked: attention against the reference, explain")

    # The shipped database, read through dispatch: a problem tuned there is found as exact.
    [shipped] = [u for u in dispatch.shipped_urls() if u.endswith("h100.db")]
    h100 = gpus.by_family("h100")
    for direction in ("fwd", "bwd"):
        best = records.best_trials(shipped, "h100", direction, codegen.current_fingerprints(direction).values())
        assert best, f"no {direction} records read from {shipped}"
        choice = dispatch.Dispatcher([shipped]).choice(best[0].problem, h100, direction)
        assert choice.reason == "exact problem tuned" and choice.source == shipped, choice
    print(f"checked: the shipped database {shipped} through dispatch")

    runner = CliRunner()
    for args in (["--help"], ["export", "--help"], ["tune", "--help"]):
        result = runner.invoke(main, args, prog_name="autoflash")
        assert result.exit_code == 0 and "Usage: autoflash" in result.output, (args, result.output)
    shapes = os.path.join(tmp, "shapes.yaml")
    with open(shapes, "w") as f:
        f.write("problems:\\n  - {batch: 1, heads_q: 2, seqlen_q: 24, head_dim: 16}\\n")
    exported = runner.invoke(main, ["export", "--gpu", "interpreter", "--shapes", shapes,
                                    "--out", os.path.join(tmp, "exported")], prog_name="autoflash")
    assert exported.exit_code == 0, exported.output
    sys.path.insert(0, tmp)
    from exported import attention as exported_attention
    q, k, v = make_qkv(1, 2, 2, 24, 24, 16, torch.float16, "cpu", seed=4)
    assert_matches_reference(exported_attention(q, k, v), None, q, k, v, False)
    print("checked: autoflash --help, export --help, tune --help, export, the exported package")

    for args, missing in ((["tune", "--interpret", "--shapes", shapes], "optuna"), (["show"], "sqlalchemy"),
                          (["merge", "--into", os.path.join(tmp, "into.db"), shapes], "sqlalchemy")):
        result = runner.invoke(main, args, prog_name="autoflash")
        assert result.exit_code == 1 and result.output == (
            f"Error: autoflash {args[0]} needs {missing}, which is not installed: pip install 'autoflash[tune]'\\n"), \\
            (args, result.output, result.exception)
    print("checked: tune, show and merge name the extra to install")

    import warnings
    autoflash.configure(tune="on-miss")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seqlen_q in (29, 30):  # untuned problems: one warning, the fallback runs
            q, k, v = make_qkv(1, 2, 1, seqlen_q, 33, 32, torch.float16, "cpu", seed=5)
            assert_matches_reference(autoflash.attention(q, k, v, causal=True, return_lse=True)[0], None, q, k, v, True)
    said = [str(w.message) for w in caught if "pip install 'autoflash[tune]'" in str(w.message)]
    assert len(said) == 1 and "sqlalchemy" in said[0], [str(w.message) for w in caught]
    print("checked: tuning on first use names the extra once and runs the fallback")
    assert not set(BLOCKED) & set(sys.modules), "a blocked module was imported"
    print("lean ok")
""")


def test_attention_explain_dispatch_cli_and_export_run_without_the_tune_extra(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "TRITON_INTERPRET": "1", "XDG_DATA_HOME": str(tmp_path / "data"),
           "HOME": str(tmp_path), "AUTOFLASH_CACHE_DIR": str(tmp_path / "kernels"),
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(Path(__file__).parent), str(tmp_path)],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 0 and "lean ok" in done.stdout, done.stdout + done.stderr

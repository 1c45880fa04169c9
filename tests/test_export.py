"""Export: a package from an --interpret-tuned database runs forward and backward where autoflash cannot
be imported."""

import re
import subprocess
import sys
import textwrap

from click.testing import CliRunner

from autoflash.cli import main

SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["autoflash"] = None  # the export must not need autoflash
    import math, torch
    sys.path.insert(0, sys.argv[1])
    from exported import attention, PROBLEMS
    assert len(PROBLEMS) == 2

    def rel(a, b):
        return ((a.double() - b).norm() / b.norm()).item()

    gen = torch.Generator().manual_seed(7)
    for causal in (False, True):
        q = torch.randn(1, 2, 40, 32, generator=gen).half().requires_grad_()
        k, v = (torch.randn(1, 1, 33, 32, generator=gen).half().requires_grad_() for _ in range(2))
        out = attention(q, k, v, causal=causal)
        dout = torch.randn(out.shape, generator=gen).half()
        out.backward(dout)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        s = q64 @ k64.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(32)
        if causal:
            s = s.masked_fill(torch.arange(33)[None, :] > torch.arange(40)[:, None] + (33 - 40), float("-inf"))
        ref = torch.nan_to_num(torch.softmax(s, -1)) @ v64.repeat_interleave(2, dim=1)
        ref.backward(dout.double())
        assert rel(out, ref) < 2e-3, rel(out, ref)
        for name, t, t64 in (("dq", q, q64), ("dk", k, k64), ("dv", v, v64)):
            assert rel(t.grad, t64.grad) < 4e-3, (name, rel(t.grad, t64.grad))
    try:
        attention(torch.randn(1, 2, 41, 32).half(), k, v)
    except ValueError as e:
        assert "export it with autoflash export --shapes" in str(e)
    else:
        raise AssertionError("a problem that was not exported must be refused")
    print("exported ok")
""")


def tune_show_and_export(tmp_path, fields: str, trials: int, shown: str, problems: int) -> None:
    """`autoflash tune --mode both` of one problems-file entry (q 1x2x40x32, k and v 1x1x33x32, and `fields`) under
    the interpreter into a fresh database, `show` (its output must match `shown`), and `export` to
    tmp_path/exported: `problems` problems from tuning records in each direction."""
    shapes = tmp_path / "shapes.yaml"
    shapes.write_text("problems:\n  - {batch: 1, heads_q: 2, heads_kv: 1, seqlen_q: 40, seqlen_k: 33, head_dim: 32, "
                      f"{fields}}}\n")
    url = f"sqlite:///{tmp_path / 'tuned.db'}"
    runner = CliRunner()
    tuned = runner.invoke(main, ["tune", "--interpret", "--mode", "both", "--shapes", str(shapes), "--trials",
                                 str(trials), "--db", url])
    assert tuned.exit_code == 0, tuned.output
    result = runner.invoke(main, ["show", "--gpu", "interpreter", "--db", url])
    assert result.exit_code == 0 and re.search(shown, result.output), result.output
    exported = runner.invoke(main, ["export", "--gpu", "interpreter", "--db", url, "--out", str(tmp_path / "exported")])
    assert exported.exit_code == 0 and exported.output.count(f"{problems} from tuning records") == 2, exported.output


def run_exported(tmp_path, script: str, *args: str) -> None:
    """`script` (given the folder that holds the package, then `args`) in a fresh interpreter without autoflash: it
    prints 'exported ok'."""
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path), *args], capture_output=True, text=True,
                          env={"TRITON_INTERPRET": "1", "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert done.returncode == 0 and "exported ok" in done.stdout, done.stderr


def test_export_runs_without_autoflash(tmp_path):
    tune_show_and_export(tmp_path, "causal: [false, true]", 2, r"s40/33 d32 causal fp16 +bwd +2 +0 ", 2)
    for variant in (tmp_path / "exported").glob("variant_*.py"):
        header = variant.read_text()
        assert "knobs:" in header and "fingerprint:" in header and "measured:" in header and "TFLOP/s" in header
    run_exported(tmp_path, SCRIPT)

VARIANT_SCRIPT = textwrap.dedent("""
    import sys
    sys.modules["autoflash"] = None  # the export must not need autoflash
    import math, torch
    sys.path.insert(0, sys.argv[1])
    from exported import attention, PROBLEMS
    assert len(PROBLEMS) == 1

    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 40, 32, generator=gen).half().requires_grad_()
    k, v = (torch.randn(1, 1, 33, 32, generator=gen).half().requires_grad_() for _ in range(2))
    slopes = torch.tensor([0.5, 0.125])
    out = attention(q, k, v, causal=True, window_size=(5, -1), softcap=20.0, alibi_slopes=slopes)
    dout = torch.randn(out.shape, generator=gen).half()
    out.backward(dout)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = q64 @ k64.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(32)
    s = 20.0 * torch.tanh(s / 20.0)
    offset = torch.arange(33)[None, :] - torch.arange(40)[:, None] - (33 - 40)
    s = s - slopes.double()[:, None, None] * offset.abs()
    s = s.masked_fill((offset > 0) | (offset < -5), float("-inf"))
    ref = torch.nan_to_num(torch.softmax(s, -1)) @ v64.repeat_interleave(2, dim=1)
    ref.backward(dout.double())
    rel = lambda a, b: ((a.double() - b).norm() / b.norm()).item()
    assert rel(out, ref) < 2e-3, rel(out, ref)
    for name, t, t64 in (("dq", q, q64), ("dk", k, k64), ("dv", v, v64)):
        assert rel(t.grad, t64.grad) < 4e-3, (name, rel(t.grad, t64.grad))
    try:
        attention(q, k, v, causal=True, window_size=(6, -1), softcap=20.0, alibi_slopes=slopes)
    except ValueError as e:
        assert "export it with autoflash export --shapes" in str(e)
    else:
        raise AssertionError("another window must be refused")
    print("exported ok")
""")


def test_export_of_a_variant_problem(tmp_path):
    """Tuned (with --mode both), shown and exported: the package computes the window, softcap and ALiBi."""
    tune_show_and_export(tmp_path, "causal: true, window_size: [5, -1], softcap: 20.0, alibi: true", 1,
                         "wl5 softcap alibi", 1)
    run_exported(tmp_path, VARIANT_SCRIPT)

"""Problems the tuner refuses up front, in one line, before any worker starts or any database is created."""

from click.testing import CliRunner

from autoflash.cli import main
from autoflash.problem import Problem


def test_a_problem_larger_than_memory_is_refused_naming_what_it_needs(tmp_path):
    shapes = tmp_path / "huge.yaml"
    shapes.write_text("problems:\n  - {batch: 1, heads_q: 2, seqlen_q: 16, head_dim: 16}\n"
                      "  - {batch: 1, heads_q: 8, seqlen_q: 1000000000000, head_dim: 128}\n")
    db = tmp_path / "never.db"
    result = CliRunner().invoke(main, ["tune", "--interpret", "--mode", "both", "--shapes", str(shapes),
                                       "--db", f"sqlite:///{db}"])
    assert result.exit_code == 1, result.output
    [line] = result.output.strip().splitlines()
    assert "b1 h8 s1000000000000 d128 fp16 (fwd) needs" in line and "GiB for its tensors alone" in line, line
    assert "memory has" in line and not db.exists()


def test_tensor_bytes_count_both_directions():
    p = Problem(batch=2, heads_q=4, heads_kv=2, seqlen_q=10, seqlen_k=30, head_dim=16, causal=False, dtype="float16")
    q, kv, lse = 2 * 4 * 10 * 16, 2 * 2 * 30 * 16, 2 * 4 * 10 * 4
    assert p.tensor_bytes("fwd") == (2 * q + 2 * kv) * 2 + lse
    assert p.tensor_bytes("bwd") == (2 * q + 2 * kv) * 2 * 2 + lse

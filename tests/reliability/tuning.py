"""What the tuner fault tests share: a tiny problems file, the `tune` command (deterministic_tune.py's), and the
trial rows of a SQLite database read with sqlite3 alone, so that a damaged file is seen as it is."""

import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from autoflash.db.base import connect_readonly

HERE = Path(__file__).parent
# Two problems of 36 searched variants each: small enough for the interpreter, large enough to interrupt.
TWO_PROBLEMS = "problems:\n  - {batch: 1, heads_q: 1, seqlen_q: 16, head_dim: 16, causal: [false, true]}\n"
ONE_PROBLEM = "problems:\n  - {batch: 1, heads_q: 1, seqlen_q: 16, head_dim: 16, causal: true}\n"
OTHER_PROBLEM = "problems:\n  - {batch: 1, heads_q: 1, seqlen_q: 24, head_dim: 16, causal: false}\n"


def problems_file(folder: Path, text: str = TWO_PROBLEMS, name: str = "problems.yaml") -> str:
    path = folder / name
    path.write_text(text)
    return str(path)


def tune_command(shapes: str, db: str, *options: str) -> list[str]:
    """`autoflash tune` in the interpreter, each variant's time a fixed function of its knobs."""
    return [sys.executable, str(HERE / "deterministic_tune.py"), "tune", "--interpret", "--shapes", shapes,
            "--db", db, *options]


def start(command: list[str], **kwargs) -> subprocess.Popen:
    """The command in a new process that hears SIGINT even where pytest runs in a shell's background job (which
    starts with SIGINT ignored, and children inherit that)."""
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


def trial_rows(path: Path) -> list[tuple]:
    """Every trial row: (id, problem key, knobs, status, median_ms), in id order; [] before the tables exist."""
    if not path.exists():
        return []
    with closing(connect_readonly(str(path))) as db:
        try:
            return db.execute("SELECT t.id, p.key, v.knobs, t.status, t.median_ms FROM autoflash_trials t "
                              "JOIN autoflash_problems p ON p.id = t.problem_id "
                              "JOIN autoflash_variants v ON v.id = t.variant_id ORDER BY t.id").fetchall()
        except sqlite3.OperationalError as e:
            if "no such table" in str(e):
                return []
            raise


def assert_sound(path: Path) -> list[tuple]:
    """The database passes SQLite's integrity check and holds no variant twice for a problem; its trial rows."""
    with closing(connect_readonly(str(path))) as db:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    rows = trial_rows(path)
    timed = [(key, knobs) for _, key, knobs, _, _ in rows]
    assert len(timed) == len(set(timed)), f"a variant was timed twice: {sorted(timed)}"
    return rows


def winners(rows: list[tuple]) -> dict[str, str]:
    """Per problem key, the knobs of its fastest ok trial."""
    best = {}
    for _, key, knobs, status, ms in rows:
        if status == "ok" and (key not in best or ms < best[key][0]):
            best[key] = (ms, knobs)
    return {key: knobs for key, (_, knobs) in best.items()}


def wait_for_rows(path: Path, count: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until the database holds `count` trials, or the process has ended."""
    deadline = time.monotonic() + timeout
    while len(trial_rows(path)) < count and proc.poll() is None:
        assert time.monotonic() < deadline, f"fewer than {count} trials after {timeout} s"
        time.sleep(0.1)

"""`autoflash tune` killed (SIGKILL) or interrupted (SIGINT, Ctrl-C) at random points, then resumed by the same
command: no finished trial is lost or timed twice, the file stays sound, and the resumed run ends where an
uninterrupted one does (with timing made deterministic: deterministic_tune.py)."""

import fcntl
import os
import random
import signal
import subprocess
import time

import pytest

from tuning import assert_sound, problems_file, start, tune_command, wait_for_rows, winners

TRIALS, PROBLEMS = 4, 2
# The grid sampler proposes the same variants in the same order in every run: a resumed run must time exactly
# those an uninterrupted run times.
OPTIONS = ("--sampler", "grid", "--trials", str(TRIALS))


@pytest.fixture(scope="session")
def uninterrupted(tmp_path_factory) -> list[tuple]:
    """The trial rows of an uninterrupted run, made once per test session: pytest-xdist's workers share it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's
    db = root / "uninterrupted.db"
    with open(root / "uninterrupted.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not db.exists():
            made = root / f"uninterrupted-{os.getpid()}.db"
            subprocess.run(tune_command(problems_file(root, name=f"{made.stem}.yaml"), str(made), *OPTIONS),
                           check=True, capture_output=True, timeout=600)
            made.rename(db)
    return assert_sound(db)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_killed_and_interrupted_runs_resume_to_the_uninterrupted_result(tmp_path, seed, uninterrupted):
    rng = random.Random(seed)
    db = tmp_path / "tune.db"
    command = tune_command(problems_file(tmp_path), str(db), *OPTIONS)
    rows = []
    for fault in rng.sample([signal.SIGKILL, signal.SIGINT], 2):  # in an order, and at points, the seed draws
        proc = start(command)
        if rng.random() < 0.3:  # anywhere: importing, opening the database, starting workers, searching
            time.sleep(rng.uniform(0, 12))
        else:  # after a random count of finished trials: between trials, or in the middle of one
            wait_for_rows(db, rng.randint(min(len(rows), TRIALS * PROBLEMS - 1), TRIALS * PROBLEMS - 1), proc)
            time.sleep(rng.uniform(0, 1))
        proc.send_signal(fault)
        _, err = proc.communicate(timeout=120)
        if fault == signal.SIGINT and proc.returncode == 130:
            assert "run the same command to resume" in err, err[-2000:]
        before, rows = rows, assert_sound(db) if db.exists() else []
        assert set(before) <= set(rows), f"trials lost to {fault.name}: {set(before) - set(rows)}"
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final = assert_sound(db)
    assert set(rows) <= set(final) and len(final) == TRIALS * PROBLEMS
    assert sorted(r[1:] for r in final) == sorted(r[1:] for r in uninterrupted), "the resumed run timed others"
    assert winners(final) == winners(uninterrupted) and len(winners(final)) == PROBLEMS

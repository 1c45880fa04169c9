"""A tuning database that cannot be written (a read-only file or folder, a full disk) is one line naming it, before
any worker starts; a disk that fills during a run stops it with one line; no traceback unless AUTOFLASH_DEBUG=1; and
the file is whole afterwards, its earlier trials intact."""

import ctypes
import os
import resource
import subprocess

import pytest

from autoflash import codegen
from autoflash.db.store import Store
from autoflash.gpu import INTERPRETER
from autoflash.problem import Problem
from tuning import ONE_PROBLEM, assert_sound, problems_file, start, trial_rows, tune_command, wait_for_rows

EARLIER = Problem(batch=1, heads_q=1, heads_kv=1, seqlen_q=24, seqlen_k=24, head_dim=16, causal=False,
                  dtype="float16")
_PR_CAPBSET_DROP, _CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH, _CAP_SETPCAP = 24, 1, 2, 8


def earlier_database(path) -> list[tuple]:
    """A database holding three trials of EARLIER, a file on its own (no -wal or -shm beside it, through which
    SQLite could still write in a read-only folder); its rows."""
    store = Store(str(path))
    for ms, knobs in enumerate(('{"block_m": 16}', '{"block_m": 32}', '{"block_m": 64}'), start=1):
        store.record_trial(INTERPRETER, EARLIER, knobs, codegen.template_fingerprint("tl"), "ok", float(ms))
    store.make_standalone()
    store.close()
    return trial_rows(path)


def honour_file_modes():
    """A preexec_fn under which even root is refused what file modes refuse (as root, chmod alone does not bite):
    the process gives up the capabilities that override them."""
    if os.geteuid() != 0:
        return None
    with open("/proc/self/status") as f:
        effective = int(next(line for line in f if line.startswith("CapEff:")).split()[1], 16)
    if not effective >> _CAP_SETPCAP & 1:
        pytest.skip("running as root without CAP_SETPCAP: cannot give up the override of file modes")
    libc = ctypes.CDLL(None, use_errno=True)

    def drop():
        for capability in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
            if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    return drop


def no_file_growth():
    """A preexec_fn: the process may write no byte to any file, as on a full disk."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


def refused(tmp_path, db, preexec_fn, **env) -> str:
    """Run tune on `db` under `preexec_fn`; it must fail before its workers start. Its stderr."""
    run = subprocess.run(tune_command(problems_file(tmp_path, ONE_PROBLEM), str(db), "--trials", "2"),
                         capture_output=True, text=True, timeout=300, preexec_fn=preexec_fn, env={**os.environ, **env})
    assert run.returncode == 1, run.stderr[-3000:]
    assert "tuning 1 problem(s)" not in run.stdout, "the error came after the workers started"
    return run.stderr


@pytest.mark.parametrize("where", ["file", "folder"])
def test_a_read_only_database_is_refused_before_tuning(tmp_path, where):
    folder = tmp_path / "dbs"
    folder.mkdir()
    db = folder / "tune.db"
    rows = earlier_database(db)
    (db if where == "file" else folder).chmod(0o444 if where == "file" else 0o555)
    try:
        err = refused(tmp_path, db, honour_file_modes())
    finally:
        folder.chmod(0o755)
        db.chmod(0o644)
    [line] = err.strip().splitlines()
    assert str(db) in line and "readonly database" in line and "read-only: copy it somewhere writable" in line, line
    assert assert_sound(db) == rows


def test_a_full_disk_is_refused_before_tuning_and_debug_shows_the_traceback(tmp_path):
    db = tmp_path / "tune.db"
    rows = earlier_database(db)
    [line] = refused(tmp_path, db, no_file_growth).strip().splitlines()
    assert str(db) in line and "disk failed or is full" in line, line
    assert "Traceback" in refused(tmp_path, db, no_file_growth, AUTOFLASH_DEBUG="1")
    assert assert_sound(db) == rows


def test_a_disk_that_fills_during_a_run_stops_it_in_one_line_and_loses_nothing(tmp_path):
    db = tmp_path / "tune.db"
    rows = earlier_database(db)
    proc = start(tune_command(problems_file(tmp_path, ONE_PROBLEM), str(db), "--trials", "6", "--seed", "0"))
    wait_for_rows(db, len(rows) + 2, proc)
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (0, 0))  # the tuner's next write finds the disk full
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-3000:]
    [line] = [line for line in err.splitlines() if "Error" in line or "Traceback" in line]
    assert line.startswith("Error: tuning stopped: ") and "disk failed or is full" in line, err[-3000:]
    assert "run the same command to resume" in line
    written = assert_sound(db)
    assert written[:len(rows)] == rows and len(rows) + 2 <= len(written) < len(rows) + 6

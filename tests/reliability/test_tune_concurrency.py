"""Four tuners at once on one database, three on the same problem and one on another: each problem ends with exactly
--trials trials, and no variant is timed twice (the store's claims), on SQLite and on PostgreSQL."""

import glob
import os
import shutil
import subprocess
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autoflash import codegen
from autoflash.db import store as stores
from autoflash.db.models import ClaimRow, ProblemRow, TrialRow, VariantRow
from autoflash.db.store import Store
from autoflash.gpu import INTERPRETER
from autoflash.problem import Problem
from tuning import OTHER_PROBLEM, ONE_PROBLEM, assert_sound, problems_file, start, tune_command

TRIALS = 4


def tune_four_at_once(tmp_path, db: str) -> None:
    """Three tuners on ONE_PROBLEM (one seed: they propose the same variants, in the same order) and one on
    OTHER_PROBLEM, all at once."""
    same = problems_file(tmp_path, ONE_PROBLEM, "same.yaml")
    other = problems_file(tmp_path, OTHER_PROBLEM, "other.yaml")
    procs = [start(tune_command(shapes, db, "--trials", str(TRIALS), "--seed", "0"))
             for shapes in (same, same, same, other)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]


def timed_per_problem(url: str) -> dict[str, list[str]]:
    """Per problem key, the knobs of each trial row; and no claim is left."""
    store = Store(url)
    with Session(store.engine) as s:
        rows = s.execute(select(ProblemRow.key, VariantRow.knobs).join(TrialRow.problem).join(TrialRow.variant)).all()
        assert s.scalar(select(func.count(ClaimRow.id))) == 0, "a finished run left claims behind"
    store.close()
    timed = {}
    for key, knobs in rows:
        timed.setdefault(key, []).append(knobs)
    return timed


def assert_exact(timed: dict[str, list[str]]) -> None:
    assert len(timed) == 2 and all(len(knobs) == TRIALS for knobs in timed.values()), \
        {key: len(knobs) for key, knobs in timed.items()}
    assert all(len(set(knobs)) == len(knobs) for knobs in timed.values()), "a variant was timed twice"


def test_claims_keep_tuners_off_each_others_variants_and_within_the_trials(tmp_path):
    store, problem = Store(str(tmp_path / "claims.db")), Problem(1, 1, 1, 16, 16, 16, True, "float16")
    fingerprint = codegen.template_fingerprint("tl")
    k0, k1, k2, k3 = (f'{{"block_m": {m}}}' for m in (16, 32, 64, 128))

    def claim(limit):
        return store.claim(INTERPRETER, problem, fingerprint, "fwd", [k0, k1, k2, k3], limit)
    assert claim(2) == ([k0, k1], [])
    store.record_trial(INTERPRETER, problem, k0, fingerprint, "ok", 1.0)  # its claim goes with it
    store.release_claims()
    gone = subprocess.Popen(["true"])
    gone.wait()
    with Session(store.engine) as s:  # k1: a live tuner here; k2: a killed one here; k3: another host's, long ago
        here = stores._host()
        for knobs, host, pid, age in ((k1, here, 1, timedelta(0)), (k2, here, gone.pid, timedelta(0)),
                                      (k3, "elsewhere", 1, stores.CLAIM_EXPIRY * 2)):
            s.add(ClaimRow(gpu_family="interpreter", problem_id=store._problem(s, problem).id,
                           variant_id=store._variant(s, knobs, fingerprint, "fwd").id, host=host, pid=pid,
                           created_at=stores._now() - age))
        s.commit()
    assert claim(3) == ([k2], [k1]), "one trial and one live claim leave one of three to take"
    assert claim(4) == ([k3], [k1, k2])


def test_four_tuners_on_one_sqlite_file(tmp_path):
    db = tmp_path / "shared.db"
    tune_four_at_once(tmp_path, str(db))
    assert_sound(db)
    assert_exact(timed_per_problem(str(db)))


def _pg_ctl() -> str | None:
    return shutil.which("pg_ctl") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))[-1:]), None)


@pytest.fixture(scope="module")
def postgres_server():
    """A throwaway PostgreSQL server on a Unix socket: its URL without a database name. As root it runs as the
    'postgres' user (PostgreSQL refuses root)."""
    pytest.importorskip("psycopg", reason="PostgreSQL tests need psycopg: pip install 'autoflash[test]'")
    pg_ctl = _pg_ctl()
    if pg_ctl is None:
        pytest.skip("PostgreSQL's pg_ctl is not installed (apt-get install postgresql)")
    user = "postgres" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="autoflash-pg-"))  # short: a socket path has at most 107 characters
    folder.chmod(0o777)
    if user:
        shutil.chown(folder, user)
    bin_dir, data = Path(pg_ctl).parent, folder / "data"

    def run(*command):
        subprocess.run(command, check=True, capture_output=True, user=user, timeout=120)
    run(bin_dir / "initdb", "-D", data, "-A", "trust", "-U", "autoflash")
    run(pg_ctl, "-D", data, "-l", folder / "log", "-w", "-o", f"-k {folder} -c listen_addresses='' -p 5433", "start")
    try:
        yield f"postgresql+psycopg://autoflash@/{{}}?host={folder}&port=5433"
    finally:
        run(pg_ctl, "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def test_four_tuners_on_one_postgresql_database(tmp_path, postgres_server):
    import psycopg

    name = f"tune_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server.format("postgres").replace("+psycopg", ""), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = postgres_server.format(name)
    tune_four_at_once(tmp_path, url)
    assert_exact(timed_per_problem(url))


def test_a_trial_waits_for_a_claimer_reading_the_problem(postgres_server):
    """The race behind a 5th trial of 4 (PostgreSQL reads each statement anew): a claimer read the trials, a
    tuner then recorded one and dropped its claim, and the claimer's read of the claims saw neither. A trial is
    now recorded under the claimers' lock: it waits until the claimer has read both and committed."""
    import threading

    import psycopg

    name = f"lock_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(postgres_server.format("postgres").replace("+psycopg", ""), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    store, problem = Store(postgres_server.format(name)), Problem(1, 1, 1, 16, 16, 16, True, "float16")
    fingerprint = codegen.template_fingerprint("tl")
    with Session(store.engine) as s:
        problem_id = store._problem(s, problem).id
        s.commit()
    recorded = threading.Event()
    with Session(store.engine) as claimer:
        stores._lock(claimer, problem_id)  # a claimer between its two reads
        thread = threading.Thread(target=lambda: (store.record_trial(INTERPRETER, problem, '{"block_m": 16}',
                                                                     fingerprint, "ok", 1.0), recorded.set()))
        thread.start()
        assert not recorded.wait(1.0), "a trial landed while a claimer held the problem"
        claimer.commit()
    thread.join(timeout=30)
    assert recorded.is_set()
    store.close()


def test_a_family_another_tuner_is_timing_is_searched_last(tmp_path, monkeypatch):
    """Two tuners on one problem time its families side by side: the one that arrives second starts with the family
    nobody claims (NOTES 137: a tuner waited 17 s on the other's last problem, family after family)."""
    from autoflash import families
    from autoflash.tune import tuner

    store, problem = Store(str(tmp_path / "claims.db")), Problem(1, 1, 1, 16, 16, 16, True, "float16")
    names = [f.name for f in families.searched("fwd")]
    assert len(names) > 1, names
    busy = names[0]
    fingerprint = codegen.template_fingerprint(busy, "fwd", problem.gates())
    assert not store.claimed_by_others(INTERPRETER, problem, fingerprint, "fwd")
    store.claim(INTERPRETER, problem, fingerprint, "fwd", ['{"block_m": 16}'], 4)
    assert not store.claimed_by_others(INTERPRETER, problem, fingerprint, "fwd"), "this process's own claim"
    store.release_claims()
    with Session(store.engine) as s:  # a live tuner here (pid 1) timing the first family's variant
        s.add(ClaimRow(gpu_family="interpreter", problem_id=store._problem(s, problem).id,
                       variant_id=store._variant(s, '{"block_m": 32}', fingerprint, "fwd").id, host=stores._host(),
                       pid=1, created_at=stores._now()))
        s.commit()
    assert store.claimed_by_others(INTERPRETER, problem, fingerprint, "fwd")
    other = codegen.template_fingerprint(names[1], "fwd", problem.gates())
    assert not store.claimed_by_others(INTERPRETER, problem, other, "fwd")

    order = []
    monkeypatch.setattr(tuner, "_search_family", lambda family, *a, **kw: order.append(family.name) or ({}, None))
    monkeypatch.setattr(tuner, "_sdpa_baseline", lambda *a: None)
    tuner.tune_problem(problem, gpu=INTERPRETER, store=store, runner=SimpleNamespace(seconds={}, measuring=True),
                       n_trials=2)
    assert order == names[1:] + [busy]

"""Databases another process holds, and connections left open: `merge` into a database locked by another
process is one line saying what to do; reading a database through SQLAlchemy (PostgreSQL's path) closes every
connection it opened, refused databases included."""

import sqlite3

import pytest
from click.testing import CliRunner

from autoflash import codegen
from autoflash.cli import main
from autoflash.db import records, store as store_module
from autoflash.db.base import StoreError
from autoflash.db.store import Store
from autoflash.db.urls import as_url
from autoflash.families.tl.knobs import FwdKnobs
from autoflash.gpu import INTERPRETER
from autoflash.problem import Problem

PROBLEM = Problem(1, 2, 2, 40, 40, 32, True, "float16")
KNOBS = FwdKnobs(block_m=32, block_n=16, num_warps=2, num_stages=2, exp="exp")
FINGERPRINT = codegen.template_fingerprint("tl", "fwd")


@pytest.fixture
def source_and_into(tmp_path):
    """A database with one trial, and a new one to merge it into."""
    source, into = tmp_path / "source.db", tmp_path / "into.db"
    store = Store(source)
    store.record_trial(INTERPRETER, PROBLEM, KNOBS.to_json(), FINGERPRINT, "ok", 1.0)
    store.close()
    Store(into).close()
    return source, into


def merge(source, into):
    return CliRunner().invoke(main, ["merge", "--into", str(into), "--standalone", str(source)])


def one_line_error(result, *phrases):
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("Error: ") and all(p in line for p in phrases), line


def test_merge_standalone_into_a_database_another_process_has_open(source_and_into):
    source, into = source_and_into
    tuner = sqlite3.connect(into)  # what a running tuner holds: an open connection, no transaction
    tuner.execute("SELECT count(*) FROM autoflash_trials").fetchall()
    result = merge(source, into)
    one_line_error(result, f"cannot make {as_url(into)} standalone", "another process has it open",
                   "run the same command again")
    assert tuner.execute("SELECT count(*) FROM autoflash_trials").fetchone() == (1,), "the copied rows are saved"
    tuner.close()
    again = merge(source, into)
    assert again.exit_code == 0 and "0 trial(s)" in again.output, again.output
    assert sorted(p.name for p in into.parent.glob("into.db*")) == ["into.db"], "standalone: no -wal or -shm beside it"


def test_merge_into_a_database_another_process_is_writing(source_and_into, monkeypatch):
    source, into = source_and_into
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 1)  # 120 s outside tests
    writer = sqlite3.connect(into)
    writer.execute("BEGIN IMMEDIATE")  # another process's write lock, held past the timeout
    try:
        one_line_error(merge(source, into), f"cannot open the database {as_url(into)}: database is locked",
                       "another process holds it: try again when that one is done")
    finally:
        writer.rollback()
        writer.close()


@pytest.fixture
def opened(monkeypatch):
    """Every SQLite connection the store opens read-only, and reads that go through the store (as a PostgreSQL
    URL's do) for SQLite URLs too."""
    connections = []

    def tracked(path):
        connections.append(connect(path))
        return connections[-1]
    connect = store_module.connect_readonly
    monkeypatch.setattr(store_module, "connect_readonly", tracked)
    monkeypatch.setattr(records, "sqlite_path", lambda url: None)
    return connections


def still_open(connection) -> bool:
    try:
        connection.execute("SELECT 1")
    except sqlite3.ProgrammingError:  # "Cannot operate on a closed database."
        return False
    return True


def test_reading_through_the_store_closes_its_connections(source_and_into, opened):
    source, _ = source_and_into
    [best] = records.best_trials(str(source), "interpreter", "fwd", [FINGERPRINT])
    assert best.problem == PROBLEM
    assert records.why_unusable(str(source), "interpreter", "fwd", FINGERPRINT, PROBLEM.key()) is None
    assert opened and not any(map(still_open, opened))


@pytest.mark.parametrize("content", ["no tables", "another schema"])
def test_a_refused_database_keeps_no_connection_open(tmp_path, opened, content):
    path = tmp_path / "refused.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE autoflash_trials (id INTEGER)" if content == "another schema" else
                   "CREATE TABLE other (id INTEGER)")
    with pytest.raises(StoreError, match="schema version unknown" if content == "another schema" else "no autoflash"):
        records.best_trials(str(path), "interpreter", "fwd", [FINGERPRINT])
    assert opened and not any(map(still_open, opened))

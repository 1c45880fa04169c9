"""Tuning databases that are damaged, tampered with, foreign or oddly named (issue 23 items 3 and 4, and the
tracebacks of corrupt files and missing drivers): a malformed row is skipped with one warning naming it and every
call still works; a file that cannot be used is one line naming it and what to do; a path with `?` or `#` is that
file."""

import dataclasses
import sqlite3
import sys
import warnings

import pytest
import torch
from click.testing import CliRunner
from sqlalchemy.engine import make_url

import autoflash
from autoflash import api, codegen
from autoflash.cli import main
from autoflash.db import records
from autoflash.db.base import SCHEMA_VERSION, StoreError
from autoflash.db.store import Store
from autoflash.db.urls import as_url, sqlite_path, user_url
from autoflash.dispatch import Dispatcher
from autoflash.families.tl.knobs import BwdKnobs, FwdKnobs
from autoflash.gpu import INTERPRETER
from autoflash.problem import Problem
from conftest import DEVICE
from helpers import assert_matches_reference, make_qkv

SHAPE = (1, 2, 2, 40, 40, 32)  # batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim
PROBLEM = Problem(*SHAPE, True, "float16")
GOOD = FwdKnobs(block_m=32, block_n=16, num_warps=2, num_stages=2, exp="exp")
GOOD_BWD = BwdKnobs(block_m=16, block_n=32, num_warps=2, dq="atomic", causal_split=False)
# Problems of PROBLEM's kind (dtype, head dim, causal, GQA ratio) whose rows are then broken: unskipped, each would
# be a nearest neighbour of every call of that kind, or (the knobs) the fastest variant of PROBLEM.
BROKEN_PROBLEMS = {
    "heads_kv = 0": dict(heads_kv=0),
    "seqlen_q = 0": dict(seqlen_q=0),
    "batch = -1": dict(batch=-1),
    "seqlen_k = 40.5": dict(seqlen_k=40.5),
    "heads_q = 3": dict(heads_q=3),  # not a multiple of heads_kv 2
    "dtype = 'fp8'": dict(dtype="fp8"),
    "causal = 7": dict(causal=7),
}
BROKEN_KNOBS = {  # knobs text -> what a faster trial of PROBLEM stores instead of GOOD's
    "not JSON": "{block_m: 64",
    "64.0 for 64": GOOD.to_json().replace('"block_m": 32', '"block_m": 64.0'),
    "a value not offered": GOOD.to_json().replace('"block_m": 32', '"block_m": 48'),
    "an unknown knob": GOOD.to_json().replace('"exp": "exp"', '"exp": "exp", "warp_size": 64'),
    "a JSON list": "[1, 2]",
    "code in a value": GOOD.to_json().replace('"exp": "exp"', '"exp": "exp\\")\\nimport os; os.system(\\"id\\")#"'),
}


def fingerprint(direction: str) -> str:
    return codegen.template_fingerprint("tl", direction)


def record(store: Store, problem: Problem, knobs, ms: float) -> None:
    store.record_trial(INTERPRETER, problem, knobs.to_json(), fingerprint(knobs.DIRECTION), "ok", ms,
                       direction=knobs.DIRECTION)


@pytest.fixture
def tampered(tmp_path) -> str:
    """A database written by the Store (PROBLEM tuned forward and backward, GOOD at 2 ms), then tampered with."""
    url = as_url(tmp_path / "tampered.db")
    store = Store(url)
    record(store, PROBLEM, GOOD, 2.0)
    record(store, PROBLEM, GOOD_BWD, 3.0)
    for i, _ in enumerate(BROKEN_PROBLEMS):
        other = dataclasses.replace(PROBLEM, batch=2 + i)  # the nearest neighbour of a batch-2 call
        record(store, other, GOOD, 0.5)
        record(store, other, GOOD_BWD, 0.5)
    faster = [dataclasses.replace(GOOD, num_warps=w, num_stages=s) for w in (4, 8) for s in (1, 2, 3, 4, 5)]
    for knobs in faster[:len(BROKEN_KNOBS) + 3]:
        record(store, PROBLEM, knobs, 1.0)
    store.close()
    with sqlite3.connect(sqlite_path(url)) as db:
        for i, change in enumerate(BROKEN_PROBLEMS.values()):
            key = dataclasses.replace(PROBLEM, batch=2 + i).key()
            db.execute(f"UPDATE autoflash_problems SET {', '.join(f'{c} = ?' for c in change)} WHERE key = ?",
                       (*change.values(), key))
        for knobs, text in zip(faster, BROKEN_KNOBS.values()):
            db.execute("UPDATE autoflash_variants SET knobs = ? WHERE knobs = ?", (text, knobs.to_json()))
        no_time = faster[len(BROKEN_KNOBS):]
        for knobs, median in zip(no_time, (None, -1.0, float("inf"))):  # an ok trial without a positive time
            db.execute("UPDATE autoflash_trials SET median_ms = ? WHERE variant_id = "
                       "(SELECT id FROM autoflash_variants WHERE knobs = ?)", (median, knobs.to_json()))
    return url


def skip_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "skips" in str(w.message)]


def test_malformed_rows_are_skipped_with_one_warning_per_read(tampered):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        best = records.best_trials(tampered, "interpreter", "fwd", [fingerprint("fwd")])
    assert [(b.problem, b.knobs, b.median_ms) for b in best] == [(PROBLEM, GOOD.to_json(), 2.0)]
    [message] = skip_warnings(caught)
    broken = len(BROKEN_PROBLEMS) + len(BROKEN_KNOBS) + 3
    assert f"skips {broken} unusable fwd trial(s) of {tampered}" in message and f"and {broken - 5} more" in message
    assert "field 'heads_kv' must be a positive integer, got 0" in message
    assert "\n" not in message


@pytest.mark.parametrize("reason", ["must be a positive integer, got 0", "must divide heads_q", "'dtype' must be one",
                                    "'causal' must be true or false", "got 40.5", "Expecting property name",
                                    "block_m=64.0 is not one of", "block_m=48 is not one of", "unknown knobs",
                                    "must be a JSON object", "exp='exp\")\\nimport os; os.system(\"id\")#' is not one of",
                                    "median_ms is None", "median_ms is -1.0", "median_ms is inf"])
def test_each_kind_of_malformed_row_is_named(tampered, reason, monkeypatch):
    monkeypatch.setattr("autoflash.db.base._SKIPPED_NAMED", 100)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        records.best_trials(tampered, "interpreter", "fwd", [fingerprint("fwd")])
    assert reason in skip_warnings(caught)[0]


def test_attention_and_explain_work_beside_malformed_rows(tampered, monkeypatch):
    monkeypatch.setattr(api, "DISPATCHER", Dispatcher([tampered]))
    monkeypatch.setattr(api, "_plans", {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in (1, 2):  # the exact problem, then one whose nearest neighbours are the broken rows
            q, k, v = make_qkv(batch, *SHAPE[1:], torch.float16, DEVICE, seed=batch)
            out, lse = autoflash.attention(q, k, v, causal=True, return_lse=True)
            assert_matches_reference(out, lse, q, k, v, True)
            text = autoflash.explain(q, k, v, causal=True)
            assert GOOD.to_json() in text and GOOD_BWD.to_json() in text, text
            assert ("exact problem tuned" if batch == 1 else "nearest tuned problem") in text
    assert len(skip_warnings(caught)) == 2, "one warning per direction read, not one per row or per call"


def test_the_store_skips_them_too(tampered):
    store = Store(tampered, readonly=True)
    with pytest.warns(UserWarning, match="skips"):
        assert [b.knobs for b in store.best("interpreter", fingerprint("fwd"), "fwd")] == [GOOD.to_json()]
    problems = [p for p, _, _ in store.summary("interpreter", fingerprint("fwd"), "fwd")]
    assert PROBLEM in problems and all(p.validate() for p in problems)


@pytest.mark.parametrize("content, message", [
    (b"this is not a database" * 100, "file is not a database"),
    (b"", "holds no autoflash tables"),
    ("truncated", "malformed"),
    ("future schema", f"holds autoflash schema version {SCHEMA_VERSION + 1}, this autoflash"),
    ("foreign", "holds no autoflash tables"),
])
def test_unusable_files_are_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.db"
    if content == "future schema":  # written by a later autoflash
        Store(path).close()
        with sqlite3.connect(path) as db:
            db.execute("UPDATE autoflash_schema SET version = ?", (SCHEMA_VERSION + 1,))
    elif content == "foreign":  # another program's SQLite database
        with sqlite3.connect(path) as db:
            db.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
            db.execute("INSERT INTO users (name) VALUES ('ada')")
    elif content == "truncated":
        store = Store(path)
        for batch in range(1, 60):
            record(store, dataclasses.replace(PROBLEM, batch=batch), GOOD, 1.0)
        store.make_standalone()
        store.close()
        path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    else:
        path.write_bytes(content)
    shown = CliRunner().invoke(main, ["show", "--gpu", "interpreter", "--db", str(path)])
    assert shown.exit_code == 1 and shown.output.count("\n") == 1 and message in shown.output, shown.output
    assert "Error: " in shown.output and str(path) in shown.output and "Traceback" not in shown.output
    with pytest.raises(StoreError, match=message):
        records.best_trials(str(path), "interpreter", "fwd", [fingerprint("fwd")])
    with pytest.warns(UserWarning, match=f"ignores the tuning database .*{message}"):
        assert Dispatcher([str(path)]).choice(PROBLEM, INTERPRETER).source == "default"


@pytest.mark.parametrize("url", ["postgresql://autoflash@localhost/tuning",
                                 "postgresql+psycopg://autoflash@localhost/tuning"])
def test_a_missing_driver_names_what_to_install(url, monkeypatch):
    driver = make_url(url).get_dialect().driver  # psycopg for postgresql:// in SQLAlchemy 2.1, psycopg2 in 2.0
    monkeypatch.setitem(sys.modules, driver, None)  # not installed, even where the test extra installed it
    shown = CliRunner().invoke(main, ["show", "--gpu", "interpreter", "--db", url])
    assert shown.exit_code == 1 and shown.output.count("\n") == 1, shown.output
    assert f"needs the Python module '{driver}'" in shown.output and "pip install psycopg" in shown.output
    with pytest.raises(StoreError, match="pip install psycopg"):
        records.best_trials(url, "interpreter", "fwd", [fingerprint("fwd")])


@pytest.mark.parametrize("name", ["q?mark", "hash#dir", "per%41cent", "sp ace"])
def test_paths_with_url_characters_are_those_files(tmp_path, name, monkeypatch):
    path = tmp_path / name / "t.db"
    store = Store(str(path))
    record(store, PROBLEM, GOOD, 2.0)
    store.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [name], "nothing written beside the named folder"
    assert sorted(p.name for p in path.parent.iterdir() if not p.name.endswith(("-wal", "-shm"))) == ["t.db"]
    with sqlite3.connect(path) as db:
        assert {"autoflash_trials"} <= {n for (n,) in db.execute("SELECT name FROM sqlite_master")}
    assert sqlite_path(as_url(path)) == str(path)
    [best] = records.best_trials(str(path), "interpreter", "fwd", [fingerprint("fwd")])
    assert best.knobs == GOOD.to_json()
    shown = CliRunner().invoke(main, ["show", "--gpu", "interpreter", "--db", str(path)])
    assert shown.exit_code == 0 and PROBLEM.label() in shown.output, shown.output
    monkeypatch.setenv("AUTOFLASH_DB", str(path))  # a plain path, as a user sets it
    assert user_url() == as_url(path)
    assert Dispatcher().choice(PROBLEM, INTERPRETER).knobs == GOOD

"""Tuning on first use (autoflash/tune/on_miss.py) under Triton's interpreter: off by default; on, the first call
tunes and records, later calls and processes read the record; of processes started at once one tunes and all run
its choice; a tuner killed mid-search keeps its trials and holds no one up; without the tune extra, a warning."""

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
import torch

import autoflash
from autoflash import codegen
from autoflash.api import DISPATCHER
from autoflash.db import urls
from autoflash.db.store import Store
from autoflash.gpu import INTERPRETER, KNOWN
from autoflash.problem import Problem
from autoflash.reference import attention_reference
from autoflash.tune import on_miss
from helpers import RecordingRunner

# Each process calls attention on (1, 2, SEQLEN_Q, 32) fp16 causal queries against 33 keys, then again with out=
# (a new call signature of the same problem), and prints what it ran as JSON. On-miss searches TRIALS variants of
# each family at most.
RANK = '''
import json, sys, time
import torch
import autoflash
from autoflash.db.store import Store
from autoflash.gpu import INTERPRETER
from autoflash.problem import Problem
from autoflash.reference import attention_reference
from autoflash.tune import on_miss


def main():
    on_miss.TRIALS = int(sys.argv[2])
    torch.manual_seed(0)
    q = torch.randn(1, 2, int(sys.argv[1]), 32, dtype=torch.float16)
    k, v = torch.randn(1, 1, 33, 32, dtype=torch.float16), torch.randn(1, 1, 33, 32, dtype=torch.float16)
    print("calling", flush=True)
    started = time.monotonic()
    out = autoflash.attention(q, k, v, causal=True)
    first_s = time.monotonic() - started
    trials = [Store().count_trials()]
    again = autoflash.attention(q, k, v, causal=True, out=torch.empty_like(q))
    trials.append(Store().count_trials())
    ref = attention_reference(q, k, v, causal=True)[0]
    explained = dict(line.split(":", 1) for line in autoflash.explain(q, k, v, causal=True).splitlines())
    print(json.dumps({"on_miss": explained.get("fwd on-miss", "").strip(), "knobs": explained["fwd knobs"].strip(),
                      "first_s": first_s, "trials": trials,
                      "correct": all(bool(torch.allclose(o.double(), ref, atol=2e-3, rtol=2e-3)) for o in (out, again))}))


if __name__ == "__main__":
    main()
'''


# Searches that their trials end, in seconds, not the budget: in the interpreter the search's setup (the SDPA
# baseline, each family's space) takes seconds of it, more on a loaded machine.
FEW_TRIALS, BUDGET_S = 4, 60


def inputs(seqlen_q: int):
    q = torch.randn(1, 2, seqlen_q, 32, dtype=torch.float16)
    return q, torch.randn(1, 1, 33, 32, dtype=torch.float16), torch.randn(1, 1, 33, 32, dtype=torch.float16)


def assert_correct(out, q, k, v):
    torch.testing.assert_close(out.double(), attention_reference(q, k, v, causal=True)[0], atol=2e-3, rtol=2e-3)


def test_off_by_default_writes_no_database(fresh):
    q, k, v = inputs(29)
    assert_correct(autoflash.attention(q, k, v, causal=True), q, k, v)
    assert not fresh.exists()
    assert "on-miss" not in autoflash.explain(q, k, v, causal=True)


def test_without_the_tune_extra_one_warning_and_the_fallback(fresh, monkeypatch):
    monkeypatch.setitem(sys.modules, "optuna", None)  # `import optuna` fails as where it is not installed
    autoflash.configure(tune="on-miss")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seqlen_q in (27, 26):  # two untuned problems, one warning
            q, k, v = inputs(seqlen_q)
            assert_correct(autoflash.attention(q, k, v, causal=True), q, k, v)
    said = [str(w.message) for w in caught if "autoflash[tune]" in str(w.message)]
    assert len(said) == 1 and "optuna" in said[0], [str(w.message) for w in caught]
    assert not fresh.exists()
    assert "tune extra is missing" in autoflash.explain(q, k, v, causal=True)


def test_a_failing_tuner_warns_once_and_runs_the_fallback(fresh, tmp_path):
    autoflash.configure(tune="on-miss", db=tmp_path)  # a folder: no database can be opened there
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for seqlen_q in (25, 24):
            q, k, v = inputs(seqlen_q)
            assert_correct(autoflash.attention(q, k, v, causal=True), q, k, v)
    said = [str(w.message) for w in caught if "could not tune" in str(w.message)]
    assert len(said) == 1 and "b1 h2/1 s25/33" in said[0], [str(w.message) for w in caught]


def test_configured_the_first_differentiable_forward_tunes_both_directions_into_the_named_database(
        fresh, tmp_path, monkeypatch):
    monkeypatch.setattr(on_miss, "TRIALS", FEW_TRIALS)
    autoflash.configure(tune="on-miss", budget_s=BUDGET_S, db=tmp_path / "mine.db")
    q, k, v = (t.float().requires_grad_() for t in inputs(23))
    out = autoflash.attention(q, k, v, causal=True)
    store = Store(str(tmp_path / "mine.db"))
    tuned_fwd = store.count_trials()
    out.backward(dout := torch.randn_like(out))
    tuned = store.count_trials()
    store.close()
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    attention_reference(qd, kd, vd, causal=True)[0].backward(dout.double())
    for grad, expected in ((q.grad, qd.grad), (k.grad, kd.grad), (v.grad, vd.grad)):
        torch.testing.assert_close(grad.double(), expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.detach().double(), attention_reference(qd, kd, vd, causal=True)[0],
                               atol=1e-4, rtol=1e-4)
    explained = autoflash.explain(q.detach(), k.detach(), v.detach(), causal=True)
    # the forward's first call tuned the backward too (one start of the workers); the backward tuned nothing more
    assert 0 < tuned_fwd == tuned and not fresh.exists(), explained
    for direction in ("fwd", "bwd"):
        assert f"{direction} on-miss: tuned here on first use" in explained and \
            f"{direction} why:     exact problem tuned" in explained, explained


def test_configure_refuses_bad_settings_by_name(fresh, monkeypatch):
    with pytest.raises(ValueError, match="tune='always'.*'on-miss'"):
        autoflash.configure(tune="always")
    with pytest.raises(ValueError, match="budget_s=0"):
        autoflash.configure(budget_s=0)
    monkeypatch.setenv(on_miss.TUNE_ENV, "yes")
    monkeypatch.setattr(on_miss, "_settings", None)
    with pytest.raises(ValueError, match="AUTOFLASH_TUNE='yes': use 1"):
        on_miss.settings()


def test_on_a_large_host_a_few_compile_workers_start_and_the_budget_counts_once_they_are_up(fresh, tmp_path,
                                                                                           monkeypatch):
    """On 64 cores on-miss starts COMPILE_WORKERS compile workers, not 63 (each a process importing torch, the
    search's batch as wide as their pool); the search's deadline is the budget from when they are ready."""
    from autoflash.tune import runner as runners, tuner

    started, ready, given = [], [], {}

    class Starting:  # a worker that starts at once, and runs nothing
        def __init__(self, role, args):
            started.append(role)

        def wait_ready(self):
            ready.append(time.monotonic())

        def stop(self):
            pass

        def close(self):
            pass

    def tune_problem(problem, *, runner, direction, deadline, first, **options):
        given[direction] = dict(compilers=len(runner.compilers), deadline=deadline, first=first)
        return tuner.Report(problem, direction, None, None, None, trials=0, failures=0, wall_s=0.0)

    monkeypatch.setattr(runners, "usable_cores", lambda: 64)
    monkeypatch.setattr(on_miss.gpus, "interpreting", lambda: False)
    monkeypatch.setattr(runners, "_Worker", Starting)
    monkeypatch.setattr(tuner, "tune_problem", tune_problem)
    store = Store(str(tmp_path / "user.db"))
    problem = Problem(1, 2, 1, 40, 33, 32, True, "float16")
    fallback = {d: DISPATCHER.choice(problem, INTERPRETER, d).knobs for d in ("fwd", "bwd")}
    with on_miss._Workers() as workers:
        for direction in ("fwd", "bwd"):  # a differentiable call's first forward: one start serves both directions
            said = on_miss._tune(store, problem, INTERPRETER, direction, 10, workers, fallback[direction])
            assert ("starting the workers" in said) == (direction == "fwd"), said
    store.close()
    assert started.count("compile") == given["fwd"]["compilers"] == on_miss.COMPILE_WORKERS < 63
    assert started.count("measure") == 1
    assert given["fwd"]["deadline"] >= max(ready) + 10 and given["bwd"]["deadline"] >= given["fwd"]["deadline"]
    assert all(given[d]["first"] == fallback[d] for d in ("fwd", "bwd"))


def test_the_fallback_is_timed_whatever_the_deadline_leaves(tmp_path):
    """A search whose deadline passed in its setup (the SDPA baseline, the study) still times the fallback, and
    only it: so the record on-miss leaves is never a slower choice than what dispatch ran before."""
    from autoflash import families
    from autoflash.tune import tuner

    problem, hopper = Problem(1, 4, 1, 1024, 1024, 64, True, "float16"), KNOWN["h100"]
    last = families.searched("fwd")[-1]
    default = last.default(problem, hopper, "fwd")
    fallback = next(knobs for name, choices in type(default).search_space().items() for value in choices
                    if (knobs := replace(default, **{name: value})) != default
                    and not last.violations(knobs, problem, hopper))  # a borrowed record's, say: not the default
    batches = []
    store = Store(str(tmp_path / "user.db"))
    tuner.tune_problem(problem, gpu=hopper, store=store, runner=RecordingRunner(batches), n_trials=8,
                       deadline=time.monotonic() - 1, first=fallback)
    store.close()
    assert batches == [[fallback]], batches


def start_rank(tmp_path, seqlen_q: int, budget_s: float, trials: int = on_miss.TRIALS) -> subprocess.Popen:
    script = tmp_path / "rank.py"
    if not script.exists():  # written once: rewriting it truncates the file a rank started just before may be reading
        script.write_text(RANK)
    env = {**os.environ, "AUTOFLASH_TUNE": "1", "AUTOFLASH_TUNE_BUDGET_S": str(budget_s),
           urls.DB_ENV: str(tmp_path / "user.db"), "TRITON_INTERPRET": "1"}
    return subprocess.Popen([sys.executable, str(script), str(seqlen_q), str(trials)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def finish(rank: subprocess.Popen, timeout: float = 300) -> dict:
    out, err = rank.communicate(timeout=timeout)
    assert rank.returncode == 0, err[-3000:]
    lines = out.strip().splitlines()
    assert lines, f"the rank exited 0 and printed nothing; its stderr: {err[-3000:]}"
    return json.loads(lines[-1])


def test_ranks_started_at_once_one_tunes_all_run_its_choice_and_later_processes_read_it(tmp_path):
    ranks = [start_rank(tmp_path, 40, BUDGET_S, FEW_TRIALS) for _ in range(3)]
    results = [finish(rank) for rank in ranks]
    for result in results:
        print(result)
    tuned = [r for r in results if r["on_miss"].startswith("tuned here")]
    assert len(tuned) == 1, results
    assert all(r["on_miss"] == "" or r["on_miss"].startswith("waited") for r in results if r not in tuned)
    assert len({r["knobs"] for r in results}) == 1 and all(r["correct"] for r in results)
    recorded = tuned[0]["trials"][0]
    assert recorded > 0 and all(r["trials"] == [recorded, recorded] for r in results)  # the second call tunes nothing
    store = Store(str(tmp_path / "user.db"))
    assert store.count_trials() == recorded
    store.close()

    later = finish(start_rank(tmp_path, 40, BUDGET_S, FEW_TRIALS))
    assert later["on_miss"] == "" and later["knobs"] == results[0]["knobs"] and later["trials"] == [recorded] * 2


def test_a_tuner_killed_mid_search_keeps_its_trials_and_holds_no_one_up(tmp_path):
    budget_s = 600  # the claim lasts this plus a margin: no one may wait that long for a dead tuner (nor may the
    # tuner end its search by the budget, on a loaded machine, before the waiter comes)
    tuner = start_rank(tmp_path, 38, budget_s)
    deadline = time.monotonic() + 240
    while _trials(tmp_path, "ok") < 2:
        assert tuner.poll() is None and time.monotonic() < deadline, "the tuner recorded no trial"
        time.sleep(0.5)
    tuner.send_signal(signal.SIGSTOP)  # alive, its claim held, but no further: it cannot finish before the waiter comes
    waiter = start_rank(tmp_path, 38, budget_s)
    assert waiter.stdout.readline() == "calling\n"
    time.sleep(2)  # the waiter finds the tuner's claim and waits
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    kept = _trials(tmp_path)
    started = time.monotonic()
    waited = finish(waiter, timeout=120)
    assert time.monotonic() - started < 30, "the waiter waited for a dead tuner"
    later = finish(start_rank(tmp_path, 38, budget_s), timeout=60)  # the dead tuner's claim still stands
    assert waited["on_miss"].startswith("waited") and later["on_miss"] == "", (waited, later)
    assert kept >= 2 and waited["trials"] == later["trials"] == [kept] * 2  # nothing lost, nothing tuned again
    store = Store(str(tmp_path / "user.db"))
    best = store.best("interpreter", codegen.template_fingerprint("tl"))
    store.close()
    assert len(best) == 1 and waited["correct"] and later["correct"]
    assert json.loads(waited["knobs"]) == json.loads(later["knobs"]) == json.loads(best[0].knobs)  # the dead's best


def _trials(tmp_path, status=None) -> int:
    if not (tmp_path / "user.db").exists():
        return 0
    store = Store(str(tmp_path / "user.db"))
    try:
        return store.count_trials(status)
    finally:
        store.close()


def test_a_dead_tuners_claim_ends_the_wait_but_stands_until_it_expires(tmp_path, monkeypatch):
    from autoflash.db import store as stores

    problem = Problem(1, 2, 1, 40, 33, 32, True, "float16")
    store = Store(str(tmp_path / "user.db"))
    assert store.claim_problem(INTERPRETER, problem, "fwd", 60)
    assert store.problem_claim_live(INTERPRETER, problem, "fwd")
    assert store.claim_problem(INTERPRETER, problem, "bwd", 60)  # each direction its own claim
    store.release_problem(INTERPRETER, problem, "fwd")
    assert not store.problem_claim_live(INTERPRETER, problem, "fwd")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    monkeypatch.setattr(stores.os, "getpid", lambda: dead.pid)  # as the claim of a process that died
    assert store.claim_problem(INTERPRETER, problem, "fwd", 60)
    monkeypatch.undo()
    assert not store.problem_claim_live(INTERPRETER, problem, "fwd")  # no one waits for the dead
    assert not store.claim_problem(INTERPRETER, problem, "fwd", 60)  # nor tunes again before it would expire
    monkeypatch.setattr(stores, "_now", lambda: datetime.now(timezone.utc).replace(tzinfo=None) + timedelta(seconds=61))
    assert store.claim_problem(INTERPRETER, problem, "fwd", 60)  # expired: taken over
    store.close()

"""`autoflash tune --devices`: one tuner process per device on one database; together they time each variant once
and exactly --trials per problem, and each starts on its own part of the problems."""

import importlib
import io
import os
import subprocess
import sys
from contextlib import closing

import click
import pytest
from click.testing import CliRunner

from autoflash.cli import main
from autoflash.cli.tune import begin_at_part, in_turn, kernels_shared, taker
from autoflash.db.base import connect_readonly
from autoflash.db.store import Store
from autoflash.problem import Problem
from tuning import TWO_PROBLEMS, assert_sound, problems_file

tune_cli = importlib.import_module("autoflash.cli.tune")  # (autoflash.cli's `tune` is the click command)


def test_two_tuners_share_the_problems_and_time_each_variant_once(tmp_path):
    shapes, db, other = problems_file(tmp_path, TWO_PROBLEMS), tmp_path / "shared.db", tmp_path / "other_gpu.db"
    Store(str(other)).close()
    run = subprocess.run([sys.executable, "-m", "autoflash", "tune", "--interpret", "--devices", "0,1", "--shapes",
                          shapes, "--db", str(db), "--trials", "3", "--workers", "0", "--families", "tl",
                          "--warm-from", str(other)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "tuning on 2 devices (0, 1)" in run.stdout  # (each with --families tl and --warm-from: passed on)
    assert "[gpu 0] tuning 2 problem(s)" in run.stdout and "[gpu 1] tuning 2 problem(s)" in run.stdout
    rows = assert_sound(db)  # no variant timed twice
    per_problem = {}
    for _, key, _, _, _ in rows:
        per_problem[key] = per_problem.get(key, 0) + 1
    assert sorted(per_problem.values()) == [3, 3], per_problem
    with closing(connect_readonly(str(db))) as conn:  # each tuner reports both problems; SDPA is timed once each
        assert conn.execute("SELECT COUNT(*) FROM autoflash_baselines").fetchone() == (2,)


def test_each_tuner_begins_at_its_own_part():
    problems = list(range(7))
    assert begin_at_part(problems, "0/2") == problems
    assert begin_at_part(problems, "1/2") == [3, 4, 5, 6, 0, 1, 2]
    assert begin_at_part(problems, "2/3") == [4, 5, 6, 0, 1, 2, 3]


def test_tuners_parts_group_the_problems_that_share_kernels():
    """Several tuners: the problems in the order of the kernels they run (head dims interleaved in the file come
    apart), so that each tuner's part compiles its own; one tuner keeps the file's order."""
    problems = [Problem(4, 8, 8, s, s, d, False, "float16") for s in (512, 1024, 2048) for d in (64, 128)]
    assert begin_at_part(problems, "0/1", kernels_shared) == problems
    first, second = begin_at_part(problems, "0/2", kernels_shared), begin_at_part(problems, "1/2", kernels_shared)
    assert [p.head_dim for p in first[:3]] == [64] * 3 and [p.head_dim for p in second[:3]] == [128] * 3
    assert [p.seqlen_q for p in first[:3]] == [512, 1024, 2048]  # the file's order within a group


def test_tuners_that_meet_leapfrog_to_the_end():
    """Two tuners, the second's part three times the work of the first's: the first, done with its part, passes over
    the problem the second holds and tunes the next free one, and so on, where it used to queue behind the second on
    each problem (NOTES 142). Simulated: a problem takes its cost in time steps; one another tuner finished is
    reported at once; one held elsewhere is waited for."""
    cost = {0: 1, 1: 1, 2: 1, 3: 1, 4: 3, 5: 3, 6: 3, 7: 3}
    held, done, tuned_by = {}, set(), {}
    tuners = []
    for i in range(2):
        order = in_turn(begin_at_part(list(cost), f"{i}/2"), lambda job, i=i: held.get(job, i) == i)
        tuners.append({"order": order, "job": None})
    for now in range(40):
        for i, tuner in enumerate(tuners):
            job = tuner["job"]
            if job is not None and held.get(job) == i and now >= tuner["until"]:
                done.add(job)
                del held[job]
            if job is not None and job not in done:
                continue  # tuning it, or waiting for the tuner that holds it
            tuner["job"] = None
            for job in tuner["order"]:
                if job in done:
                    continue  # reported from the store at once
                tuner["job"] = job
                if job not in held:
                    held[job], tuned_by[job] = i, tuned_by.get(job, ()) + (i,)
                    tuner["until"] = now + cost[job]
                break
            else:
                tuner.setdefault("end", now)
    assert sorted(tuned_by) == list(cost) and all(len(by) == 1 for by in tuned_by.values()), tuned_by
    assert tuned_by[4] == tuned_by[5] == (1,) and {tuned_by[6], tuned_by[7]} == {(0,), (1,)}
    assert max(t["end"] for t in tuners) <= 10  # the second tuner alone would end at 12


def test_a_tuner_takes_what_no_live_tuner_holds(tmp_path, monkeypatch):
    from autoflash.db import store as stores
    from autoflash.gpu import INTERPRETER

    first, second = (Problem(1, 2, 2, s, s, 32, False, "float16") for s in (40, 41))
    store = Store(str(tmp_path / "shared.db"))
    take = taker(store, INTERPRETER)
    assert take((first, "fwd")) and not store.claim_problem(INTERPRETER, first, "fwd", 60)  # held by this process
    store.release_problem(INTERPRETER, first, "fwd")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    try:
        for pid, problem in ((other.pid, second), (dead.pid, first)):
            monkeypatch.setattr(stores.os, "getpid", lambda pid=pid: pid)  # as that process's claim
            assert store.claim_problem(INTERPRETER, problem, "fwd", 60)
        monkeypatch.undo()
        assert not take((second, "fwd"))  # a live tuner holds it
        assert take((second, "bwd"))  # (each direction its own)
        assert take((first, "fwd"))  # its holder died
    finally:
        other.kill()
        store.close()


@pytest.mark.parametrize("devices", ["0,0", "a,b", ","])
def test_bad_devices_are_one_line_errors(tmp_path, devices):
    result = CliRunner().invoke(main, ["tune", "--interpret", "--devices", devices, "--shapes",
                                       problems_file(tmp_path, TWO_PROBLEMS), "--db", str(tmp_path / "x.db")])
    assert result.exit_code == 2 and "distinct GPU indices" in result.output
    assert not (tmp_path / "x.db").exists()


def test_a_device_index_counts_among_the_visible_gpus(monkeypatch):
    """--devices 1 under CUDA_VISIBLE_DEVICES=4,5,6 is the machine's GPU 5: each tuner is started seeing its GPU alone
    (as its device 0), never the machine's GPU of the same index (a campaign on GPUs 1-3 once tuned on GPU 0)."""
    started = []

    class Child:
        def __init__(self, command, env, **_):
            started.append((env["CUDA_VISIBLE_DEVICES"], command[command.index("--devices") + 1]))
            self.stdout, self.stderr = iter(()), io.StringIO("")

        def wait(self):
            return 0

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    monkeypatch.setattr(tune_cli.subprocess, "Popen", Child)
    options = dict(shapes="p.yaml", gpu=None, trials=1, time_budget=None, mode="fwd", db="x.db", sampler="tpe",
                   seed=None, trial_timeout=180, interpret=False, families=None, warm_from=(), workers=1)
    assert tune_cli.fan_out(["0", "2"], options) == 0
    assert started == [("4", "0"), ("6", "0")]
    assert tune_cli.physical_device("1") == "5"
    with pytest.raises(click.BadParameter, match="GPU 3 is not visible: CUDA_VISIBLE_DEVICES=4,5,6 shows 3"):
        tune_cli.device_list("1,3", interpret=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert tune_cli.physical_device("3") == "3"


def test_a_failed_tuner_is_reported_by_its_error_not_its_progress_labels():
    stderr = ("b1 h8 s512 d64 fp16 fwd\nTraceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
              "    boom()\nRuntimeError: CUDA error: out of memory\n")
    said = tune_cli.failure(stderr, "1")
    assert said.startswith("RuntimeError: CUDA error: out of memory (its stderr: ")
    path = said.split("its stderr: ")[1].rstrip(")")
    assert open(path).read() == stderr
    os.remove(path)
    assert tune_cli.failure("Error: no such file\n", "0").startswith("Error: no such file (")
    assert tune_cli.failure("b1 h8 s512 d64 fp16 fwd\n", "0").startswith("no error message (")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_compile_pools_follow_the_cores_the_process_was_given():
    """Under taskset (a job given a share of a host's cores) the pools are sized from the cores the process may use,
    not the machine's count: a 1-GPU tuner on 32 of 64 cores once started 63 compile workers on them."""
    from autoflash.gpu import usable_cores
    from autoflash.tune.runner import default_compile_workers

    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(before)})
        assert usable_cores() == 1 and default_compile_workers(interpret=False) == 1
    finally:
        os.sched_setaffinity(0, before)
    assert usable_cores() == len(before)


def test_a_tuner_starts_no_more_compile_workers_than_a_batch_compiles(tmp_path, monkeypatch):
    """A family's batch compiles --trials variants at most: a tuner given 64 cores and --trials 5 starts 5 compile
    workers, not 63 (each one started costs an import of torch and a GPU context, NOTES 139), alone or one of
    --devices' tuners; --workers still says exactly."""
    import autoflash.gpu
    import autoflash.tune.runner

    shapes = problems_file(tmp_path, TWO_PROBLEMS)
    monkeypatch.setattr(autoflash.gpu, "usable_cores", lambda: 64)
    monkeypatch.setattr(autoflash.tune.runner, "default_compile_workers", lambda interpret: 63)
    started = []

    class Refused(Exception):
        pass

    def runner(**kwargs):
        started.append(kwargs["compile_workers"])
        raise Refused

    monkeypatch.setattr(autoflash.tune.runner, "Runner", runner)
    fanned = []
    monkeypatch.setattr(tune_cli, "fan_out", lambda devices, options: fanned.append(options["workers"]) or 0)
    for args, expected in ((["--trials", "5"], 5), ([], 60), (["--trials", "5", "--workers", "9"], 9),
                           (["--trials", "500"], 63)):
        started.clear()
        result = CliRunner().invoke(main, ["tune", "--interpret", "--shapes", shapes, "--db", str(tmp_path / "t.db"),
                                           *args])
        assert isinstance(result.exception, Refused) and started == [expected], (args, started, result.output)
    for args, expected in ((["--trials", "5"], 5), (["--trials", "50"], 31), (["--workers", "2"], 2)):
        fanned.clear()
        CliRunner().invoke(main, ["tune", "--interpret", "--devices", "0,1", "--shapes", shapes, *args])
        assert fanned == [expected], (args, fanned)

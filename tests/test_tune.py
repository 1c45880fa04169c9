"""The tuner end to end under Triton's interpreter: trials recorded, failures classified, resumes (concurrency and
faults: tests/reliability/)."""

import hashlib
import itertools
import json
import multiprocessing
import signal
import subprocess
import sys
import time
from datetime import timedelta

import optuna
import pytest
from click.testing import CliRunner

from sqlalchemy import update
from sqlalchemy.orm import Session

from autoflash import codegen
from autoflash.cli import main
from autoflash.db.models import SchemaVersion
from autoflash.db.store import SchemaMismatch, Store
from autoflash.gpu import INTERPRETER
from autoflash.families.tl.knobs import FwdKnobs
from autoflash.problem import Problem
from autoflash.tune import tuner
from autoflash.tune.runner import Runner
from autoflash.tune.search import search
from autoflash.tune.tuner import searched_space, tune_problem
from helpers import RecordingRunner

TINY = Problem(batch=1, heads_q=2, heads_kv=1, seqlen_q=40, seqlen_k=33, head_dim=32, causal=True, dtype="float16")


def shapes_file(tmp_path, entries: str, name="shapes.yaml") -> str:
    path = tmp_path / name
    path.write_text(f"problems:\n{entries}")
    return str(path)


def tune_command(*args):
    return [sys.executable, "-m", "autoflash", "tune", "--interpret", *args]


def test_cli_tunes_and_records_every_trial(tmp_path):
    shapes = shapes_file(tmp_path, "  - {batch: 1, heads_q: 2, heads_kv: 1, seqlen_q: 40, seqlen_k: 33, head_dim: 32,"
                                   " causal: [false, true]}\n")
    url = f"sqlite:///{tmp_path / 'tune.db'}"
    result = CliRunner().invoke(main, ["tune", "--interpret", "--shapes", shapes, "--trials", "4", "--db", url,
                                       "--seed", "0"])
    assert result.exit_code == 0, result.output
    assert "b1 h2/1 s40/33 d32 causal fp16" in result.output and "vs SDPA" in result.output
    store = Store(url)
    assert store.count_trials() == 8 and store.count_trials("ok") == 8
    best = store.best("interpreter", codegen.template_fingerprint("tl"))
    assert len(best) == 2 and all(b.median_ms > 0 and b.tflops > 0 for b in best)


def test_runner_classifies_every_failure_and_keeps_going():
    good = FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=2)
    variants = [
        FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=2, exp="exp"),  # raises
        FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=3, exp="exp"),  # wrong output
        FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=4, exp="exp", loads="tma"),  # worker dies
        FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=4, exp="exp"),  # hangs
        FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=2, exp="exp", loads="tma_host"),  # segfaults
        FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=3, exp="exp", loads="tma_host"),  # memory runs out
        good,
    ]
    heard = []
    with Runner(interpret=True, trial_timeout=20, loader="faulty_kernels:load") as runner:
        outcomes = runner.run(TINY, variants, on_outcome=lambda knobs, outcome: heard.append(knobs))
    assert [o.status for o in outcomes] == ["compile_error", "wrong_result", "crashed", "timeout", "crashed",
                                            "out_of_resources", "ok"]
    assert "forced compile failure" in outcomes[0].error and "relative error" in outcomes[1].error
    assert "exit code -11" in outcomes[4].error and "allocate" in outcomes[5].error
    assert outcomes[2].error == "worker died (exit code 3): faulty_kernels: an illegal memory access was encountered"
    assert outcomes[6].median_ms > 0 and sorted(map(str, heard)) == sorted(map(str, variants))


def test_the_runner_hands_variants_to_the_workers_that_are_up():
    """Workers start in the background (NOTES 144): variants go to those that are up, and a worker still starting
    holds none of them back."""
    variants = [FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=stages) for stages in (2, 3)]
    with Runner(interpret=True, compile_workers=2, trial_timeout=20) as runner:
        starting = runner.compilers[1]
        silent, kept_open = multiprocessing.Pipe()  # its pipe as while the worker imports: open, nothing said yet
        starting.conn, real = silent, starting.conn
        outcomes = runner.run(TINY, variants)
        starting.conn = real
    assert [o.status for o in outcomes] == ["ok", "ok"] and not starting.ready


def test_a_trial_that_reaches_its_worker_past_the_deadline_does_not_start(tmp_path, monkeypatch):
    """The worker checks the deadline as it would start the trial: a request that reached it late (a loaded host,
    where the runner's own check came just before the deadline) is answered "not started", runs nothing and has
    no outcome. Here the runner's check is made to miss the passed deadline."""
    import slow_kernels
    from autoflash.tune import runner as runner_module

    log = tmp_path / "starts"
    monkeypatch.setenv(slow_kernels.LOG_ENV, str(log))
    heard = []
    with Runner(interpret=True, trial_timeout=60, loader="slow_kernels:load") as runner:
        runner.wait_ready()  # (the workers fork from a server that imported the runner unpatched)
        monkeypatch.setattr(runner_module, "past", lambda deadline: False)
        outcomes = runner.run(TINY, [FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=s) for s in (2, 3)],
                              on_outcome=lambda knobs, outcome: heard.append(outcome), deadline=time.monotonic() - 1)
    assert outcomes == [None, None] and heard == [] and not log.exists()


def test_workers_get_the_environment_the_runner_has_when_they_start(tmp_path, monkeypatch):
    """Workers fork from a server that keeps the environment it started with; a variable set after that (here after
    the first runner) still reaches the workers a later runner starts."""
    import slow_kernels

    with Runner(interpret=True, trial_timeout=20) as runner:
        runner.wait_ready()
    log = tmp_path / "starts"
    monkeypatch.setenv(slow_kernels.LOG_ENV, str(log))
    with Runner(interpret=True, trial_timeout=60, loader="slow_kernels:load") as runner:
        [outcome] = runner.run(TINY, [FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=2)])
    assert outcome.status == "ok" and len(log.read_text().split()) == 1, outcome


def test_failed_variants_are_recorded_and_never_chosen(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'fail.db'}")
    with Runner(interpret=True, trial_timeout=20, loader="faulty_kernels:load") as runner:
        report = tune_problem(TINY, gpu=INTERPRETER, store=store, runner=runner, sampler="random", n_trials=10,
                              seed=3)
    failed = store.count_trials() - store.count_trials("ok")
    assert store.count_trials() == 10 and failed >= 1, "the seed should hit a forced failure"
    assert report.failures == failed and report.trials == 10
    assert report.best is not None and report.best.exp == "exp2", "every searched exp variant fails on purpose"


def test_no_trial_starts_past_the_deadline(tmp_path, monkeypatch):
    """A deadline ends the search within its batch: the variants not started by then are neither timed nor
    recorded, and the one under way finishes. Each variant here takes slow_kernels.SECONDS longer; the first batch
    (4 variants in the interpreter) would end past the deadline by more than one of them."""
    import slow_kernels

    log = tmp_path / "starts"
    monkeypatch.setenv(slow_kernels.LOG_ENV, str(log))
    store = Store(f"sqlite:///{tmp_path / 'deadline.db'}")
    with Runner(interpret=True, trial_timeout=60, loader="slow_kernels:load") as runner:
        deadline = time.monotonic() + 12
        report = tune_problem(TINY, gpu=INTERPRETER, store=store, runner=runner, sampler="random", n_trials=20,
                              seed=0, deadline=deadline, family_names=["tl"])
        ended = time.monotonic()
    starts = [float(line) for line in log.read_text().split()]
    assert starts and max(starts) < deadline + 0.25, [s - deadline for s in starts]  # (the worker notes it at once)
    assert ended < deadline + slow_kernels.SECONDS + 2, ended - deadline  # the trial under way: SECONDS and a run
    assert store.count_trials() == report.trials == len(starts)


def test_no_trial_of_a_family_starts_past_its_time_budget(tmp_path, monkeypatch):
    """`time_budget` (seconds per problem and family) ends a family's search as a deadline does: within its batch
    (4 variants of slow_kernels.SECONDS here), the trial under way finishing."""
    import slow_kernels

    log = tmp_path / "starts"
    monkeypatch.setenv(slow_kernels.LOG_ENV, str(log))
    store = Store(f"sqlite:///{tmp_path / 'budget.db'}")
    with Runner(interpret=True, trial_timeout=60, loader="slow_kernels:load") as runner:
        report = tune_problem(TINY, gpu=INTERPRETER, store=store, runner=runner, sampler="random", n_trials=20,
                              seed=0, time_budget=7, family_names=["tl"])
    starts = [float(line) for line in log.read_text().split()]  # (the budget runs from before the first start)
    assert starts and max(starts) < min(starts) + 7 + 0.25, [s - min(starts) for s in starts]
    assert store.count_trials() == report.trials == len(starts) < 4


def test_a_variant_started_compiling_by_the_deadline_is_timed_and_none_starts_after_it(tmp_path, monkeypatch):
    """With compile workers (as on a GPU), a variant a compile worker started by the deadline is checked and timed
    after it; the others are not run (None)."""
    import slow_kernels

    monkeypatch.setenv(slow_kernels.LOG_ENV, str(tmp_path / "starts"))
    variants = [FwdKnobs(block_m=64, block_n=32, num_warps=2, num_stages=stages) for stages in (2, 3, 4)]
    with Runner(interpret=True, compile_workers=1, trial_timeout=60, loader="slow_kernels:load") as runner:
        outcomes = runner.run(TINY, variants, deadline=time.monotonic() + 1)
    assert outcomes[0].status == "ok" and outcomes[0].median_ms > 0 and outcomes[1:] == [None, None]


def _count_until(url, n, proc, timeout=240):
    store, start = Store(url), time.monotonic()
    while store.count_trials() < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - start < timeout
        time.sleep(0.2)


def test_interrupted_run_resumes_without_redoing_trials(tmp_path):
    shapes = shapes_file(tmp_path, "  - {batch: 1, heads_q: 2, heads_kv: 1, seqlen_q: 40, seqlen_k: 33,"
                                   " head_dim: 32, causal: true}\n")
    url = f"sqlite:///{tmp_path / 'resume.db'}"
    args = tune_command("--shapes", shapes, "--trials", "10", "--db", url, "--seed", "1")
    # The run must hear SIGINT even when this test runs in a shell's background job, which starts with SIGINT
    # ignored (children inherit that).
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _count_until(url, 2, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode != 130 or "run the same command to resume" not in err:
        pytest.fail(f"exit code {proc.returncode}\nstdout:\n{out[-3000:]}\nstderr:\n{err[-3000:]}")
    first = Store(url).count_trials()
    assert 2 <= first < 10
    subprocess.run(args, check=True, capture_output=True, timeout=600)
    store = Store(url)
    assert store.count_trials() == 10, "the second run should add only the missing trials"
    assert len(store.finished("interpreter", TINY, codegen.template_fingerprint("tl"))) == 10


def test_database_of_another_schema_version_is_refused(tmp_path):
    url = f"sqlite:///{tmp_path / 'old.db'}"
    store = Store(url)
    with Session(store.engine) as s:
        s.execute(update(SchemaVersion).values(version=99))
        s.commit()
    with pytest.raises(SchemaMismatch, match="schema version 99.*new database"):
        Store(url)


def test_gpu_name_must_match_the_gpu_here(tmp_path):
    shapes = shapes_file(tmp_path, "  - {batch: 1, heads_q: 1, seqlen_q: 16, head_dim: 16}\n")
    result = CliRunner().invoke(main, ["tune", "--interpret", "--gpu", "h100", "--shapes", shapes,
                                       "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert result.exit_code != 0 and "does not match the GPU here" in result.output


def test_a_knob_added_since_the_winner_was_timed_is_tried_on_it():
    """upgraded_best: the winner's record lacks a knob added since; the guess is the winner with that knob as the
    default sets it, the winner's own choices kept. Nothing where the record already names every knob."""
    from dataclasses import replace

    from autoflash.families.gluon.knobs import BwdKnobs
    from autoflash.tune.trial import Outcome
    from autoflash.tune.tuner import upgraded_best

    default = BwdKnobs(dv_late=True)
    winner = {"block_m": 32, "dq_writer": True, "family": "gluon", "group_splits": 1, "num_buffers": 3,
              "warpgroups": 2}
    slower = dict(winner, num_buffers=2)
    done = {json.dumps(winner): Outcome("ok", median_ms=1.0), json.dumps(slower): Outcome("ok", median_ms=2.0),
            "{}": Outcome("wrong")}
    (guess,) = upgraded_best(done, default)
    assert guess == replace(BwdKnobs.from_dict(winner), dv_late=True, dq_turns=default.dq_turns)
    assert upgraded_best({default.to_json(): Outcome("ok", median_ms=1.0)}, default) == []
    assert upgraded_best({}, default) == [] and upgraded_best(done, None) == []


def test_a_complete_study_is_reported_without_building_its_space(tmp_path, monkeypatch):
    """A problem whose study already holds --trials searchable points (a resumed run, or a problem another tuner
    sharing the database finished) is reported from the store; with more trials wanted it is searched again."""
    store = Store(f"sqlite:///{tmp_path / 'done.db'}")
    with Runner(interpret=True, trial_timeout=60) as runner:
        first = tune_problem(TINY, gpu=INTERPRETER, store=store, runner=runner, sampler="random", n_trials=3, seed=0)
        built = []
        monkeypatch.setattr(tuner, "searched_space",  # (the gluon family's, empty here, is built to say why)
                            lambda family, *a: built.append(family.name == "tl") or searched_space(family, *a))
        again = tune_problem(TINY, gpu=INTERPRETER, store=store, runner=runner, sampler="random", n_trials=3, seed=0)
        assert not any(built) and store.count_trials() == 3
        # where the time went: the first run checked and timed its trials (the interpreter has no compile pool);
        # the report from the store timed nothing
        assert first.seconds["time"] > 0 and "compile" not in first.seconds and "time" not in again.seconds
        assert (again.best, again.best_ms, again.trials, again.failures) == (first.best, first.best_ms, 3,
                                                                               first.failures)
        more = tune_problem(TINY, gpu=INTERPRETER, store=store, runner=runner, sampler="random", n_trials=4, seed=0)
    assert sum(built) == 1 and store.count_trials() == 4 and more.trials == 4


def test_a_record_from_before_a_knob_existed_is_the_same_variant(tmp_path):
    """A trial recorded before a knob was added (its JSON lacks the field) names the kernel of the knob's default:
    `finished` reports it under this version's JSON and `claim` never hands it out again, so it is not timed
    twice."""
    store = Store(f"sqlite:///{tmp_path / 'old_knobs.db'}")
    knobs, fingerprint = FwdKnobs(), codegen.template_fingerprint("tl")
    old = json.loads(knobs.to_json())
    del old["head_dim_split"]  # (a later knob, at its default)
    store.record_trial(INTERPRETER, TINY, json.dumps(old, sort_keys=True), fingerprint, "ok", 1.0)
    assert list(store.finished("interpreter", TINY, fingerprint)) == [knobs.to_json()]
    other = FwdKnobs(num_warps=2 if knobs.num_warps != 2 else 4).to_json()
    assert store.claim(INTERPRETER, TINY, fingerprint, "fwd", [knobs.to_json(), other], 10) == ([other], [])


def test_finished_reports_a_variants_latest_trial_by_when_it_ran(tmp_path):
    """A merged database holds trials whose ids are not the order they ran in: `finished` reports each variant's
    latest trial by created_at, as dispatch counts it (NOTES 151)."""
    from autoflash.db.models import TrialRow
    store = Store(f"sqlite:///{tmp_path / 'merged.db'}")
    knobs, fingerprint = FwdKnobs(), codegen.template_fingerprint("tl")
    store.record_trial(INTERPRETER, TINY, knobs.to_json(), fingerprint, "ok", 1.0)
    store.record_trial(INTERPRETER, TINY, knobs.to_json(), fingerprint, "crashed", None, error="ran first")
    with Session(store.engine) as s:  # the second row (by id) ran an hour before the first
        first, second = s.query(TrialRow).order_by(TrialRow.id).all()
        second.created_at = first.created_at - timedelta(hours=1)
        s.commit()
    assert store.finished("interpreter", TINY, fingerprint)[knobs.to_json()].median_ms == 1.0


def test_report_tells_a_problem_that_failed_from_one_other_tuners_hold():
    from autoflash.cli.tune import format_reports
    failed = tuner.Report(TINY, "fwd", None, None, None, trials=3, failures=3, wall_s=1.0)
    held = tuner.Report(TINY, "fwd", None, None, None, trials=0, failures=0, wall_s=1.0)
    header, failed_line, held_line = format_reports([failed, held]).splitlines()
    assert failed_line.endswith("(no variant passed)") and held_line.endswith("other tuners hold its trials)")
    failed.seconds = dict(compile=12.3, time=3.5, wait=0.5)
    _, line, _ = format_reports([failed, held]).splitlines()
    assert header.split()[-5:] == ["s", "compile", "timing", "waits", "best"]
    assert line.split()[-7:-2] == ["1.0", "12.3", "3.5", "0.5", "(no"]


def test_a_worker_that_dies_starting_is_a_clear_error():
    from autoflash.tune import runner
    worker = runner._Worker("compile", (runner.DEFAULT_LOADER, True))
    worker.process.kill()  # (before it could import torch and say it is ready)
    with pytest.raises(RuntimeError, match=r"a compile worker failed to start \(exit code -9\)"):
        worker.wait_ready()
    worker.close()


def test_families_limits_the_search_to_the_families_named(tmp_path):
    """--families gluon under the interpreter: the one family named cannot run here, so the problem is recorded as
    having no valid variant of it, and no `tl` variant is timed."""
    store = Store(f"sqlite:///{tmp_path / 'only.db'}")
    with Runner(interpret=True, trial_timeout=60) as runner:
        report = tune_problem(TINY, gpu=INTERPRETER, store=store, runner=runner, sampler="random", n_trials=2,
                              seed=0, family_names=["gluon"])
    assert report.best is None and report.no_valid_variant.startswith("gluon: ") and store.count_trials() == 1


@pytest.mark.parametrize("names, mode, words", [("foo", "fwd", "foo: the tuner searches gluon, tl"),
                                                (",", "fwd", "',': the tuner searches"),
                                                ("fa1", "bwd", "fa1: the tuner searches gluon, tl")])
def test_families_refuses_names_the_tuner_does_not_search(tmp_path, names, mode, words):
    result = CliRunner().invoke(main, ["tune", "--interpret", "--shapes", shapes_file(tmp_path, "  - {batch: 1, "
                                       "heads_q: 2, seqlen_q: 40, head_dim: 32}\n"), "--families", names,
                                       "--mode", mode, "--db", f"sqlite:///{tmp_path / 'x.db'}"])
    assert result.exit_code == 2 and words in result.output, result.output


def test_another_gpus_winner_of_the_problem_is_a_first_guess(tmp_path):
    """Tuning an H100 beside a database of the H200's (`--warm-from`): the H200's winner of the same problem is
    timed right after the default, before any neighbour's; without that database it is not a guess at all."""
    from dataclasses import replace

    from autoflash import families
    from autoflash.gpu import INTERPRETER, KNOWN

    problem, h100, h200 = Problem(1, 4, 1, 1024, 1024, 64, True, "float16"), KNOWN["h100"], KNOWN["h200"]
    tl = next(f for f in families.searched("fwd") if f.name == "tl")
    default, (searched, _) = tl.default(problem, h100, "fwd"), searched_space(tl, problem, h100, "fwd")
    winner = next(knobs for name, choices in type(default).search_space().items() for value in choices
                  if (knobs := replace(default, **{name: value})) != default and searched(knobs.as_point()))
    fingerprint = codegen.template_fingerprint("tl", "fwd", problem.gates())
    theirs = Store(str(tmp_path / "h200.db"))
    theirs.record_trial(h200, problem, winner.to_json(), fingerprint, "ok", 0.5)
    # a test run's record under the interpreter, in the same database: its wall time on the CPU is no GPU's guess
    interpreted = next(knobs for name, choices in type(default).search_space().items() for value in choices
                       if (knobs := replace(default, **{name: value})) not in (default, winner)
                       and searched(knobs.as_point()))
    theirs.record_trial(INTERPRETER, problem, interpreted.to_json(), fingerprint, "ok", 0.1)
    assert tuner.warm_best([theirs], h100, problem, "tl") == [winner]
    batches = []
    for name, warm, guessed in (("alone.db", [], False), ("beside.db", [theirs], True)):
        batches.clear()
        store = Store(str(tmp_path / name))
        tuner.tune_problem(problem, gpu=h100, store=store, runner=RecordingRunner(batches), n_trials=2,
                           family_names=["tl"], warm_stores=warm, seed=0)
        store.close()
        assert batches[0][0] == default, batches
        assert (batches[0][1] == winner) is guessed and (winner in sum(batches, [])) is guessed, batches
    theirs.close()



def test_this_gpus_own_winner_in_a_warm_database_is_guessed_before_another_gpus(tmp_path):
    """A retune into a fresh database warm from the shipped one (campaign.sh FRESH=1, NOTES 112): the problem's
    earlier winner on this GPU is guessed first, then another GPU's."""
    from dataclasses import replace

    from autoflash import families
    from autoflash.gpu import KNOWN

    problem, h100, h200 = Problem(1, 4, 1, 1024, 1024, 64, True, "float16"), KNOWN["h100"], KNOWN["h200"]
    tl = next(f for f in families.searched("fwd") if f.name == "tl")
    default, (searched, _) = tl.default(problem, h100, "fwd"), searched_space(tl, problem, h100, "fwd")
    ours, theirs = [knobs for name, choices in type(default).search_space().items() for value in choices
                    if (knobs := replace(default, **{name: value})) != default and searched(knobs.as_point())][:2]
    fingerprint = codegen.template_fingerprint("tl", "fwd", problem.gates())
    shipped = Store(str(tmp_path / "shipped.db"))
    shipped.record_trial(h200, problem, theirs.to_json(), fingerprint, "ok", 0.5)
    shipped.record_trial(h100, problem, ours.to_json(), fingerprint, "ok", 0.7)
    assert tuner.warm_best([shipped], h100, problem, "tl") == [ours, theirs]
    assert tuner.warm_best([shipped], h200, problem, "tl") == [theirs, ours]
    shipped.close()

def test_a_family_stops_at_its_budget_or_the_deadline_whichever_comes_first():
    from autoflash.tune import earliest

    now = time.monotonic()
    assert earliest(None, None) is None and earliest(now + 5, None) == now + 5
    assert now + 9 <= earliest(None, 10) <= time.monotonic() + 10
    assert earliest(now + 100, 1) <= time.monotonic() + 1 and earliest(now + 1, 100) == now + 1


def test_tpe_told_its_space_proposes_what_optunas_own_tpe_does(monkeypatch):
    """The search's TPE returns the study's space instead of recomputing the intersection of every trial's (NOTES
    141): as every trial is asked with the same distributions, the proposals are Optuna's own, invalid points (told
    as pruned) and repeats included."""
    from autoflash.tune import search as searching

    space = searching.restricted_space(FwdKnobs.search_space(), lambda point: True)

    def digest(point, digits):
        return int(hashlib.md5(repr(searching._key(point)).encode()).hexdigest()[:digits], 16)

    def proposals(make_sampler):
        monkeypatch.setattr(searching, "make_sampler", make_sampler)
        order = []

        def evaluate(points):
            order.extend(searching._key(p) for p in points)
            return [digest(p, 6) / 1e6 for p in points]
        search(space, evaluate, study_name="same", seed=3, n_trials=24, batch_size=8,
               is_valid=lambda point: digest(point, 2) % 4 != 0)  # a quarter of the points invalid
        return order

    options = dict(multivariate=True, constant_liar=True, n_startup_trials=8)
    ours = proposals(lambda name, seed, space: searching._FixedSpaceTPE(space, seed=seed, **options))
    theirs = proposals(lambda name, seed, space: optuna.samplers.TPESampler(seed=seed, **options))
    assert len(ours) == 24 and ours == theirs


def test_tpes_random_first_points_are_drawn_without_asking_it():
    """TPE samples its first STARTUP_TRIALS points at random, and an invalid one was an ask of the sampler told as
    pruned (~4 ms; ~115 in a family's first batch, NOTES 143): the search draws them itself, valid and distinct, so
    that a fresh study's first batch asks nothing invalid; the batches after it are TPE's, as before."""
    from autoflash.tune import search as searching

    space = searching.restricted_space(FwdKnobs.search_space(), lambda point: True)

    def valid(point):
        return int(hashlib.md5(repr(searching._key(point)).encode()).hexdigest()[:2], 16) % 4 != 0

    batches = []

    def evaluate(points):
        batches.append([searching._key(p) for p in points])
        return [float(i + 1) for i in range(len(points))]
    study = search(space, evaluate, study_name="startup", seed=5, n_trials=12, batch_size=8,
                   is_valid=valid)
    first = study.trials[:8]
    assert len(batches[0]) == 8 == len(set(batches[0]))
    assert all(valid(searching._decode(t.params, space)) for t in first)
    assert [t.state for t in first] == [optuna.trial.TrialState.COMPLETE] * 8  # none told as pruned
    assert len(batches) == 2 and len(batches[1]) == 4
    assert any(t.state == optuna.trial.TrialState.PRUNED for t in study.trials[8:])  # TPE's asks, invalid ones too


def test_knobs_of_a_point_are_the_validated_ones():
    from autoflash.families.gluon.knobs import FwdKnobs as GluonFwd

    for knobs_class in (FwdKnobs, GluonFwd):
        for values in list(itertools.product(*knobs_class.search_space().values()))[::997]:
            point = dict(zip(knobs_class.search_space(), values))
            fast, checked = knobs_class.of_point(point), knobs_class(**point)
            assert fast == checked and hash(fast) == hash(checked) and fast.to_json() == checked.to_json()
            assert fast.template_context() == checked.template_context()


def test_a_runner_tells_every_worker_to_stop_before_it_waits_for_any():
    """Each worker takes ~1 s to free its GPU context on its way out: stopped and waited for one by one, a tuner's
    twelve took ~10 s at the end of every run (NOTES 140)."""
    said = []

    class Worker:
        def __init__(self, name):
            self.name = name

        def stop(self):
            said.append(("stop", self.name))

        def close(self):
            said.append(("close", self.name))

    runner = Runner.__new__(Runner)
    runner.compilers, runner.measurer = [Worker("c0"), Worker("c1")], Worker("m")
    runner.close()
    assert [kind for kind, _ in said] == ["stop"] * 3 + ["close"] * 3
    assert {name for _, name in said} == {"c0", "c1", "m"}

"""Tune on first use, opt-in: `autoflash.configure(tune="on-miss", budget_s=...)` or AUTOFLASH_TUNE=1
(AUTOFLASH_TUNE_BUDGET_S). The first call of a problem and direction without an exact tuned record runs a search
bounded by the budget, records every trial in the user database, and dispatch then reads the databases again; later
calls and processes find the record. The search compiles in worker processes (autoflash/tune/runner.py), at most
COMPILE_WORKERS of them, so that they start in seconds on any host; the budget counts from then on, for all kernel
families together (its setup included: the SDPA baseline, each family's space): no trial starts after it, and those
started finish (seconds: compiled in parallel, then checked and timed one by one). So the first call waits the
workers' start, the budget and the last trials. The fallback (what dispatch ran before) is timed first, whatever
the budget leaves, and its family searched first, so that the record the search leaves is never a slower choice
by the tuner's timing. The first call of a differentiable call tunes the backward too, by the same workers (a start
of seconds saved).

One choice per job. Data-parallel ranks must run the same variant of a problem, or their results differ
numerically; so a rank never times on its own. The first process to reach an untuned problem claims it in the
database (Store.claim_problem) and tunes; every other process that reaches it meanwhile waits for that claim to
end, then reads the database, as the tuner does: all run the variant the one search chose. The wait is bounded:
a claim lasts the budget plus a margin (worker start-up and one trial's timeout) and ends at once when its process
dies on this host; a crashed tuner's finished trials are committed one by one, so the waiting ranks all read the
same ones (its best trial, or the fallback where none passed). Its claim stands until it would have expired, so
that no other process of the job tunes the problem again meanwhile. Errors never reach the caller: a warning, once,
and the choice dispatch had (the fallback).

Why the others wait rather than run the fallback meanwhile: a call signature keeps the variant chosen at its first
call for the life of the process (autoflash/api.py), so a rank that ran the fallback meanwhile would keep running it,
apart from the tuner's choice. The one case left open: a search that overruns its claim (a trial still running at
the budget plus the margin) ends the wait, and the waiters read the trials recorded so far; the tuner's final choice
may be another. A dead tuner on another host (a shared PostgreSQL database) holds its waiters until its claim expires.

Without the tune extra (SQLAlchemy, Optuna) on-miss says once what to install and runs the fallback.
"""

import multiprocessing
import os
import time
import warnings
from dataclasses import dataclass

from autoflash import codegen, gpu as gpus
from autoflash.db.urls import configure_user_db, default_url
from autoflash.dispatch import Dispatcher
from autoflash.gpu import Gpu
from autoflash.knobs import Knobs
from autoflash.problem import Problem

MODES = ("off", "on-miss")
TUNE_ENV, BUDGET_ENV = "AUTOFLASH_TUNE", "AUTOFLASH_TUNE_BUDGET_S"
DEFAULT_BUDGET_S = 10.0  # seconds of search per problem and direction, all kernel families together
TRIALS = 60  # per kernel family at most; the budget usually ends the search first
TRIAL_TIMEOUT_S = 60.0  # one variant's compile, check and timing
STARTUP_S = 60.0  # the workers' start (importing torch), within a claim's margin
# The most compile workers on-miss starts (fewer on fewer cores): each is a process importing torch, whose start the
# first call waits for, and the search's batches are as wide as the pool; a budget of seconds has no use for a worker
# a core of a large host.
COMPILE_WORKERS = 8
POLL_S = 0.5  # how often a waiting process looks whether the claim ended


@dataclass(frozen=True)
class Settings:
    mode: str  # one of MODES
    budget_s: float


_settings: Settings | None = None
_outcomes: dict[tuple[Problem, str, str], str | None] = {}  # (problem, GPU family, direction) -> what on-miss did
_warned: set[str] = set()


def configure(*, tune: str | None = None, budget_s: float | None = None, db=None) -> None:
    """Tuning on first use for this process. `tune`: "on-miss" tunes each problem without an exact tuned record at
    its first call (and its backward at its first backward), "off" (the default) never tunes. `budget_s`: seconds
    of search per problem and direction, after which no trial starts. `db`: the database to record in and read
    first (a URL or a SQLite file path; default $AUTOFLASH_DB, else ~/.local/share/autoflash/tuning.db). Call it
    before the first attention call: a call signature keeps the variant chosen at its first call. Arguments left
    None stay as they are."""
    global _settings
    current = settings()
    if tune is not None and tune not in MODES:
        raise ValueError(f"configure(tune={tune!r}): use one of {', '.join(map(repr, MODES))}")
    if budget_s is not None and not (isinstance(budget_s, (int, float)) and 0 < budget_s < float("inf")):
        raise ValueError(f"configure(budget_s={budget_s!r}): give the seconds of search per problem, a positive number")
    if db is not None:
        configure_user_db(db)
    _settings = Settings(tune or current.mode, float(budget_s or current.budget_s))


def settings() -> Settings:
    """The configured settings, else those of AUTOFLASH_TUNE ("1" or "on-miss"; "0" or "off") and
    AUTOFLASH_TUNE_BUDGET_S, read at the first use."""
    global _settings
    if _settings is None:
        mode = os.environ.get(TUNE_ENV, "off").strip().lower()
        mode = {"1": "on-miss", "0": "off", "": "off"}.get(mode, mode)
        if mode not in MODES:
            raise ValueError(f"{TUNE_ENV}={os.environ[TUNE_ENV]!r}: use 1 (tune on first use) or 0 (never)")
        budget = os.environ.get(BUDGET_ENV, "")
        try:
            budget_s = float(budget) if budget else DEFAULT_BUDGET_S
        except ValueError:
            budget_s = -1.0
        if not 0 < budget_s < float("inf"):
            raise ValueError(f"{BUDGET_ENV}={budget!r}: give the seconds of search per problem, a positive number")
        _settings = Settings(mode, budget_s)
    return _settings


def settle(dispatcher: Dispatcher, problem: Problem, gpu: Gpu, directions: tuple[str, ...]) -> None:
    """Where on-miss tuning is on: for each of `directions`, wait for the process tuning `problem` in it, or tune it
    here where no database holds an exact record of it; then `dispatcher` reads the databases again (what it read
    before may predate that tuning). Once per process, problem and direction. The forward's first call of a
    differentiable call settles both directions: one start of the search's workers serves them."""
    todo = [d for d in directions if settings().mode != "off" and (problem, gpu.family, d) not in _outcomes]
    # A process that multiprocessing is starting runs its parent's script: its parent may be the tuner it would
    # wait for, waiting for it in turn.
    if not todo or getattr(multiprocessing.current_process(), "_inheriting", False):
        return
    chosen = {d: dispatcher.choice(problem, gpu, d) for d in todo}
    for direction, choice in chosen.items():
        if _exact(choice, problem) and choice.source != default_url():  # tuned in a shipped database: never tuned
            _outcomes[(problem, gpu.family, direction)] = None
    todo = [d for d in todo if (problem, gpu.family, d) not in _outcomes]
    if not todo:
        return
    try:
        from autoflash.db.store import Store  # the tune extra: SQLAlchemy, and Optuna for the search
        import optuna  # noqa: F401
    except ModuleNotFoundError as e:
        untuned = [d for d in todo if not _exact(chosen[d], problem)]
        for direction in todo:
            _outcomes[(problem, gpu.family, direction)] = \
                f"not tuned: the tune extra is missing ({e.name})" if direction in untuned else None
        if untuned:
            _warn_once("extra", "autoflash tunes on first use (AUTOFLASH_TUNE=1 or configure(tune='on-miss')) with "
                                f"the tune extra, which is not installed ({e.name} is missing): pip install "
                                "'autoflash[tune]'. Running untuned choices meanwhile.")
        return
    try:
        store = Store()
        try:
            with _Workers() as workers:
                for direction in todo:
                    _outcomes[(problem, gpu.family, direction)] = _tune_or_wait(
                        store, problem, gpu, direction, settings().budget_s, workers, chosen[direction].knobs)
        finally:
            store.close()
    except Exception as e:  # never the caller's failure: the fallback runs
        for direction in todo:
            _outcomes.setdefault((problem, gpu.family, direction), f"tuning failed ({type(e).__name__}: {e})")
        _warn_once(type(e).__name__, f"autoflash could not tune {problem.label()} ({', '.join(todo)}) on first use: "
                                     f"{type(e).__name__}: {e}. Running the untuned choice.")
    for direction in todo:
        dispatcher.forget(gpu.family, direction)


def outcome(dispatcher: Dispatcher, problem: Problem, gpu: Gpu, direction: str) -> str | None:
    """What tuning on first use did, or will do, for `problem`'s `direction` in this process (for explain)."""
    key = (problem, gpu.family, direction)
    if key in _outcomes:
        return _outcomes[key]
    if settings().mode == "off" or _exact(dispatcher.choice(problem, gpu, direction), problem):
        return None
    return f"on: the first {'call' if direction == 'fwd' else 'differentiable call or backward'} tunes it"


def _tune_or_wait(store, problem: Problem, gpu: Gpu, direction: str, budget_s: float, workers: "_Workers",
                  fallback: Knobs) -> str | None:
    """Wait for a live claim on the problem; else tune it where the store has no passed trial of it. What happened,
    for explain; None: nothing."""
    started = time.monotonic()
    if not store.problem_claim_live(gpu, problem, direction):
        if _has_trials(store, problem, gpu, direction):
            return None
        if store.claim_problem(gpu, problem, direction, budget_s + STARTUP_S + TRIAL_TIMEOUT_S):
            try:
                return _tune(store, problem, gpu, direction, budget_s, workers, fallback)
            finally:
                store.release_problem(gpu, problem, direction)
    while store.problem_claim_live(gpu, problem, direction):  # ends with the claim's expiry at the latest
        time.sleep(POLL_S)
    return f"waited {time.monotonic() - started:.1f} s for another process tuning it on first use"


class _Workers:
    """The search's worker processes, started by the first direction that tunes, shared by the next, stopped when
    the call's tuning ends (each holds a GPU context: none outlives it)."""

    def __init__(self):
        self.runner, self.start_s = None, 0.0

    def get(self):
        if self.runner is None:
            from autoflash.tune.runner import Runner, default_compile_workers

            started, interpret = time.monotonic(), gpus.interpreting()
            self.runner = Runner(interpret=interpret, trial_timeout=TRIAL_TIMEOUT_S,
                                 compile_workers=min(COMPILE_WORKERS, default_compile_workers(interpret)))
            self.runner.wait_ready()  # the budget counts from here
            self.start_s = time.monotonic() - started
        return self.runner

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.runner is not None:
            self.runner.close()


def _tune(store, problem: Problem, gpu: Gpu, direction: str, budget_s: float, workers: _Workers,
          fallback: Knobs) -> str | None:
    """Search `direction` for `budget_s` seconds from when the workers are up, `fallback` (what dispatch ran
    before) timed first whatever the budget leaves: the record it leaves is never a slower choice than it."""
    if _has_trials(store, problem, gpu, direction):  # tuned between the first look and the claim
        return None
    from autoflash.tune.tuner import tune_problem

    starting = workers.runner is None
    runner = workers.get()
    report = tune_problem(problem, gpu=gpu, store=store, runner=runner, direction=direction, n_trials=TRIALS,
                          deadline=time.monotonic() + budget_s, first=fallback)
    start = f" (and {workers.start_s:.1f} s starting the workers)" if starting else ""
    return f"tuned here on first use: {report.trials} trials ({report.failures} failed) in {report.wall_s:.1f} s{start}"


def _exact(chosen, problem: Problem) -> bool:
    return chosen.tuned is not None and chosen.tuned.problem == problem


def _has_trials(store, problem: Problem, gpu: Gpu, direction: str) -> bool:
    """Whether `problem` was tuned (a trial passed) under the current templates: by a tuner that finished between
    this process's first look and its claim, or one that died."""
    return any(trial.status == "ok" for fingerprint in codegen.current_fingerprints(direction, problem.gates()).values()
               for trial in store.finished(gpu.family, problem, fingerprint, direction).values())


def _warn_once(kind: str, message: str) -> None:
    if kind not in _warned:
        _warned.add(kind)
        warnings.warn(message, stacklevel=4)

"""Tune variants per problem and direction: search proposes, the runner measures, the store remembers.

Every trial is committed as soon as it is measured; a variant already timed for a problem (same
GPU family, direction and template fingerprint) is answered from the store instead of being timed again.
Each kernel family the tuner searches has a study of its own per problem and direction. Tuners that share a
database claim each variant in the store before timing it (Store.claim): together they time each variant once and
--trials variants per problem, whatever each one's sampler proposes.
"""

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from autoflash import codegen, families
from autoflash.db.store import Store
from autoflash.families.base import KernelFamily
from autoflash.gpu import INTERPRETER, Gpu
from autoflash.knobs import Knobs
from autoflash.problem import Problem
from autoflash.tune import earliest, past
from autoflash.tune.runner import Runner
from autoflash.tune.search import NOT_RUN, restricted_space, search


@dataclass
class Report:
    problem: Problem
    direction: str
    best: Knobs | None
    best_ms: float | None
    sdpa_ms: float | None
    trials: int
    failures: int
    wall_s: float
    no_valid_variant: str | None = None  # why no variant of any family could be tried (then nothing was)
    # where the wall seconds went: "compile" (the compile workers' batches), "time" (checking and timing, SDPA's
    # baseline too), "wait" (for variants another tuner was timing); the rest is the search's and the store's
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def tflops(self) -> float | None:
        return self.problem.tflops(self.direction, self.best_ms)

    @property
    def kv_tbps(self) -> float | None:
        """K and V read at least once a forward, per second (the figure that bounds a decode)."""
        return self.problem.kv_bytes() / self.best_ms * 1e-9 if self.best_ms and self.direction == "fwd" else None

    @property
    def speedup(self) -> float | None:
        return self.sdpa_ms / self.best_ms if self.best_ms and self.sdpa_ms else None


def baseline_name(direction: str) -> str:
    """The baseline row's backend: SDPA's forward, or its backward alone."""
    return "sdpa" if direction == "fwd" else f"sdpa_{direction}"


def _fingerprint(family: str, problem: Problem, direction: str) -> str:
    """The template fingerprint a family's trials of `problem` are recorded under."""
    return codegen.template_fingerprint(family, direction, problem.gates())


def study_name(gpu: Gpu, problem: Problem, family: str, direction: str = "fwd") -> str:
    return (f"autoflash:{gpu.family}:{problem.key()}:{direction}:{family}:"
            f"{_fingerprint(family, problem, direction)}")


def nearest_tuned(store: Store, gpu: Gpu, problem: Problem, family: str, direction: str = "fwd",
                  count: int = 3) -> list[Knobs]:
    """Best `family` variants of the tuned problems closest to `problem` (of the same kind: Problem.distance)."""
    fingerprint = _fingerprint(family, problem, direction)
    near = [(d, best.knobs) for best in store.best(gpu.family, fingerprint, direction)
            if best.problem != problem and (d := problem.distance(best.problem, direction)) is not None]
    return [families.knobs_from_json(direction, knobs) for _, knobs in sorted(near)[:count]]


def upgraded_best(done: dict, default: Knobs | None) -> list[Knobs]:
    """The problem's fastest finished trial (`done`: knobs JSON -> outcome) with the knobs its record predates
    set as the family's `default` sets them: after a knob joins a family, the winner with it is the first guess
    (the default alone would drop what the winner had found)."""
    ok = {k: t.median_ms for k, t in done.items() if t.status == "ok"}
    if default is None or not ok:
        return []
    best = json.loads(min(ok, key=ok.get))
    new = {name: value for name, value in json.loads(default.to_json()).items() if name not in best}
    try:
        return [type(default).from_dict(best | new)] if new else []
    except (TypeError, ValueError):  # a record of knobs this version does not know: no guess from it
        return []


def earlier_best(store: Store, gpu: Gpu, problem: Problem, direction: str = "fwd") -> list[Knobs]:
    """Winners of `problem` under earlier templates, still valid as knobs (Store.best skips the others): after a
    template change they are the best first guesses. They are timed again like any other point, never reused."""
    current = set(codegen.current_fingerprints(direction, problem.gates()).values())
    return [families.knobs_from_json(direction, best.knobs)
            for fingerprint in store.fingerprints(gpu.family, direction) if fingerprint not in current
            for best in store.best(gpu.family, fingerprint, direction) if best.problem == problem]


def warm_best(stores: Sequence[Store], gpu: Gpu, problem: Problem, family: str, direction: str = "fwd"
              ) -> list[Knobs]:
    """Winners of `problem` itself in the warm stores (`--warm-from`), guessed right after the default: this GPU's
    first (a retune into a fresh database, `campaign.sh` FRESH=1: its earlier winners timed anew, NOTES 112), then
    other GPUs' (the H200's when tuning an H100: the same problem and templates on a GPU of the same kind, NOTES C3,
    C4: the H100's winner in 23 of 246 backwards). Timed again like any other point, never reused. The
    interpreter's records (a test run's wall times on the CPU) say nothing of a GPU's winner: they are no guess."""
    fingerprint = _fingerprint(family, problem, direction)
    return [families.knobs_from_json(direction, best.knobs)
            for store in stores
            for other in sorted(store.gpu_families(), key=lambda name: name != gpu.family)
            if other != INTERPRETER.family
            for best in store.best(other, fingerprint, direction) if best.problem == problem]


def searched_space(family: KernelFamily, problem: Problem, gpu: Gpu, direction: str = "fwd"
                   ) -> tuple[Callable[[dict], bool], dict]:
    """(is_valid, space): the `family` variants the tuner searches and each knob's choices among them. They are
    the variants that run and are worth timing; where none is worth timing (backward at head dim 256 on the
    H100: the tiles that fit are small), every variant that runs. Every knob's choices are empty where none runs
    (without walking the space where the family cannot run the problem whatever its knobs)."""
    knobs_class = family.knobs[direction]
    if family.problem_violations(problem, gpu, direction):
        return (lambda point: False), {name: [] for name in knobs_class.search_space()}

    def runs(point) -> bool:
        return not family.violations(knobs_class.of_point(point), problem, gpu)

    def worth_timing(point) -> bool:
        return _worth_timing(family, knobs_class.of_point(point), problem, gpu)

    space = restricted_space(knobs_class.search_space(), worth_timing)
    if all(space.values()):
        return worth_timing, space
    return runs, restricted_space(knobs_class.search_space(), runs)


def _searchable(family: KernelFamily, direction: str, knobs: str, problem: Problem, gpu: Gpu) -> bool:
    """Whether a finished trial's knobs (JSON) are a point `searched_space` would search now (then the study
    counts it toward n_trials, whatever else it holds). Checked per trial: building the space checks every
    point of the family's (~30k, ~1 s)."""
    knobs_class = family.knobs[direction]
    try:
        point = knobs_class.from_json(knobs)
    except (TypeError, ValueError):  # knobs this version does not know
        return False
    return (all(getattr(point, name) in choices for name, choices in knobs_class.search_space().items())
            and _worth_timing(family, point, problem, gpu))


def _worth_timing(family: KernelFamily, knobs: Knobs, problem: Problem, gpu: Gpu) -> bool:
    """The variant runs the problem and is worth timing: what the tuner searches where any variant is."""
    return not family.violations(knobs, problem, gpu) and not family.not_worth_timing(knobs, problem, gpu)


# The knobs of a "no_valid_variant" row: it records the problem, not a variant.
NO_VARIANT = "{}"
CLAIM_POLL_S = 0.5  # how often a tuner looks for the results of variants another tuner is timing


def tune_problem(problem: Problem, *, gpu: Gpu, store: Store, runner: Runner, direction: str = "fwd",
                 sampler: str = "tpe", n_trials: int = 60, time_budget: float | None = None,
                 deadline: float | None = None, seed: int | None = None,
                 on_trial: Callable[[Knobs, float | None], None] = lambda k, v: None,
                 family_names: list[str] | None = None, first: Knobs | None = None,
                 warm_stores: Sequence[Store] = ()) -> Report:
    """Search `direction` variants of each of `family_names` (default: every family the tuner searches) for
    `problem` (`n_trials` per family) and record every trial. Trials already in the store count toward `n_trials`
    (a second run resumes) and are never timed again. A family with no variant that can run the problem is recorded
    as such. `time_budget`: seconds per family, after which no trial of it starts (those started finish).
    `deadline` (a time.monotonic() time): no trial starts after it (those started finish), each family searching an
    equal share of the time left to it. `first`: a variant timed before anything else, deadline or not, its family
    searched first (on-miss's fallback, what dispatch ran before: the search's choice is never slower).
    `warm_stores`: read-only stores whose other GPUs' winners of `problem` are first guesses, beside `store`'s."""
    started, before, waits = time.monotonic(), Counter(runner.seconds), Counter()
    # SDPA's time before the search, so that a tuner reaching the problem later finds it; after it where the
    # measuring worker is still starting, so that a runner's first problem compiles meanwhile (NOTES 144)
    baseline_first = runner.measuring
    sdpa_ms = _sdpa_baseline(problem, gpu, store, runner, direction) if baseline_first else None
    done, empty = {}, {}
    searched = [f for f in families.searched(direction) if family_names is None or f.name in family_names]
    # `first`'s family first; a family another tuner is timing now last, so that two tuners on one problem time
    # its families side by side, not one after the other (NOTES 133, 137)
    busy = {f.name for f in searched if store.claimed_by_others(gpu, problem, _fingerprint(f.name, problem, direction),
                                                                direction)}
    searched.sort(key=lambda f: (first is None or f.name != first.family, f.name in busy))
    for families_left, family in zip(range(len(searched), 0, -1), searched):
        found, why = _search_family(family, problem, gpu=gpu, store=store, runner=runner, direction=direction,
                                    sampler=sampler, n_trials=n_trials, seed=seed, on_trial=on_trial, first=first,
                                    deadline=earliest(_share(deadline, families_left), time_budget),
                                    warm_stores=(store, *warm_stores), waits=waits)
        done |= found
        if why:
            empty[family.name] = why
    if not baseline_first:
        sdpa_ms = _sdpa_baseline(problem, gpu, store, runner, direction)
    seconds = {name: round(t, 1) for name, t in (Counter(runner.seconds) - before + waits).items()}
    if len(empty) == len(searched):  # no family searched can run it: say so in the store
        for family, why in empty.items():
            fingerprint = _fingerprint(family, problem, direction)
            recorded = store.finished(gpu.family, problem, fingerprint, direction).get(NO_VARIANT)
            if recorded is None or recorded.error != why:
                store.record_trial(gpu, problem, NO_VARIANT, fingerprint, "no_valid_variant", error=why,
                                   direction=direction)
        return Report(problem, direction, None, None, None, trials=0, failures=0, wall_s=time.monotonic() - started,
                      no_valid_variant="; ".join(f"{family}: {why}" for family, why in empty.items()),
                      seconds=seconds)
    ok = {k: t for k, t in done.items() if t.status == "ok"}
    best = min(ok, key=lambda k: ok[k].median_ms, default=None)
    return Report(problem, direction, families.knobs_from_json(direction, best) if best else None,
                  ok[best].median_ms if best else None,
                  sdpa_ms, trials=len(done), failures=len(done) - len(ok), wall_s=time.monotonic() - started,
                  seconds=seconds)


def _share(deadline: float | None, families_left: int) -> float | None:
    """When the next of `families_left` families stops searching: after its equal share of the time left to
    `deadline`."""
    if deadline is None:
        return None
    now = time.monotonic()
    return now + (deadline - now) / families_left


def _sdpa_baseline(problem: Problem, gpu: Gpu, store: Store, runner: Runner, direction: str) -> float | None:
    """SDPA's time on `problem`, timed once per database, GPU family and torch version: read where a tuner
    recorded it (a resumed run; tuners sharing the database, each of which reports every problem), else timed now."""
    name = baseline_name(direction)
    sdpa_ms = store.baseline(gpu.family, problem, name, torch.__version__)
    if sdpa_ms is None:
        sdpa_ms = runner.sdpa_ms(problem, direction)
        if sdpa_ms is not None:
            store.record_baseline(gpu, problem, name, sdpa_ms)
    return sdpa_ms


def _search_family(family: KernelFamily, problem: Problem, *, gpu: Gpu, store: Store, runner: Runner,
                   direction: str, sampler: str, n_trials: int, deadline: float | None, seed: int | None,
                   on_trial: Callable[[Knobs, float | None], None], first: Knobs | None = None,
                   warm_stores: Sequence[Store] = (), waits: Counter) -> tuple[dict, str | None]:
    """One family's study for `problem` until `deadline` (a time.monotonic() time; None: n_trials alone): its
    finished trials (knobs JSON -> outcome), old and new, and why no variant of it can run the problem, or None."""
    knobs_class = family.knobs[direction]
    fingerprint = _fingerprint(family.name, problem, direction)
    done = store.finished(gpu.family, problem, fingerprint, direction)
    done.pop(NO_VARIANT, None)
    if n_trials and sum(_searchable(family, direction, knobs, problem, gpu) for knobs in done) >= n_trials:
        return done, None  # the study is complete (an earlier run's, or another tuner's): no space to build

    def record(knobs, outcome):  # committed one by one: an interrupt loses no finished trial
        store.record_trial(gpu, problem, knobs.to_json(), fingerprint, outcome.status, outcome.median_ms,
                           outcome.error, direction)
        done[knobs.to_json()] = outcome

    def evaluate(points, until=deadline):
        """Time the points no tuner has timed, as many as the store lets this one claim; wait for those another
        tuner is timing; NOT_RUN for the rest (n_trials are timed or being timed, or `until` came)."""
        wanted = [knobs_class(**p).to_json() for p in points]
        while (todo := [k for k in dict.fromkeys(wanted) if k not in done]) and not past(until):
            mine, theirs = store.claim(gpu, problem, fingerprint, direction, todo, n_trials)
            if mine:
                try:
                    runner.run(problem, [knobs_class.from_json(k) for k in mine], on_outcome=record, deadline=until)
                finally:
                    store.release_claims()
            elif not theirs:
                break
            else:
                waited = time.monotonic()
                time.sleep(CLAIM_POLL_S)
                waits["wait"] += time.monotonic() - waited
            done.update(store.finished(gpu.family, problem, fingerprint, direction))
        return [NOT_RUN if k not in done else done[k].median_ms if done[k].status == "ok" else None for k in wanted]

    is_valid, valid_space = searched_space(family, problem, gpu, direction)
    if not all(valid_space.values()):
        space = knobs_class.search_space()
        example = knobs_class(**{name: choices[0] for name, choices in space.items()})
        why = (f"none of the {math.prod(map(len, space.values()))} {direction} variants can run it on {gpu.name}; "
               f"e.g. {example.to_json()}: {'; '.join(family.violations(example, problem, gpu))}")
        return done, why

    if first is not None and first.family == family.name and is_valid(first.as_point()):
        evaluate([first.as_point()], until=None)  # whatever the deadline leaves: the search's choice is never slower
    default = family.default(problem, gpu, direction)
    guesses = [default, *upgraded_best(done, default), *earlier_best(store, gpu, problem, direction),
               *warm_best(warm_stores, gpu, problem, family.name, direction),
               *nearest_tuned(store, gpu, problem, family.name, direction)]
    warm = [k.as_point() for k in guesses if k is not None and k.family == family.name]
    known = [(knobs_class.from_json(k).as_point(), t.median_ms if t.status == "ok" else None) for k, t in done.items()]
    # The study lives in memory, told the store's finished trials (`known`): the store is what tuners share and
    # resume from. Optuna's tables in the database cost ~4 s a family on SQLite, most of a problem's tuning time
    # on the H200 beside compiling and timing (NOTES 139).
    search(valid_space, evaluate, study_name=study_name(gpu, problem, family.name, direction),
           sampler=sampler, seed=seed, n_trials=n_trials,
           deadline=deadline, warm_start=warm, is_valid=is_valid,
           batch_size=max(4, len(runner.compilers)), known=known, on_trial=lambda p, v: on_trial(knobs_class(**p), v))
    return done, None

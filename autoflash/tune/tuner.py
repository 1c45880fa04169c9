"""Tune variants per problem and direction: search proposes, the runner measures, the store remembers.

Every trial is committed as soon as it is measured; a variant already timed for a problem (same
GPU family, direction and template fingerprint) is answered from the store instead of being timed again.
Each kernel family the tuner searches has a study of its own per problem and direction.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from autoflash import codegen, families
from autoflash.db.store import Store
from autoflash.families.base import KernelFamily
from autoflash.gpu import Gpu
from autoflash.knobs import Knobs
from autoflash.problem import Problem
from autoflash.tune.runner import Runner
from autoflash.tune.search import restricted_space, search


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

    @property
    def tflops(self) -> float | None:
        return self.problem.flops(self.direction) / self.best_ms * 1e-9 if self.best_ms else None

    @property
    def speedup(self) -> float | None:
        return self.sdpa_ms / self.best_ms if self.best_ms and self.sdpa_ms else None


def baseline_name(direction: str) -> str:
    """The baseline row's backend: SDPA's forward, or its backward alone."""
    return "sdpa" if direction == "fwd" else f"sdpa_{direction}"


def study_name(gpu: Gpu, problem: Problem, family: str, direction: str = "fwd") -> str:
    return (f"autoflash:{gpu.family}:{problem.key()}:{direction}:{family}:"
            f"{codegen.template_fingerprint(family, direction)}")


def nearest_tuned(store: Store, gpu: Gpu, problem: Problem, family: str, direction: str = "fwd",
                  count: int = 3) -> list[Knobs]:
    """Best `family` variants of the tuned problems closest to `problem` (of the same kind: Problem.distance)."""
    fingerprint = codegen.template_fingerprint(family, direction)
    near = [(d, best.knobs) for best in store.best(gpu.family, fingerprint, direction)
            if best.problem != problem and (d := problem.distance(best.problem)) is not None]
    return [families.knobs_from_json(direction, knobs) for _, knobs in sorted(near)[:count]]


def earlier_best(store: Store, gpu: Gpu, problem: Problem, direction: str = "fwd") -> list[Knobs]:
    """Winners of `problem` under earlier templates, still valid as knobs (Store.best skips the others): after a
    template change they are the best first guesses. They are timed again like any other point, never reused."""
    current = set(codegen.current_fingerprints(direction).values())
    return [families.knobs_from_json(direction, best.knobs)
            for fingerprint in store.fingerprints(gpu.family, direction) if fingerprint not in current
            for best in store.best(gpu.family, fingerprint, direction) if best.problem == problem]


def tune_problem(problem: Problem, *, gpu: Gpu, store: Store, runner: Runner, direction: str = "fwd",
                 sampler: str = "tpe", n_trials: int = 60, time_budget: float | None = None, seed: int | None = None,
                 on_trial: Callable[[Knobs, float | None], None] = lambda k, v: None) -> Report:
    """Search `direction` variants of every searched kernel family for `problem` (`n_trials` per family) and
    record every trial. Trials already in the store count toward `n_trials` (a second run resumes) and are
    never timed again."""
    started = time.monotonic()
    done = {}
    for family in families.searched(direction):
        done |= _search_family(family, problem, gpu=gpu, store=store, runner=runner, direction=direction,
                               sampler=sampler, n_trials=n_trials, time_budget=time_budget, seed=seed,
                               on_trial=on_trial)
    sdpa_ms = runner.sdpa_ms(problem, direction)
    if sdpa_ms is not None:
        store.record_baseline(gpu, problem, baseline_name(direction), sdpa_ms)
    ok = {k: t for k, t in done.items() if t.status == "ok"}
    best = min(ok, key=lambda k: ok[k].median_ms, default=None)
    return Report(problem, direction, families.knobs_from_json(direction, best) if best else None,
                  ok[best].median_ms if best else None,
                  sdpa_ms, trials=len(done), failures=len(done) - len(ok), wall_s=time.monotonic() - started)


def _search_family(family: KernelFamily, problem: Problem, *, gpu: Gpu, store: Store, runner: Runner,
                   direction: str, sampler: str, n_trials: int, time_budget: float | None, seed: int | None,
                   on_trial: Callable[[Knobs, float | None], None]) -> dict:
    """One family's study for `problem`: its finished trials (knobs JSON -> outcome), old and new."""
    knobs_class = family.knobs[direction]
    fingerprint = codegen.template_fingerprint(family.name, direction)
    done = store.finished(gpu.family, problem, fingerprint, direction)

    def evaluate(points):
        variants = [knobs_class(**p) for p in points]
        def record(knobs, outcome):  # committed one by one: an interrupt loses no finished trial
            store.record_trial(gpu, problem, knobs.to_json(), fingerprint, outcome.status, outcome.median_ms,
                               outcome.error, direction)
            done[knobs.to_json()] = outcome
        new = list(dict.fromkeys(k for k in variants if k.to_json() not in done))
        if new:
            runner.run(problem, new, on_outcome=record)
        return [done[k.to_json()].median_ms if done[k.to_json()].status == "ok" else None for k in variants]

    def is_valid(point) -> bool:
        knobs = knobs_class(**point)
        return not family.violations(knobs, problem, gpu) and not family.not_worth_timing(knobs, problem, gpu)

    guesses = [families.default_knobs(problem, gpu, direction), *earlier_best(store, gpu, problem, direction),
               *nearest_tuned(store, gpu, problem, family.name, direction)]
    warm = [k.as_point() for k in guesses if k.family == family.name]
    known = [(knobs_class.from_json(k).as_point(), t.median_ms if t.status == "ok" else None) for k, t in done.items()]
    search(restricted_space(knobs_class.search_space(), is_valid), evaluate,
           study_name=study_name(gpu, problem, family.name, direction), storage=store.optuna_storage(),
           sampler=sampler, seed=seed, n_trials=n_trials, time_budget=time_budget, warm_start=warm,
           is_valid=is_valid, batch_size=max(4, len(runner.compilers)), known=known,
           on_trial=lambda p, v: on_trial(knobs_class(**p), v))
    return done

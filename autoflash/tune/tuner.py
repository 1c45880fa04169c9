"""Tune variants per problem and direction: search proposes, the runner measures, the store remembers.

Every trial is committed as soon as it is measured; a variant already timed for a problem (same
GPU family, direction and template fingerprint) is answered from the store instead of being timed again.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from autoflash import codegen
from autoflash.db.store import Store
from autoflash.defaults import default_knobs
from autoflash.dispatch import distance
from autoflash.gpu import Gpu
from autoflash.knobs import KNOBS, Knobs, not_worth_timing, violations
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


def study_name(gpu: Gpu, problem: Problem, direction: str = "fwd") -> str:
    return f"autoflash:{gpu.family}:{problem.key()}:{direction}:{codegen.template_fingerprint(direction)}"


def nearest_tuned(store: Store, gpu: Gpu, problem: Problem, direction: str = "fwd", count: int = 3) -> list[Knobs]:
    """Best variants of the tuned problems closest to `problem` (of the same kind; see dispatch.distance)."""
    near = [(d, knobs) for other, knobs, _ in store.best(gpu.family, codegen.template_fingerprint(direction), direction)
            if other != problem and (d := distance(problem, other)) is not None]
    return [KNOBS[direction].from_json(knobs) for _, knobs in sorted(near)[:count]]


def earlier_best(store: Store, gpu: Gpu, problem: Problem, direction: str = "fwd") -> list[Knobs]:
    """Winners of `problem` under earlier templates, still valid as knobs: after a template change
    they are the best first guesses. They are timed again like any other point, never reused."""
    current = codegen.template_fingerprint(direction)
    guesses = []
    for fingerprint in store.fingerprints(gpu.family, direction):
        for other, knobs, _ in store.best(gpu.family, fingerprint, direction):
            if fingerprint != current and other == problem:
                try:
                    guesses.append(KNOBS[direction].from_json(knobs))
                except ValueError:  # a knob that no longer exists, or a value no longer offered
                    pass
    return guesses


def tune_problem(problem: Problem, *, gpu: Gpu, store: Store, runner: Runner, direction: str = "fwd",
                 sampler: str = "tpe", n_trials: int = 60, time_budget: float | None = None, seed: int | None = None,
                 on_trial: Callable[[Knobs, float | None], None] = lambda k, v: None) -> Report:
    """Search `direction` variants for `problem` and record every trial. Trials already in the store
    count toward `n_trials` (a second run resumes) and are never timed again."""
    started = time.monotonic()
    knobs_class = KNOBS[direction]
    fingerprint = codegen.template_fingerprint(direction)
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
        return not violations(knobs, problem, gpu) and not not_worth_timing(knobs, problem, gpu)

    warm = [default_knobs(problem, gpu, direction), *earlier_best(store, gpu, problem, direction),
            *nearest_tuned(store, gpu, problem, direction)]
    known = [(knobs_class.from_json(k).as_point(), t.median_ms if t.status == "ok" else None) for k, t in done.items()]
    search(restricted_space(knobs_class.search_space(), is_valid), evaluate,
           study_name=study_name(gpu, problem, direction), storage=store.optuna_storage(), sampler=sampler,
           seed=seed, n_trials=n_trials, time_budget=time_budget, warm_start=[k.as_point() for k in warm],
           is_valid=is_valid, batch_size=max(4, len(runner.compilers)), known=known,
           on_trial=lambda p, v: on_trial(knobs_class(**p), v))
    sdpa_ms = runner.sdpa_ms(problem, direction)
    if sdpa_ms is not None:
        store.record_baseline(gpu, problem, baseline_name(direction), sdpa_ms)
    ok = {k: t for k, t in done.items() if t.status == "ok"}
    best = min(ok, key=lambda k: ok[k].median_ms, default=None)
    return Report(problem, direction, knobs_class.from_json(best) if best else None,
                  ok[best].median_ms if best else None,
                  sdpa_ms, trials=len(done), failures=len(done) - len(ok), wall_s=time.monotonic() - started)

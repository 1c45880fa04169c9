"""Tune forward variants per problem: search proposes, the runner measures, the store remembers.

Every trial is committed as soon as it is measured; a variant already timed for a problem (same
GPU family and template fingerprint) is answered from the store instead of being timed again.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

from autoflash import codegen
from autoflash.db.store import Store
from autoflash.defaults import default_knobs
from autoflash.dispatch import distance
from autoflash.gpu import Gpu
from autoflash.knobs import FwdKnobs, not_worth_timing, violations
from autoflash.problem import Problem
from autoflash.tune.runner import Runner
from autoflash.tune.search import restricted_space, search


@dataclass
class Report:
    problem: Problem
    best: FwdKnobs | None
    best_ms: float | None
    sdpa_ms: float | None
    trials: int
    failures: int
    wall_s: float

    @property
    def tflops(self) -> float | None:
        return self.problem.fwd_flops() / self.best_ms * 1e-9 if self.best_ms else None

    @property
    def speedup(self) -> float | None:
        return self.sdpa_ms / self.best_ms if self.best_ms and self.sdpa_ms else None


def study_name(gpu: Gpu, problem: Problem, direction: str = "fwd") -> str:
    return f"autoflash:{gpu.family}:{problem.key()}:{direction}:{codegen.template_fingerprint()}"


def nearest_tuned(store: Store, gpu: Gpu, problem: Problem, count: int = 3) -> list[FwdKnobs]:
    """Best variants of the tuned problems closest to `problem` (of the same kind; see dispatch.distance)."""
    near = [(d, knobs) for other, knobs, _ in store.best(gpu.family, codegen.template_fingerprint())
            if other != problem and (d := distance(problem, other)) is not None]
    return [FwdKnobs.from_json(knobs) for _, knobs in sorted(near)[:count]]


def tune_problem(problem: Problem, *, gpu: Gpu, store: Store, runner: Runner, sampler: str = "tpe",
                 n_trials: int = 60, time_budget: float | None = None, seed: int | None = None,
                 on_trial: Callable[[FwdKnobs, float | None], None] = lambda k, v: None) -> Report:
    """Search variants for `problem` and record every trial. Trials already in the store count
    toward `n_trials` (a second run resumes) and are never timed again."""
    started = time.monotonic()
    fingerprint = codegen.template_fingerprint()
    done = store.finished(gpu.family, problem, fingerprint)

    def evaluate(points):
        variants = [FwdKnobs(**p) for p in points]
        def record(knobs, outcome):  # committed one by one: an interrupt loses no finished trial
            store.record_trial(gpu, problem, knobs.to_json(), fingerprint, outcome.status, outcome.median_ms,
                               outcome.error)
            done[knobs.to_json()] = outcome
        new = list(dict.fromkeys(k for k in variants if k.to_json() not in done))
        if new:
            runner.run(problem, new, on_outcome=record)
        return [done[k.to_json()].median_ms if done[k.to_json()].status == "ok" else None for k in variants]

    def is_valid(point) -> bool:
        knobs = FwdKnobs(**point)
        return not violations(knobs, problem, gpu) and not not_worth_timing(knobs, problem)

    warm = [default_knobs(problem, gpu), *nearest_tuned(store, gpu, problem)]
    known = [(FwdKnobs.from_json(k).as_point(), t.median_ms if t.status == "ok" else None) for k, t in done.items()]
    search(restricted_space(FwdKnobs.search_space(), is_valid), evaluate,
           study_name=study_name(gpu, problem), storage=store.optuna_storage(), sampler=sampler,
           seed=seed, n_trials=n_trials, time_budget=time_budget, warm_start=[k.as_point() for k in warm],
           is_valid=is_valid, batch_size=max(4, len(runner.compilers)), known=known,
           on_trial=lambda p, v: on_trial(FwdKnobs(**p), v))
    sdpa_ms = runner.sdpa_ms(problem)
    if sdpa_ms is not None:
        store.record_baseline(gpu, problem, "sdpa", sdpa_ms)
    ok = {k: t for k, t in done.items() if t.status == "ok"}
    best = min(ok, key=lambda k: ok[k].median_ms, default=None)
    return Report(problem, FwdKnobs.from_json(best) if best else None, ok[best].median_ms if best else None,
                  sdpa_ms, trials=len(done), failures=len(done) - len(ok), wall_s=time.monotonic() - started)

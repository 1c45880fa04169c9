"""`KernelFamily`: what the tuner, dispatch, codegen and export know of a family of kernels.

A family is one way of writing the kernels: its templates and launcher in `templates/<name>/`, its knobs,
limits and defaults in `autoflash/families/<name>`. Callers go through this object and never ask which
family a variant belongs to.
"""

from collections.abc import Callable
from dataclasses import dataclass

from autoflash.gpu import Gpu
from autoflash.knobs import Knobs
from autoflash.problem import Problem


def _nothing(knobs: Knobs, problem: Problem, gpu: Gpu) -> list[str]:
    return []


def _runs_somewhere(problem: Problem, gpu: Gpu, direction: str) -> list[str]:
    return []


def _no_default(problem: Problem, gpu: Gpu, direction: str) -> Knobs | None:
    return None


def _as_is(knobs: Knobs, problem: Problem, gpu: Gpu) -> Knobs:
    return knobs


def _any_call(knobs: Knobs, *, tensors, deterministic: bool) -> tuple[Knobs, str]:
    return knobs, ""


@dataclass(frozen=True)
class KernelFamily:
    name: str  # also its folder under templates/ and the value of its knobs' `family` field
    knobs: dict[str, type[Knobs]]  # direction ("fwd", "bwd") -> the family's knobs class for it
    searched: bool  # whether the tuner searches it (a baseline family is selectable, never searched)
    # Why `knobs` cannot (or should not) run `problem` on `gpu`; empty when it can.
    violations: Callable[[Knobs, Problem, Gpu], list[str]]
    # Why no variant of a direction can run `problem` on `gpu`, whatever its knobs (`violations` says it too): the
    # tuner asks before walking the family's space.
    problem_violations: Callable[[Problem, Gpu, str], list[str]] = _runs_somewhere
    # Valid variants the tuner skips because they cannot win.
    not_worth_timing: Callable[[Knobs, Problem, Gpu], list[str]] = _nothing
    # The family's heuristic variant for a problem nothing was tuned for, or None.
    default: Callable[[Problem, Gpu, str], Knobs | None] = _no_default
    # Tuned knobs of a neighbouring problem, made valid for this one; None where the family cannot run it.
    fit: Callable[[Knobs, Problem, Gpu], Knobs | None] = _as_is
    # The knobs one call (its tensors, deterministic) can run, and a note on what changed, or "": None where
    # the family cannot run the call (dispatch then takes the default variant).
    for_call: Callable[..., tuple[Knobs | None, str]] = _any_call

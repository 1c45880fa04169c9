"""Kernel families, one registration line each: the tuner, dispatch, codegen and export reach every family
through these functions and `KernelFamily`, never by asking which one a variant is."""

import json

from autoflash.families import fa1, gluon, tl
from autoflash.families.base import KernelFamily
from autoflash.gpu import Gpu
from autoflash.knobs import InvalidKnobs, Knobs
from autoflash.problem import Problem

FAMILIES: dict[str, KernelFamily] = {f.name: f for f in (
    tl.FAMILY,
    gluon.FAMILY,
    fa1.FAMILY,
)}
DIRECTIONS = ("fwd", "bwd")
# For a problem nothing was tuned for, the first family in this order with a default for it (tuned records
# choose among all families by measured time). Gluon first: on Hopper its backward default ran 0.84-0.98x plain
# SDPA over the FA grid where tl's ran 0.57-0.68x (H200, NOTES G-bwd4), and its forward's tuned records beat
# tl's on the H100 from 512 queries (by 0-2% at worst: short causal) while its default ran window, softcap and
# ALiBi 1.09-1.45x faster than tl's (NOTES 58); below 512 queries the forward tries tl first (decode, 257
# tokens: its small tiles and key splits won). The backward keeps Gluon first at every length: timed on the
# database's short problems (decode, 128-1000 tokens), its default beat tl's on all but three (NOTES 58).
# Elsewhere (another GPU, the interpreter, paged caches, a score_mod) gluon has no default and tl's runs.
DEFAULT_ORDER = {"fwd": ("gluon", "tl", "fa1"), "bwd": ("gluon", "tl")}
SHORT_FWD_ORDER, SHORT_FWD_QUERIES = ("tl", "gluon", "fa1"), 512  # the forward's order below 512 queries


def default_order(problem: Problem, direction: str) -> tuple[str, ...]:
    short = direction == "fwd" and problem.seqlen_q < SHORT_FWD_QUERIES
    return SHORT_FWD_ORDER if short else DEFAULT_ORDER[direction]


def of(knobs: Knobs) -> KernelFamily:
    return FAMILIES[knobs.family]


def implementing(direction: str) -> list[KernelFamily]:
    """The families with kernels for `direction`."""
    return [f for f in FAMILIES.values() if direction in f.knobs]


def searched(direction: str) -> list[KernelFamily]:
    """The families the tuner searches for `direction`."""
    return [f for f in implementing(direction) if f.searched]


def knobs_from_json(direction: str, text: str) -> Knobs:
    """Knobs from their JSON (a database record, an export header). Records written before families had
    folders name a `loop_order` instead of a family: fa1 is its own family now, fa2 became `tl`."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"knobs must be a JSON object, got {text[:80]!r}")
    if "family" not in data:
        data["family"] = {"fa1": "fa1"}.get(data.pop("loop_order", "fa2"), "tl")
        if data["family"] == "fa1":
            data = {name: value for name, value in data.items() if name in fa1.FwdKnobs.choices()}
    return _from_dict(direction, data)


def current_json(direction: str, text: str) -> str:
    """A variant's knobs JSON as this version writes it: a record from before a knob existed lacks its field, and
    names the same kernel as the JSON with its default (a new knob's off position renders the old source, or the
    fingerprint moves), so the tuner never times it twice. As given where it names no family (a problem's "no
    valid variant" row, `{}`) or does not parse."""
    try:
        data = json.loads(text)
        return _from_dict(direction, data).to_json() if isinstance(data, dict) and "family" in data else text
    except (ValueError, TypeError):
        return text


def _from_dict(direction: str, data: dict) -> Knobs:
    family = FAMILIES.get(data["family"])
    if family is None or direction not in family.knobs:
        raise ValueError(f"no kernel family {data['family']!r} with {direction} kernels: this record comes from "
                         f"another autoflash version (families: {sorted(FAMILIES)})")
    return family.knobs[direction].from_dict(data)


def default_knobs(problem: Problem, gpu: Gpu, direction: str = "fwd", skip: frozenset[str] = frozenset()) -> Knobs:
    """The heuristic variant of the first family in `default_order` (but those in `skip`: a call they refused)
    that has one for `problem` on `gpu`."""
    for name in default_order(problem, direction):
        knobs = None if name in skip else FAMILIES[name].default(problem, gpu, direction)
        if knobs is not None:
            return knobs
    raise LookupError(f"no default {direction} variant for {problem} on {gpu.name}"
                      + (f" but the refused families' ({', '.join(sorted(skip))})" if skip else ""))


def violations(knobs: Knobs, problem: Problem, gpu: Gpu) -> list[str]:
    return of(knobs).violations(knobs, problem, gpu)


def not_worth_timing(knobs: Knobs, problem: Problem, gpu: Gpu) -> list[str]:
    return of(knobs).not_worth_timing(knobs, problem, gpu)


def check(knobs: Knobs, problem: Problem, gpu: Gpu) -> None:
    why = violations(knobs, problem, gpu)
    if why:
        raise InvalidKnobs(f"{knobs} cannot run {problem} on {gpu.family}: " + "; ".join(why))

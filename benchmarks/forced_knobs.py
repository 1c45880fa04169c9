"""Sweep a knob where nothing is tuned yet (variants, packed sequences, KV caches): `forced_knobs(change)` makes every forward
dispatch inside the block run its chosen knobs with `change` applied (e.g. {"kv_splits": 8}), so one benchmark run
times the variants side by side; a change naming a family ({"family": "gluon", "dynamic": true}) applies only where
that family was chosen, one that also says {"default": true} runs that family's default (with the other changes)
wherever it has one. {"direction": "bwd"} applies the change to the backward's dispatch instead ({"family": "gluon",
"default": true, "direction": "bwd"}: the Gluon backward's default). For measuring, not for use: the changed knobs
are not checked for validity."""

import contextlib
import json
from dataclasses import replace

from autoflash import api, varlen
from autoflash.dispatch import Dispatcher
from autoflash.families import FAMILIES


@contextlib.contextmanager
def forced_knobs(change: dict, seen: dict | None = None):
    """(`seen`, where given, gets each direction's knobs as they ran: knobs JSON by direction.)"""
    original = Dispatcher.for_call

    def for_call(self, problem, gpu, direction, tensors, deterministic=False):
        chosen = changed(self, problem, gpu, direction, tensors, deterministic)
        if seen is not None:
            seen[direction] = chosen.knobs.to_json()
        return chosen

    def changed(self, problem, gpu, direction, tensors, deterministic):
        chosen = original(self, problem, gpu, direction, tensors, deterministic)
        knobs = {name: value for name, value in change.items() if name not in ("default", "direction")}
        rest = {name: value for name, value in knobs.items() if name != "family"}
        if not change or direction != change.get("direction", "fwd"):
            return chosen
        if change.get("default"):
            default = FAMILIES[change["family"]].default(problem, gpu, direction)
            return chosen if default is None else replace(chosen, knobs=replace(default, **rest))
        applies = change.get("family", chosen.knobs.family) == chosen.knobs.family
        return replace(chosen, knobs=replace(chosen.knobs, **knobs)) if applies else chosen

    Dispatcher.for_call = for_call
    _forget_plans()  # plans are cached per call signature: build them again under the change
    try:
        yield
    finally:
        Dispatcher.for_call = original
        _forget_plans()


def _forget_plans():
    api._plans.clear()
    varlen._plans.clear()


def changes_of(argument: str) -> list[dict]:
    """--knobs '[{}, {"kv_splits": 8}]' -> the list of changes ({} : the dispatched knobs as they are)."""
    changes = json.loads(argument)
    if not isinstance(changes, list) or not all(isinstance(c, dict) for c in changes):
        raise SystemExit(f'--knobs takes a JSON list of objects such as \'[{{}}, {{"kv_splits": 8}}]\'; got {argument}')
    return changes


def label(name: str, change: dict) -> str:
    return name + (" " + json.dumps(change, sort_keys=True) if change else "")

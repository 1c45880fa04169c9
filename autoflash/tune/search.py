"""Search strategy: a function over a space and an objective. It knows nothing of SQL or Triton.

The space maps names to choices; `evaluate` takes a batch of points and returns each one's cost
(None where the point failed, NOT_RUN where it was not evaluated and the search should end: other
processes evaluate the rest of the study's trials); it may answer a point seen before from its own memory.
Optuna proposes the points; invalid points are told to Optuna as pruned without being evaluated,
so that TPE learns to avoid them, and so are failed points. Knobs whose choices are numbers are
searched as ordinals (the index into their choices), so that TPE sees 64 next to 128.
"""

import itertools
import random
from collections.abc import Callable, Sequence

import optuna

from autoflash.tune import SAMPLERS, past

Point = dict[str, object]
NOT_RUN = object()  # evaluate's answer for a point it did not evaluate


class _FixedSpaceTPE(optuna.samplers.TPESampler):
    """TPE over one space that every trial of the study shares (each is asked with `_distributions(space)`): the
    intersection of the trials' spaces, which Optuna recomputes over every trial at each ask (~40% of an ask's
    time, NOTES 141), is that space."""

    def __init__(self, space, **kwargs):
        super().__init__(**kwargs)
        self._space = {name: d for name, d in sorted(_distributions(space).items()) if not d.single()}

    def infer_relative_search_space(self, study, trial) -> dict:
        return dict(self._space)


# TPE's first trials, sampled at random (each knob on its own) before it models anything.
STARTUP_TRIALS = 8


def make_sampler(name: str, seed: int | None, space: dict[str, Sequence]) -> optuna.samplers.BaseSampler:
    """The study's sampler; its `random_trials`: how many finished trials the search draws its points for, at
    random as the sampler would (`_enqueue_random`), before it asks the sampler."""
    if name == "tpe":
        sampler = _FixedSpaceTPE(space, seed=seed, multivariate=True, constant_liar=True,
                                 n_startup_trials=STARTUP_TRIALS)
        sampler.random_trials = STARTUP_TRIALS
        return sampler
    if name in ("random", "grid"):  # grid: search() evaluates the valid points in order, never asking the sampler
        sampler = optuna.samplers.RandomSampler(seed=seed)
        sampler.random_trials = 0  # (its asks are at random already)
        return sampler
    raise ValueError(f"unknown sampler {name!r}: use one of {SAMPLERS}")


def valid_points(space: dict[str, Sequence], is_valid: Callable[[Point], bool]) -> list[Point]:
    return [p for p in (dict(zip(space, values)) for values in itertools.product(*space.values())) if is_valid(p)]


def search(space: dict[str, Sequence], evaluate: Callable[[list[Point]], list[float | None]], *,
           study_name: str, sampler: str = "tpe", seed: int | None = None, n_trials: int = 50,
           deadline: float | None = None, warm_start: Sequence[Point] = (),
           is_valid: Callable[[Point], bool] = lambda p: True, batch_size: int = 8,
           known: Sequence[tuple[Point, float | None]] = (),
           on_trial: Callable[[Point, float | None], None] = lambda p, v: None) -> optuna.Study:
    """Run a study (in memory, named `study_name`) until it holds `n_trials` distinct evaluated points (the `known`
    ones count, so an interrupted search resumes), the `deadline` (a time.monotonic() time) comes (no batch is asked for
    after it), or no new point turns up (the valid space is spent; a converged sampler is helped by random unseen
    points). A point proposed again is told its known cost; it does not count as a new trial. `known` points
    (evaluated before, by any process) join the study first, so that they count and TPE learns from them."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(study_name=study_name, sampler=make_sampler(sampler, seed, space), direction="minimize")
    if not all(space.values()):  # no valid point: nothing to propose
        return study
    _add_known(study, space, known)
    seen = {_key(_decode(t.params, space)) for t in study.get_trials(deepcopy=False) if t.state.is_finished()}
    grid = valid_points(space, is_valid) if sampler == "grid" else None
    for point in warm_start if grid is None else []:
        if _in_space(point, space) and is_valid(point) and _key(point) not in seen:
            study.enqueue_trial(_encode(point, space), skip_if_exists=True)
    values = {_key(_decode(t.params, space)): t.value for t in study.get_trials(deepcopy=False)
              if t.user_attrs.get("evaluated")}
    rng = random.Random(seed)
    while len(values) < n_trials:
        if past(deadline):
            break
        size = min(batch_size, n_trials - len(values))
        if grid is not None:  # the first points of the grid not yet evaluated, whatever earlier runs left undone
            batch, repeats = [(None, p) for p in grid if _key(p) not in values][:size], []
            if not batch:
                break
        else:
            _enqueue_random(study, space, is_valid, values, size, rng)
            batch, repeats = _ask_batch(study, space, is_valid, values, size)
        if not batch:  # the sampler proposes only known points: explore unseen ones at random
            unseen = [p for p in valid_points(space, is_valid) if _key(p) not in values]
            if not unseen:
                break  # the valid space is spent
            for point in rng.sample(unseen, min(size, len(unseen))):
                study.enqueue_trial(_encode(point, space))
            batch, repeats = _ask_batch(study, space, is_valid, values, size)
        costs = evaluate([point for _, point in batch])
        for (trial, point), value in zip(batch, costs):
            if value is NOT_RUN:
                if trial is not None:
                    _finish(study, trial, state=optuna.trial.TrialState.FAIL)
                continue
            values[_key(point)] = value
            if trial is None:
                _add_evaluated(study, space, point, value)
            else:
                _tell(study, trial, value)
            on_trial(point, value)
        for trial, key in repeats:
            if key in values:
                _tell(study, trial, values[key])
            else:
                _finish(study, trial, state=optuna.trial.TrialState.FAIL)
        if any(value is NOT_RUN for value in costs):
            break
    return study


def restricted_space(space: dict[str, Sequence], is_valid: Callable[[Point], bool]) -> dict[str, list]:
    """Each knob's values that occur in some valid point: the search never wanders where nothing runs."""
    seen = {name: set() for name in space}
    for point in valid_points(space, is_valid):
        for name, value in point.items():
            seen[name].add(value)
    return {name: [c for c in choices if c in seen[name]] for name, choices in space.items()}


def _tell(study, trial, value):
    """Tell an evaluated point's cost (None: failed, so TPE learns to avoid it, like an invalid point)."""
    if value is None:
        _finish(study, trial, state=optuna.trial.TrialState.PRUNED, evaluated=True)
    else:
        _finish(study, trial, value=value, evaluated=True)


def _finish(study, trial, *, value: float | None = None, state=None, evaluated: bool = False):
    if evaluated:
        trial.set_user_attr("evaluated", True)
    study.tell(trial, value, state=state)


def _ordinal(choices) -> bool:
    return len(choices) > 1 and all(isinstance(c, int) and not isinstance(c, bool) for c in choices)


def _distributions(space) -> dict:
    return {name: optuna.distributions.IntDistribution(0, len(choices) - 1) if _ordinal(choices)
            else optuna.distributions.CategoricalDistribution(list(choices)) for name, choices in space.items()}


def _encode(point: Point, space) -> dict:
    return {name: list(choices).index(point[name]) if _ordinal(choices) else point[name]
            for name, choices in space.items()}


def _decode(params: dict, space) -> Point:
    return {name: choices[params[name]] if _ordinal(choices) and name in params else params.get(name)
            for name, choices in space.items()}


def _add_known(study, space, known):
    in_study = {_key(_decode(t.params, space)) for t in study.get_trials(deepcopy=False)
                if t.user_attrs.get("evaluated")}
    for point, value in known:
        if _key(point) in in_study or not _in_space(point, space):
            continue
        _add_evaluated(study, space, point, value)
        in_study.add(_key(point))


def _add_evaluated(study, space, point: Point, value: float | None):
    """A point evaluated without asking the sampler, told to the study as any evaluated point is."""
    state = optuna.trial.TrialState.COMPLETE if value is not None else optuna.trial.TrialState.PRUNED
    study.add_trial(optuna.trial.create_trial(params=_encode(point, space), distributions=_distributions(space),
                                              value=value, state=state, user_attrs={"evaluated": True}))


def _enqueue_random(study, space, is_valid, values, size: int, rng: random.Random, tries: int = 10_000):
    """While the study has fewer finished trials than its sampler's `random_trials` (TPE's startup), the batch's new
    points are drawn here as the sampler would draw them (each knob at random, an invalid point drawn again), and
    queued: an invalid point costs a check here, and an ask of the sampler told as pruned there (~4 ms; ~115 of
    them in a TPE family's first batch, a third of the tuner's own time, NOTES 143)."""
    finished = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                        optuna.trial.TrialState.PRUNED))
    if len(finished) >= getattr(study.sampler, "random_trials", 0):  # (a sampler made elsewhere: none drawn here)
        return
    waiting, drawn = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))), set()
    for _ in range(tries):
        if waiting + len(drawn) >= size:
            return
        point = {name: rng.choice(choices) for name, choices in space.items()}
        key = _key(point)
        if key not in values and key not in drawn and is_valid(point):
            study.enqueue_trial(_encode(point, space))
            drawn.add(key)


def _ask_batch(study, space, is_valid, values, size: int, max_asks: int = 200):
    """Up to `size` new valid points. Invalid proposals are told as pruned at once; known points
    are told their cost at once (not timed again); repeats within the batch wait for its results."""
    batch, repeats, keys = [], [], set()
    for _ in range(max_asks):
        if len(batch) == size:
            break
        trial = study.ask(_distributions(space))
        point = _decode(trial.params, space)
        key = _key(point)
        if not is_valid(point):
            _finish(study, trial, state=optuna.trial.TrialState.PRUNED)
        elif key in values:
            _tell(study, trial, values[key])
        elif key in keys:
            repeats.append((trial, key))
        else:
            keys.add(key)
            batch.append((trial, point))
    return batch, repeats


def _in_space(point: Point, space) -> bool:
    return all(point.get(name) in choices for name, choices in space.items())


def _key(point: Point) -> tuple:
    return tuple(sorted(point.items()))

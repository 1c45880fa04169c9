"""Problem and direction (forward or backward) -> the variant to run: the user's tuning database,
then the one shipped in `tuning_db/`, then the heuristic default.

Within a source, the exact problem wins; failing that, the nearest tuned problem with the same
dtype, head dim and causal flag (and GQA ratio, in the backward: `Problem.distance`) within MAX_DISTANCE,
those with the call's own variants (packed sequences, paged caches, or neither) in every source before the
others. Only records of this GPU family and of the templates this code renders (every kernel family's current
fingerprint) count. Each source is read once per process (one query per kernel family); `autoflash.attention`
keeps the choice per call signature, so after the first call of a signature dispatch touches neither a
database nor this module.
"""

import threading
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from autoflash import codegen, families
from autoflash.db import records
from autoflash.db.base import StoreError
from autoflash.db.urls import as_url, user_url
from autoflash.gpu import Gpu
from autoflash.knobs import Knobs
from autoflash.problem import Problem
from autoflash.resources import data_dir


# Farther than this (log2 steps of lengths and batch x heads summed: 256x) a neighbour's winner did worse than
# the heuristic default on the H100 database, left one out (NOTES 59: backward min 0.376 -> 0.852).
MAX_DISTANCE = 8.0


@dataclass(frozen=True)
class Record:
    """The best tuned variant of one problem in one source."""
    problem: Problem
    knobs: Knobs
    median_ms: float
    tflops: float


@dataclass(frozen=True)
class Choice:
    knobs: Knobs
    source: str  # a database URL, or "default"
    tuned: Record | None  # the record the knobs come from
    reason: str


def shipped_urls() -> list[str]:
    """The databases shipped in tuning_db/ (one SQLite file per GPU family or batch of results)."""
    try:
        folder = data_dir("tuning_db")
    except FileNotFoundError:
        return []
    return [as_url(path) for path in sorted(Path(folder).glob("*.db"))]


def default_urls() -> list[str]:
    """Where dispatch looks, in order: the user's database (if any), then the shipped ones."""
    return [u for u in (user_url(), *shipped_urls()) if u]


def read_records(url: str, gpu_family: str, direction: str = "fwd") -> list[Record]:
    """Best `direction` records of `gpu_family` under every kernel family's current templates in the database
    at `url`, the fastest variant of each problem first (malformed rows skipped: db/base.py)."""
    try:
        best = records.best_trials(url, gpu_family, direction,
                                   {fingerprint for _, fingerprint in codegen.every_current_fingerprint(direction)})
    except StoreError as e:
        warnings.warn(f"autoflash ignores the tuning database {url}: {e}", stacklevel=2)
        return []
    chosen = [(b.problem, families.knobs_from_json(direction, b.knobs), b) for b in best]
    return sorted((Record(problem, knobs, b.median_ms, b.tflops) for problem, knobs, b in chosen
                   # measured on the kernels this problem renders now (a window problem's: with the window's code)
                   if codegen.is_current(b.fingerprint, knobs.family, direction, problem.gates())),
                  key=lambda r: r.median_ms)


def why_untuned(url: str, problem: Problem, gpu_family: str, direction: str = "fwd") -> str | None:
    """Why `problem`, tuned on `gpu_family` under the current templates in the database at `url`, has no working
    variant there, per kernel family; None where none says so."""
    try:
        reasons = [(family, records.why_unusable(url, gpu_family, direction, fingerprint, problem.key()))
                   for family, fingerprint in codegen.current_fingerprints(direction, problem.gates()).items()]
    except StoreError as e:
        warnings.warn(f"autoflash ignores the tuning database {url}: {e}", stacklevel=2)
        return None
    return "; ".join(f"{family}: {why}" for family, why in reasons if why) or None


def choose(problem: Problem, gpu: Gpu, sources: list[tuple[str, list[Record]]], direction: str = "fwd") -> Choice:
    """Exact match, then nearest neighbour with the problem's own variants (packed, paged or dense), then, for a
    packed or paged problem, nearest of any, each source by source; then the default. A dense problem never takes
    a packed one's knobs: tuned for the packed kernels' tables and loads, they ran a dense 32k GQA causal forward
    at 490 TFLOP/s where the Gluon default runs 657 (NOTES 58)."""
    for url, records in sources:
        for record in records:
            if record.problem == problem:
                return Choice(record.knobs, url, record, "exact problem tuned")
    for alike in (True, False) if problem.variants else (True, ):
        for url, records in sources:
            near = [(d, r) for r in records if (r.problem.variants == problem.variants or not alike)
                    and (d := problem.distance(r.problem, direction)) is not None and d <= MAX_DISTANCE]
            if near:
                d, record = min(near, key=lambda item: item[0])
                kind = "" if record.problem.variants == problem.variants else \
                    f"{'+'.join(sorted(record.problem.variants)).lower() or 'dense'} "
                return Choice(record.knobs, url, record, f"nearest tuned {kind}problem (log2 distance {d:.2f})")
    return _default(problem, gpu, direction, f"nothing comparable tuned within {MAX_DISTANCE:g} log2 steps")


class Dispatcher:
    """Reads each source once per GPU family and direction, then answers from memory; thread-safe."""

    def __init__(self, urls: list[str] | None = None):
        self._urls = urls
        self._sources: dict[tuple[str, str], list[tuple[str, list[Record]]]] = {}
        self._choices: dict[tuple[Problem, Gpu, str], Choice] = {}
        self._lock = threading.Lock()

    def urls(self) -> list[str]:
        return self._urls if self._urls is not None else default_urls()

    def sources(self, gpu_family: str, direction: str = "fwd") -> list[tuple[str, list[Record]]]:
        with self._lock:
            if (gpu_family, direction) not in self._sources:
                self._sources[gpu_family, direction] = [(url, read_records(url, gpu_family, direction))
                                                        for url in self.urls()]
            return self._sources[gpu_family, direction]

    def forget(self, gpu_family: str, direction: str) -> None:
        """Read `gpu_family`'s `direction` sources again at the next choice (a tuner just recorded new trials)."""
        with self._lock:
            self._sources.pop((gpu_family, direction), None)
            for key in [k for k in self._choices if k[1].family == gpu_family and k[2] == direction]:
                del self._choices[key]

    def why_untuned(self, problem: Problem, gpu: Gpu, direction: str = "fwd") -> str | None:
        """Why the first source that tuned `problem` without a working variant (none valid, or every trial
        failed) has none; None where no source did. For explain: it reads the databases at each call."""
        return next(filter(None, (why_untuned(url, problem, gpu.family, direction) for url in self.urls())), None)

    def choice(self, problem: Problem, gpu: Gpu, direction: str = "fwd") -> Choice:
        """The tuned (or default) `direction` knobs for `problem`, fitted to it (memoised)."""
        key = (problem, gpu, direction)
        chosen = self._choices.get(key)
        if chosen is None:
            sources = self.sources(gpu.family, direction)
            if gpu.family != "interpreter" and not any(records for _, records in sources):
                _notice_untuned(gpu, direction)
            chosen = choose(problem, gpu, sources, direction)
            # (an exact record runs as its search chose where it still runs; a neighbour's knobs are fitted)
            exact = chosen.tuned is not None and chosen.tuned.problem == problem \
                and not families.violations(chosen.knobs, problem, gpu)
            fitted = chosen.knobs if exact else families.of(chosen.knobs).fit(chosen.knobs, problem, gpu)
            chosen = replace(chosen, knobs=fitted) if fitted is not None else \
                _default(problem, gpu, direction, f"{chosen.reason}, whose family cannot run it")
            self._choices[key] = chosen
        return chosen

    def for_call(self, problem: Problem, gpu: Gpu, direction: str, tensors, deterministic: bool = False) -> Choice:
        """`choice`, adjusted to what one call's tensors and flags allow (its family says how, or that it cannot:
        then the default variant's family says)."""
        chosen, refused = self.choice(problem, gpu, direction), frozenset()
        knobs, note = families.of(chosen.knobs).for_call(chosen.knobs, tensors=tensors, deterministic=deterministic)
        while knobs is None:  # the next family's default (tl's runs every call)
            refused |= {chosen.knobs.family}
            chosen = _default(problem, gpu, direction, f"{chosen.reason}; {note}", refused)
            knobs, note = families.of(chosen.knobs).for_call(chosen.knobs, tensors=tensors, deterministic=deterministic)
        return replace(chosen, knobs=knobs, reason=f"{chosen.reason}; {note}") if note else chosen


_noticed: set[tuple[str, str]] = set()


def _notice_untuned(gpu: Gpu, direction: str) -> None:
    """Once per process, GPU family and direction: no database holds a tuned kernel for this GPU."""
    if (gpu.family, direction) not in _noticed:
        _noticed.add((gpu.family, direction))
        what = "forward" if direction == "fwd" else "backward"
        warnings.warn(f"autoflash has no tuned {what} kernels for {gpu.name} (GPU family '{gpu.family}'): it runs "
                      f"heuristic defaults. `autoflash tune --shapes your_shapes.yaml` tunes yours on this GPU.",
                      stacklevel=4)


def _default(problem: Problem, gpu: Gpu, direction: str, why: str, refused: frozenset[str] = frozenset()) -> Choice:
    return Choice(families.default_knobs(problem, gpu, direction, refused), "default", None,
                  f"{why}: heuristic default")

"""Problem and direction (forward or backward) -> the variant to run: the user's tuning database,
then the one shipped in `tuning_db/`, then the heuristic default.

Within a source, the exact problem wins; failing that, the nearest tuned problem with the same
dtype, head dim, causal flag and GQA ratio (lengths and batch x heads compared in log scale).
Only records of this GPU family and of the templates this code renders count. Each source is read
once per process (one query); `autoflash.attention` memoises the choice per problem, so after the
first call for a problem dispatch touches neither a database nor this module.
"""

import math
import os
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

from autoflash import codegen
from autoflash.defaults import default_knobs, fit
from autoflash.gpu import Gpu
from autoflash.knobs import KNOBS, Knobs
from autoflash.problem import Problem
from autoflash.resources import data_dir


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
    return [f"sqlite:///{path}" for path in sorted(Path(folder).glob("*.db"))]


def user_url() -> str | None:
    """The user's database if one exists: $AUTOFLASH_DB, else the default SQLite file when present."""
    from autoflash.db.store import DB_ENV, default_url

    url = default_url()
    if os.environ.get(DB_ENV) or not url.startswith("sqlite:///") or Path(url[len("sqlite:///"):]).exists():
        return url
    return None


def read_records(url: str, family: str, direction: str = "fwd") -> list[Record]:
    """Best `direction` records of `family` under the current templates in the database at `url` (one query)."""
    return _read(url, lambda store: [
        Record(problem, KNOBS[direction].from_json(knobs), trial.median_ms, trial.tflops)
        for problem, knobs, trial in store.best(family, codegen.template_fingerprint(direction), direction)], [])


def why_untuned(url: str, problem: Problem, family: str, direction: str = "fwd") -> str | None:
    """Why `problem`, tuned on `family` under the current templates in the database at `url`, has no working
    variant there (Store.unusable); None where it has one, or was not tuned."""
    fingerprint = codegen.template_fingerprint(direction)
    return _read(url, lambda store: store.unusable(family, fingerprint, direction, problem).get(problem.key()), None)


def _read(url: str, query, unreadable):
    """query(the database at `url`, read-only), or `unreadable` with a warning where it cannot be read."""
    from sqlalchemy.exc import SQLAlchemyError

    from autoflash.db.store import SchemaMismatch, Store  # SQLAlchemy only once a database is read

    try:
        return query(Store(url, readonly=True))
    except (SchemaMismatch, SQLAlchemyError, ValueError) as e:
        warnings.warn(f"autoflash ignores the tuning database {url}: {e}", stacklevel=3)
        return unreadable


def distance(a: Problem, b: Problem) -> float | None:
    """Log-scale distance between two problems of the same kind; None if of different kinds."""
    if (a.dtype, a.head_dim, a.causal, a.heads_q // a.heads_kv) != (b.dtype, b.head_dim, b.causal, b.heads_q // b.heads_kv):
        return None
    return sum(abs(math.log2(x) - math.log2(y)) for x, y in (
        (a.seqlen_q, b.seqlen_q), (a.seqlen_k, b.seqlen_k), (a.batch * a.heads_q, b.batch * b.heads_q)))


def choose(problem: Problem, gpu: Gpu, sources: list[tuple[str, list[Record]]], direction: str = "fwd") -> Choice:
    """Exact match, then nearest neighbour, source by source; then the default."""
    for url, records in sources:
        for record in records:
            if record.problem == problem:
                return Choice(record.knobs, url, record, "exact problem tuned")
    for url, records in sources:
        near = [(d, r) for r in records if (d := distance(problem, r.problem)) is not None]
        if near:
            d, record = min(near, key=lambda item: item[0])
            return Choice(record.knobs, url, record, f"nearest tuned problem (log2 distance {d:.2f})")
    return Choice(default_knobs(problem, gpu, direction), "default", None, "nothing comparable tuned: heuristic default")


class Dispatcher:
    """Reads each source once per GPU family and direction, then answers from memory; thread-safe."""

    def __init__(self, urls: list[str] | None = None):
        self._urls = urls
        self._sources: dict[tuple[str, str], list[tuple[str, list[Record]]]] = {}
        self._lock = threading.Lock()

    def urls(self) -> list[str]:
        return self._urls if self._urls is not None else [u for u in (user_url(), *shipped_urls()) if u]

    def sources(self, family: str, direction: str = "fwd") -> list[tuple[str, list[Record]]]:
        with self._lock:
            if (family, direction) not in self._sources:
                self._sources[family, direction] = [(url, read_records(url, family, direction)) for url in self.urls()]
            return self._sources[family, direction]

    def why_untuned(self, problem: Problem, gpu: Gpu, direction: str = "fwd") -> str | None:
        """Why the first source that tuned `problem` without a working variant (none valid, or every trial
        failed) has none; None where no source did. For explain: it reads the databases at each call."""
        return next(filter(None, (why_untuned(url, problem, gpu.family, direction) for url in self.urls())), None)

    def choice(self, problem: Problem, gpu: Gpu, direction: str = "fwd") -> Choice:
        """The tuned (or default) `direction` knobs for `problem`, fitted to it."""
        chosen = choose(problem, gpu, self.sources(gpu.family, direction), direction)
        return Choice(fit(chosen.knobs, problem, gpu), chosen.source, chosen.tuned, chosen.reason)

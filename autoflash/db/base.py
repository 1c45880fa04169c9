"""What the store (store.py, SQLAlchemy) and the reader (records.py, sqlite3) share, standard library only: the
schema version, the one error type, the plain records they return, and the rule that picks each problem's best
trial, skipping malformed rows.

A database is written by code of any version and read by any process that imports autoflash: a row that does
not describe a well-formed problem, variant and time (heads_kv 0, a dtype nobody knows, a knob stored as 64.0, an
ok trial without a time) is skipped with one warning per read, never used and never a crash.
"""

import json
import math
import sqlite3
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import quote

from autoflash._version import __version__
from autoflash.families import knobs_from_json
from autoflash.problem import Problem

# Bump on any change of the tables of models.py, adding the step from the version before; a database of a newer
# version is refused (SchemaMismatch), one of an older version is brought up to date by the store when it opens it
# for writing (losslessly: each step only adds), and read as it is otherwise.
SCHEMA_VERSION = 2
# version -> the SQL that takes a database of that version to the next
SCHEMA_STEPS = {
    1: ("ALTER TABLE autoflash_problems ADD COLUMN variants TEXT NOT NULL DEFAULT '{}'",),  # attention variants
}

DB_HINT = "--db / $AUTOFLASH_DB"
_SKIPPED_NAMED = 5  # rows a warning names; the rest are counted


class StoreError(RuntimeError):
    """A tuning database that cannot be used: the message is one line naming it and what to do."""


class SchemaMismatch(StoreError):
    pass


@dataclass(frozen=True)
class BestTrial:
    """The fastest variant of one problem under one template fingerprint (by its latest ok trial)."""
    problem: Problem
    knobs: str  # the variant's knobs, as JSON (Knobs.to_json)
    median_ms: float
    tflops: float
    fingerprint: str


@dataclass(frozen=True)
class Trial:
    """The outcome of one trial (status one of models.STATUSES)."""
    status: str
    median_ms: float | None
    error: str | None


def schema_mismatch(url: str, versions: list[int]) -> SchemaMismatch:
    found = ", ".join(map(str, versions)) or "unknown"
    return SchemaMismatch(
        f"the database {url} holds autoflash schema version {found}, this autoflash (version {__version__}) uses "
        f"{SCHEMA_VERSION}: install the autoflash that wrote it, or point {DB_HINT} at a new database and tune again")


def no_tables(url: str) -> SchemaMismatch:
    return SchemaMismatch(f"the database {url} holds no autoflash tables: point {DB_HINT} at a tuning database "
                          "(autoflash tune writes one)")


_ADVICE = (  # what the driver's message says -> what to do
    (("not a database", "malformed", "file is encrypted"),
     f"it is not a SQLite database, or a damaged one: point {DB_HINT} at another file, or move it away"),
    (("unable to open",), "check that the file exists and may be read (and its folder written, to tune)"),
    (("locked", "busy"), "another process holds it: try again when that one is done"),
    (("readonly", "read-only"), f"the file or its folder is read-only: copy it somewhere writable, or point {DB_HINT} "
                                "at another database"),
    (("disk i/o", "disk is full", "no space"), "the disk failed or is full: free space, or use another disk"),
)


def cannot_open(url: str, error: BaseException) -> StoreError:
    """The one-line error for a database that `error` (a driver's or SQLAlchemy's) keeps from being used."""
    text = " ".join(str(error).split()) or type(error).__name__
    advice = next((a for keys, a in _ADVICE if any(k in text.lower() for k in keys)),
                  "check the URL, the server and your access to it")
    return StoreError(f"cannot open the database {url}: {text[:200]}; {advice}")


def missing_driver(url: str, module: str) -> StoreError:
    """The one-line error for a database URL whose Python driver is not installed."""
    package = {"psycopg2": "psycopg2-binary"}.get(module, module)  # psycopg2: what SQLAlchemy 2.0's postgresql:// loads
    return StoreError(f"the database {url} needs the Python module '{module}', which is not installed: "
                      f"pip install {package}")


def connect_readonly(path: str) -> sqlite3.Connection:
    """The SQLite file at `path`, opened read-only: nothing is created or written, whatever the path holds
    (`?`, `#`, `%` are escaped in the URI SQLite reads)."""
    return sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, check_same_thread=False)


def best_per_problem(rows: Iterable[tuple], direction: str, source: str) -> list[BestTrial]:
    """The fastest variant per (problem, fingerprint) of `rows` (well-formed ok trials in the order they were run,
    each (trial id, batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, causal, dtype, variants JSON, knobs JSON,
    fingerprint, median_ms, tflops)), each variant by its latest trial: a retune times the last winner again beside
    its rivals, and that run's timings, not the fastest of every run's, decide between them (NOTES 151). Malformed
    rows are skipped, and named in one warning about `source`."""
    latest: dict[tuple[Problem, str, str], BestTrial] = {}
    skipped = []
    for trial_id, *shape, causal, dtype, variants, knobs, fingerprint, median_ms, tflops in rows:
        try:
            record = BestTrial(stored_problem(shape, causal, dtype, variants), _knobs(direction, knobs),
                               _time("median_ms", median_ms), _time("tflops", tflops), fingerprint)
        except ValueError as e:
            skipped.append(f"trial {trial_id} ({e})")
            continue
        latest[record.problem, fingerprint, record.knobs] = record
    best: dict[tuple[Problem, str], BestTrial] = {}
    for (problem, fingerprint, _), record in latest.items():
        if (problem, fingerprint) not in best or record.median_ms < best[problem, fingerprint].median_ms:
            best[problem, fingerprint] = record
    if skipped:
        more = f" and {len(skipped) - _SKIPPED_NAMED} more" if len(skipped) > _SKIPPED_NAMED else ""
        warnings.warn(f"autoflash skips {len(skipped)} unusable {direction} trial(s) of {source}: "
                      f"{'; '.join(skipped[:_SKIPPED_NAMED])}{more}", stacklevel=3)
    return list(best.values())


def stored_problem(shape: list, causal, dtype, variants: str) -> Problem:
    """The problem of a database row (its variants as JSON), validated: else a ValueError naming the field."""
    if causal not in (0, 1) or isinstance(causal, float):  # SQLite stores booleans as 0 and 1
        raise ValueError(f"field 'causal' must be true or false, got {causal!r}")
    try:
        fields = json.loads(variants)
    except (TypeError, ValueError):
        raise ValueError(f"field 'variants' must be a JSON object, got {str(variants)[:80]!r}") from None
    return Problem(*shape, bool(causal), dtype).with_stored_variants(fields).validate()


def _knobs(direction: str, text) -> str:
    try:
        knobs_from_json(direction, text)
    except (ValueError, TypeError) as e:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"knobs {str(text)[:80]!r}: {' '.join(str(e).split())[:160]}") from None
    return text


def _time(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"ok trial whose {name} is {value!r}, not a positive number")
    return float(value)


def unusable_reasons(outcomes: dict[str, list[tuple[str, str | None]]]) -> dict[str, str]:
    """Per problem key whose trials (status, error; in order) hold no ok one: why, as "no valid variant
    (reasons)" or "all N trials failed (statuses)"."""
    why = {}
    for key, rows in outcomes.items():
        trials = [status for status, _ in rows if status != "no_valid_variant"]
        if "ok" in trials:
            continue
        if trials:
            counts = ", ".join(f"{trials.count(status)} {status}" for status in sorted(set(trials)))
            why[key] = f"all {len(trials)} trials failed ({counts})"
        else:
            why[key] = f"no valid variant ({rows[-1][1]})"
    return why

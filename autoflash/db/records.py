"""The read path dispatch uses, without SQLAlchemy: the best trial of each tuned problem in one database, and
why a problem tuned without success has none.

SQLite files (the shipped tuning_db/, the user's database) are read with the standard library's sqlite3,
read-only, in one query. Other databases (postgresql://...) go through the SQLAlchemy store, which the `tune`
extra installs.
"""

import sqlite3
from collections.abc import Collection
from contextlib import closing

from autoflash.db.base import (SCHEMA_STEPS, SCHEMA_VERSION, BestTrial, StoreError, best_per_problem, cannot_open,
                               connect_readonly, no_tables, schema_mismatch, unusable_reasons)
from autoflash.db.urls import as_url, sqlite_path

_BEST = """
SELECT t.id, p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.causal, p.dtype, {variants},
       v.knobs, v.fingerprint, t.median_ms, t.tflops
FROM autoflash_trials t
JOIN autoflash_variants v ON v.id = t.variant_id
JOIN autoflash_problems p ON p.id = t.problem_id
JOIN autoflash_gpus g ON g.id = t.gpu_id
WHERE t.status = 'ok' AND g.family = ? AND v.direction = ? AND v.fingerprint IN ({fingerprints})
ORDER BY t.created_at, t.id
"""
# A schema-1 database (before attention variants) holds plain problems only.
_VARIANTS_COLUMN = {1: "'{}'", 2: "p.variants"}


_OUTCOMES = """
SELECT p.key, t.status, t.error
FROM autoflash_trials t
JOIN autoflash_variants v ON v.id = t.variant_id
JOIN autoflash_problems p ON p.id = t.problem_id
JOIN autoflash_gpus g ON g.id = t.gpu_id
WHERE g.family = ? AND v.direction = ? AND v.fingerprint = ? AND p.key = ?
ORDER BY t.id
"""


def best_trials(db: str, gpu_family: str, direction: str, fingerprints: Collection[str]) -> list[BestTrial]:
    """Per (problem, fingerprint) of `fingerprints`: the fastest variant of the ok `direction` trials on
    `gpu_family` in the database `db` (a URL or a SQLite file path), each variant by its latest trial. Malformed
    rows are skipped with one warning; a database that cannot be read raises StoreError."""
    url = as_url(db)
    if sqlite_path(url) is None:
        return _through_store(url, lambda store: [best for fingerprint in fingerprints
                                                  for best in store.best(gpu_family, fingerprint, direction)])
    fingerprints = list(fingerprints)
    rows = _select(url, lambda version: _BEST.format(variants=_VARIANTS_COLUMN[version],
                                                     fingerprints=", ".join("?" * len(fingerprints))),
                   (gpu_family, direction, *fingerprints))
    return best_per_problem(rows, direction, url)


def why_unusable(db: str, gpu_family: str, direction: str, fingerprint: str, problem_key: str) -> str | None:
    """Why the problem `problem_key`, tuned on `gpu_family` under `fingerprint` in the database `db`, has no ok
    trial there ("no valid variant (...)", "all N trials failed (...)"); None where it has one or was not tuned."""
    url = as_url(db)
    if sqlite_path(url) is None:
        return _through_store(url, lambda store: store.unusable_key(gpu_family, fingerprint, direction, problem_key))
    outcomes: dict[str, list] = {}
    for key, status, error in _select(url, lambda version: _OUTCOMES, (gpu_family, direction, fingerprint,
                                                                     problem_key)):
        outcomes.setdefault(key, []).append((status, error))
    return unusable_reasons(outcomes).get(problem_key)


def _select(url: str, query, parameters: tuple) -> list[tuple]:
    """Rows of one query (`query(schema version)`, its SQL) on the SQLite database at `url`, opened read-only after
    checking its schema: this version's, or an older one that a store would bring up to date (SCHEMA_STEPS)."""
    try:
        with closing(connect_readonly(sqlite_path(url))) as connection:
            tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "autoflash_trials" not in tables:
                raise no_tables(url)
            versions = [v for (v,) in connection.execute("SELECT version FROM autoflash_schema")] \
                if "autoflash_schema" in tables else []
            if len(versions) != 1 or versions[0] != SCHEMA_VERSION and versions[0] not in SCHEMA_STEPS:
                raise schema_mismatch(url, versions)
            return connection.execute(query(versions[0]), parameters).fetchall()
    except sqlite3.Error as e:
        raise cannot_open(url, e) from e


def _through_store(url: str, query):
    """query(the SQLAlchemy store of `url`, read-only): databases other than SQLite files."""
    try:
        from autoflash.db.store import Store
    except ModuleNotFoundError as e:
        if e.name != "sqlalchemy":
            raise
        raise StoreError(f"reading the database {url} needs SQLAlchemy: pip install 'autoflash[tune]' and the "
                         "database's driver (psycopg for PostgreSQL)") from None
    store = Store(url, readonly=True)
    try:
        return query(store)
    finally:
        store.close()

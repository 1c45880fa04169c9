"""The read path dispatch uses, without SQLAlchemy: the best trial of each tuned problem in one database.

SQLite files (the shipped tuning_db/, the user's database) are read with the standard library's sqlite3,
read-only, in one query. Other databases (postgresql://...) go through the SQLAlchemy store, which the `tune`
extra installs.
"""

import sqlite3
from collections.abc import Collection
from contextlib import closing

from autoflash.db.base import (SCHEMA_VERSION, BestTrial, StoreError, best_per_problem, cannot_open, connect_readonly,
                               no_tables, schema_mismatch)
from autoflash.db.urls import as_url, sqlite_path

_BEST = """
SELECT t.id, p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.causal, p.dtype, v.knobs,
       v.fingerprint, t.median_ms, t.tflops
FROM autoflash_trials t
JOIN autoflash_variants v ON v.id = t.variant_id
JOIN autoflash_problems p ON p.id = t.problem_id
JOIN autoflash_gpus g ON g.id = t.gpu_id
WHERE t.status = 'ok' AND g.family = ? AND v.direction = ? AND v.fingerprint IN ({})
"""


def best_trials(db: str, gpu_family: str, direction: str, fingerprints: Collection[str]) -> list[BestTrial]:
    """Per (problem, fingerprint) of `fingerprints`: the fastest ok `direction` trial on `gpu_family` in the
    database `db` (a URL or a SQLite file path). Malformed rows are skipped with one warning; a database that
    cannot be read raises StoreError."""
    url = as_url(db)
    path = sqlite_path(url)
    if path is None:
        return _through_store(url, gpu_family, direction, fingerprints)
    fingerprints = list(fingerprints)
    try:
        with closing(connect_readonly(path)) as connection:
            tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if "autoflash_trials" not in tables:
                raise no_tables(url)
            versions = [v for (v,) in connection.execute("SELECT version FROM autoflash_schema")] \
                if "autoflash_schema" in tables else []
            if versions != [SCHEMA_VERSION]:
                raise schema_mismatch(url, versions)
            rows = connection.execute(_BEST.format(", ".join("?" * len(fingerprints))),
                                      (gpu_family, direction, *fingerprints)).fetchall()
    except sqlite3.Error as e:
        raise cannot_open(url, e) from e
    return best_per_problem(rows, direction, url)


def _through_store(url: str, gpu_family: str, direction: str, fingerprints: Collection[str]) -> list[BestTrial]:
    try:
        from autoflash.db.store import Store
    except ModuleNotFoundError as e:
        if e.name != "sqlalchemy":
            raise
        raise StoreError(f"reading the database {url} needs SQLAlchemy: pip install 'autoflash[tune]' and the "
                         "database's driver (psycopg for PostgreSQL)") from None
    store = Store(url, readonly=True)
    try:
        return [best for fingerprint in fingerprints for best in store.best(gpu_family, fingerprint, direction)]
    finally:
        store.close()

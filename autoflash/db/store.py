"""The tuning database: the only module that speaks SQL through SQLAlchemy (records.py reads SQLite without it).

`Store(db)` opens (and creates) a database: SQLite at a per-user path by default, a SQLite file path, or any
SQLAlchemy URL such as postgresql+psycopg://user@host/db, so that many tuning machines share one.
SQLite serialises writers: several processes on one file work (WAL, a long busy timeout), but
over a network file system, or with many tuning machines, use PostgreSQL.
Its methods return plain dataclasses (db/base.py), never ORM rows, and raise StoreError, never a driver's error.
"""

import functools
import json
import os
import platform
import socket
import sqlite3
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import torch
import triton
from sqlalchemy import (URL, Integer, case, create_engine, delete, event, func, inspect, literal, select, text,
                        type_coerce, update)
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError
from sqlalchemy.orm import Session, undefer

from autoflash import families
from autoflash._version import __version__
from autoflash.db.base import (DB_HINT, SCHEMA_STEPS, SCHEMA_VERSION, BestTrial, SchemaMismatch, StoreError, Trial,
                               best_per_problem, cannot_open, connect_readonly, missing_driver, no_tables,
                               schema_mismatch, stored_problem, unusable_reasons)
from autoflash.db.models import (STATUSES, Base, BaselineRow, ClaimRow, GpuRow, ProblemClaimRow, ProblemRow,
                                 SchemaVersion, TrialRow, VariantRow)
from autoflash.db.urls import as_url, default_url, sqlite_path
from autoflash.gpu import Gpu
from autoflash.problem import PLAIN_FIELDS, Problem


BUSY_TIMEOUT_S = 120  # how long a SQLite writer waits for another process's write to finish


def _connect(path: str) -> sqlite3.Connection:
    """A SQLite connection that waits for other writers instead of failing."""
    return sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, check_same_thread=False)


def make_engine(url: str, readonly: bool = False):
    """An engine; SQLite gets WAL and a long busy timeout so that concurrent tuners wait, not fail.
    `readonly` opens a SQLite file without writing to it (a database shipped inside the package).
    SQLite connects to the file `sqlite_path` names, so that `?` or `#` in its path are never parsed."""
    path = sqlite_path(url)
    if path is None:
        return create_engine(url, pool_pre_ping=True)
    if readonly:
        return create_engine(URL.create("sqlite", database=path), creator=lambda: connect_readonly(path))
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(URL.create("sqlite", database=path), creator=lambda: _connect(path))

    @event.listens_for(engine, "connect")
    def _wal(connection, _record):
        connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
        # Switching to WAL answers "locked" at once, without waiting, while another process creates the file.
        for attempt in range(200):
            try:
                connection.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as e:
                if "locked" not in str(e) or attempt == 199:
                    raise
                time.sleep(0.05)
    return engine


def _store_errors(method):
    """The method, raising StoreError (one line naming the database and what to do) for what the database, its
    driver or SQLAlchemy report."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except StoreError:
            raise
        except ModuleNotFoundError as e:  # a URL whose driver (psycopg2, ...) is not installed
            raise missing_driver(self.url, e.name) from e
        except DBAPIError as e:
            raise cannot_open(self.url, e.orig) from e
        except (SQLAlchemyError, sqlite3.Error, OSError) as e:
            raise cannot_open(self.url, e) from e
    return wrapper


class Store:
    @_store_errors
    def __init__(self, db: str | None = None, readonly: bool = False):
        """The database `db` (a URL or a SQLite file path; default: default_url()); `readonly` never writes."""
        self.url = as_url(db) if db else default_url()
        self.engine = make_engine(self.url, readonly)
        self.version = SCHEMA_VERSION  # an older one where a read-only store reads a database as it is
        try:
            self._ensure_schema(readonly)
        except BaseException:
            self.close()  # a refused database keeps no connection open
            raise

    @_store_errors
    def check_writable(self) -> None:
        """Commit one write now (the schema version row, unchanged): a read-only file or folder, a full disk or a
        read-only account is a StoreError here, before any tuning starts, not after the first trial."""
        with self.engine.begin() as connection:
            connection.execute(update(SchemaVersion).values(version=SchemaVersion.version))

    def close(self) -> None:
        """Close the database's connections (the store opens new ones if used again)."""
        self.engine.dispose()

    def _ensure_schema(self, readonly: bool):
        ours = {t.name for t in Base.metadata.sorted_tables}
        for attempt in range(50):
            tables = set(inspect(self.engine).get_table_names())
            if readonly and not tables & ours:
                raise no_tables(self.url)
            if not tables & ours:
                self._create_schema()
                continue
            with Session(self.engine) as s:
                versions = s.scalars(select(SchemaVersion.version)).all() if SchemaVersion.__tablename__ in tables \
                    else []
            if len(versions) == 1 and versions[0] in SCHEMA_STEPS:
                if readonly:
                    self.version = versions[0]
                    return
                self._upgrade(versions[0])
                continue
            if versions == [SCHEMA_VERSION]:
                if not readonly:
                    Base.metadata.create_all(self.engine)  # tables added in this version, if any
                return
            if versions or attempt == 49:
                raise schema_mismatch(self.url, versions)
            time.sleep(0.1)  # tables without a version row: another process may be creating them
        raise SchemaMismatch(f"the database {self.url}: the autoflash tables did not appear; point {DB_HINT} at a "
                             "new database")

    def _upgrade(self, version: int):
        """Take the database from `version` to SCHEMA_VERSION, step by step, in one transaction (a process that
        loses the race to do it finds it done)."""
        with self.engine.begin() as connection:
            if connection.execute(select(SchemaVersion.version)).scalars().all() != [version]:
                return
            for step in range(version, SCHEMA_VERSION):
                for statement in SCHEMA_STEPS[step]:
                    connection.execute(text(statement))
            connection.execute(update(SchemaVersion).values(version=SCHEMA_VERSION))

    def _create_schema(self):
        """The tables and the version row in one transaction; a process that loses the race to create
        them finds them made."""
        try:
            with self.engine.begin() as connection:
                Base.metadata.create_all(connection)
                connection.execute(SchemaVersion.__table__.insert().values(version=SCHEMA_VERSION))
        except IntegrityError:
            pass
        except (OperationalError, ProgrammingError) as e:
            if "already exists" not in str(e):
                raise

    # -- rows that identify a trial --------------------------------------------------------------
    def _get_or_create(self, s: Session, model, unique: dict, extra: dict | None = None):
        row = s.scalars(select(model).filter_by(**unique)).first()
        if row is not None:
            return row
        try:
            with s.begin_nested():
                row = model(**unique, **(extra or {}))
                s.add(row)
            return row
        except IntegrityError:  # a concurrent writer inserted the same row
            return s.scalars(select(model).filter_by(**unique)).one()

    def _gpu(self, s, gpu: Gpu) -> GpuRow:
        return self._get_or_create(s, GpuRow, dict(family=gpu.family, name=gpu.name,
                                                   capability=f"{gpu.capability[0]}.{gpu.capability[1]}"),
                                   dict(multiprocessors=gpu.multiprocessors))

    def _problem(self, s, p: Problem) -> ProblemRow:
        return self._get_or_create(s, ProblemRow, dict(key=p.key()),
                                   dict({name: getattr(p, name) for name in PLAIN_FIELDS},
                                        variants=json.dumps(p.stored_variants(), sort_keys=True)))

    def _variant(self, s, knobs_json: str, fingerprint: str, direction: str) -> VariantRow:
        return self._get_or_create(s, VariantRow, dict(direction=direction, knobs=knobs_json, fingerprint=fingerprint))

    # -- writing -----------------------------------------------------------------------------------
    @_store_errors
    def record_trial(self, gpu: Gpu, problem: Problem, knobs_json: str, fingerprint: str, status: str,
                     median_ms: float | None = None, error: str | None = None, direction: str = "fwd") -> None:
        """One finished trial, committed at once: a crash later loses nothing recorded before it."""
        if status not in STATUSES:
            raise ValueError(f"status {status!r} is not one of {STATUSES}")
        with Session(self.engine) as s:
            problem_row = self._problem(s, problem)
            s.flush()
            # Under the claims' lock: a claimer reads trials and claims in two statements, and a trial recorded
            # (its claim deleted) between them would be in neither: one trial too many (PostgreSQL, read committed)
            _lock(s, problem_row.id)
            row = TrialRow(gpu=self._gpu(s, gpu), problem=problem_row,
                           variant=self._variant(s, knobs_json, fingerprint, direction), status=status,
                           median_ms=median_ms,
                           tflops=problem.flops(direction) / median_ms * 1e-9 if median_ms else None,
                           error=error, triton_version=triton.__version__, torch_version=torch.__version__,
                           autoflash_version=__version__, host=_host(), created_at=_now())
            s.add(row)
            s.flush()
            s.execute(delete(ClaimRow).where(ClaimRow.gpu_family == gpu.family, ClaimRow.problem_id == row.problem_id,
                                             ClaimRow.variant_id == row.variant_id))
            s.commit()

    @_store_errors
    def claim(self, gpu: Gpu, problem: Problem, fingerprint: str, direction: str, knobs: list[str], limit: int
              ) -> tuple[list[str], list[str]]:
        """Claim for this process the variants (knobs JSON) of `knobs` that `problem` has no trial of on `gpu`'s
        family and no other tuner claims, as many as keep its trials and claims within `limit`: (claimed, claimed
        by others). Claimers and recorders of one problem take turns (`_lock`: its row), so that concurrent
        tuners never time a variant twice nor overshoot `limit`. A claim of a process gone from this host, or older
        than CLAIM_EXPIRY (another host's), is dropped: a killed tuner's variants are timed by the next one."""
        with Session(self.engine) as s:
            problem_id = self._problem(s, problem).id
            variants = {k: self._variant(s, k, fingerprint, direction).id for k in knobs}
            s.commit()
        with Session(self.engine) as s:
            _lock(s, problem_id)
            timed = {families.current_json(direction, k) for k in s.scalars(
                self._trials(gpu.family, fingerprint, direction, VariantRow.knobs)
                .where(ProblemRow.id == problem_id, TrialRow.status != "no_valid_variant"))}
            claims = s.execute(self._claims(gpu.family, fingerprint, direction, ClaimRow.id, VariantRow.knobs,
                                            ClaimRow.host, ClaimRow.pid, ClaimRow.created_at)
                               .where(ClaimRow.problem_id == problem_id)).all()
            abandoned = [c.id for c in claims if _abandoned(c.host, c.pid, c.created_at)]
            if abandoned:
                s.execute(delete(ClaimRow).where(ClaimRow.id.in_(abandoned)))
            taken = timed | {families.current_json(direction, c.knobs) for c in claims if c.id not in abandoned}
            current = {k: families.current_json(direction, k) for k in variants}
            mine = [k for k in variants if current[k] not in taken][:max(0, limit - len(taken))]
            s.add_all(ClaimRow(gpu_family=gpu.family, problem_id=problem_id, variant_id=variants[k], host=_host(),
                               pid=os.getpid(), created_at=_now()) for k in mine)
            s.commit()
        return mine, [k for k in variants if current[k] in taken and current[k] not in timed]

    @_store_errors
    def claimed_by_others(self, gpu: Gpu, problem: Problem, fingerprint: str, direction: str) -> bool:
        """Whether another live tuner holds claims on `problem`'s variants of this fingerprint (it is timing that
        family's study now): a tuner reaching the problem searches its other families first (tune_problem)."""
        with Session(self.engine) as s:
            claims = s.execute(self._claims(gpu.family, fingerprint, direction, ClaimRow.host, ClaimRow.pid,
                                            ClaimRow.created_at)
                               .join(ProblemRow, ProblemRow.id == ClaimRow.problem_id)
                               .where(ProblemRow.key == problem.key())).all()
        return any((c.host, c.pid) != (_host(), os.getpid()) and not _abandoned(c.host, c.pid, c.created_at)
                   for c in claims)

    @_store_errors
    def release_claims(self) -> None:
        """Drop this process's claims (a tuner that stops before timing what it claimed)."""
        with Session(self.engine) as s:
            s.execute(delete(ClaimRow).where(ClaimRow.host == _host(), ClaimRow.pid == os.getpid()))
            s.commit()

    @_store_errors
    def claim_problem(self, gpu: Gpu, problem: Problem, direction: str, seconds: float) -> bool:
        """Claim `problem`'s `direction` on `gpu`'s family for this process for `seconds` (tuning on first use; a
        tuner's turn, cli/tune.py): True when this process holds it now, False when another claim stands. A claim
        stands until it is released or `seconds` after it was made, even where its process died: until then no other
        process tunes the problem again, so that the ranks of one job all read the choice of the one that tuned (or
        the same fallback)."""
        with Session(self.engine) as s:
            problem_id = self._problem(s, problem).id
            s.commit()
        with Session(self.engine) as s:
            _lock(s, problem_id)
            s.execute(delete(ProblemClaimRow).where(*self._problem_claim(gpu, problem_id, direction),
                                                    ProblemClaimRow.expires_at <= _now()))
            if s.scalars(select(ProblemClaimRow.id).where(*self._problem_claim(gpu, problem_id, direction))).first():
                return False
            now = _now()
            s.add(ProblemClaimRow(gpu_family=gpu.family, problem_id=problem_id, direction=direction, host=_host(),
                                  pid=os.getpid(), created_at=now, expires_at=now + timedelta(seconds=seconds)))
            s.commit()
        return True

    @_store_errors
    def problem_claim_live(self, gpu: Gpu, problem: Problem, direction: str) -> bool:
        """Whether a process alive (on another host: whose claim has not expired) holds `claim_problem`'s claim."""
        with Session(self.engine) as s:
            claim = s.execute(select(ProblemClaimRow.host, ProblemClaimRow.pid, ProblemClaimRow.expires_at)
                              .join(ProblemRow, ProblemRow.id == ProblemClaimRow.problem_id)
                              .where(ProblemRow.key == problem.key(), ProblemClaimRow.gpu_family == gpu.family,
                                     ProblemClaimRow.direction == direction)).first()
        return claim is not None and claim.expires_at > _now() and not _abandoned(claim.host, claim.pid, _now())

    @_store_errors
    def release_problem(self, gpu: Gpu, problem: Problem, direction: str) -> None:
        """Drop this process's `claim_problem` claim."""
        with Session(self.engine) as s:
            problem_id = self._problem(s, problem).id
            s.execute(delete(ProblemClaimRow).where(*self._problem_claim(gpu, problem_id, direction),
                                                    ProblemClaimRow.host == _host(),
                                                    ProblemClaimRow.pid == os.getpid()))
            s.commit()

    @staticmethod
    def _problem_claim(gpu: Gpu, problem_id: int, direction: str) -> tuple:
        return (ProblemClaimRow.gpu_family == gpu.family, ProblemClaimRow.problem_id == problem_id,
                ProblemClaimRow.direction == direction)

    @_store_errors
    def record_baseline(self, gpu: Gpu, problem: Problem, backend: str, median_ms: float) -> None:
        with Session(self.engine) as s:
            s.add(BaselineRow(gpu=self._gpu(s, gpu), problem=self._problem(s, problem), backend=backend,
                              median_ms=median_ms, torch_version=torch.__version__, host=_host(),
                              created_at=_now()))
            s.commit()

    @_store_errors
    def merge(self, source: "Store", fingerprints: dict[str, str] | None = None) -> tuple[int, int]:
        """Copy the trials and baselines of `source` that this database lacks (same GPU, problem,
        variant, host and time), with their original versions and times: how results of many tuning
        machines, or the shipped tuning_db/, are gathered. `fingerprints` (direction -> fingerprints)
        keeps only trials of those templates. Returns (trials, baselines) copied."""
        copied = [0, 0]
        with Session(source.engine) as src, Session(self.engine) as s:
            for model, index in ((TrialRow, 0), (BaselineRow, 1)):
                for row in src.scalars(select(model)):
                    if fingerprints is not None and model is TrialRow and \
                            row.variant.fingerprint not in fingerprints.get(row.variant.direction, ()):
                        continue
                    problem = source._problem_of(row.problem)
                    if problem is None:  # malformed: never used, not copied
                        continue
                    ids = dict(gpu=self._gpu(s, _gpu_of(row.gpu)), problem=self._problem(s, problem))
                    if model is TrialRow:
                        ids["variant"] = self._variant(s, row.variant.knobs, row.variant.fingerprint, row.variant.direction)
                    seen = select(model.id).filter_by(**{f"{k}_id": v.id for k, v in ids.items()},
                                                      host=row.host, created_at=row.created_at)
                    if s.scalars(seen).first() is None:
                        columns = {c.name: getattr(row, c.name) for c in model.__table__.columns
                                   if c.name != "id" and not c.name.endswith("_id")}
                        s.add(model(**ids, **columns))
                        copied[index] += 1
                    s.flush()
            s.commit()
        return copied[0], copied[1]

    @_store_errors
    def make_standalone(self) -> None:
        """SQLite only: leave WAL mode and vacuum, so that the file is whole on its own (as shipped in
        tuning_db/, read from a read-only folder) with no -wal or -shm beside it."""
        if self.url.startswith("sqlite"):
            self.engine.dispose()
            try:
                with self.engine.connect() as connection:
                    connection.exec_driver_sql("PRAGMA journal_mode=DELETE")
                    connection.exec_driver_sql("VACUUM")
            except OperationalError as e:
                if "locked" not in str(e):
                    raise
                raise StoreError(f"cannot make {self.url} standalone: another process has it open (a tuner?); what "
                                 "was written is saved: run the same command again when that process is done") from e

    # -- reading -----------------------------------------------------------------------------------
    @staticmethod
    def _claims(family: str, fingerprint: str, direction: str, *columns):
        return (select(*columns).join(VariantRow, VariantRow.id == ClaimRow.variant_id)
                .where(ClaimRow.gpu_family == family, VariantRow.fingerprint == fingerprint,
                       VariantRow.direction == direction))

    def _trials(self, family: str, fingerprint: str, direction: str, *columns):
        return (select(*columns)
                .join(TrialRow.variant).join(TrialRow.problem).join(TrialRow.gpu)
                .where(GpuRow.family == family, VariantRow.fingerprint == fingerprint,
                       VariantRow.direction == direction))

    @_store_errors
    def finished(self, family: str, problem: Problem, fingerprint: str, direction: str = "fwd") -> dict[str, Trial]:
        """Trials of `problem` already run with these templates: knobs JSON -> its latest trial (trials read in the
        order they ran, created_at then id, as dispatch reads them: a merged database's ids are not that order)."""
        with Session(self.engine) as s:
            rows = s.execute(self._trials(family, fingerprint, direction, VariantRow.knobs, TrialRow.status,
                                          TrialRow.median_ms, TrialRow.error)
                             .where(ProblemRow.key == problem.key()).order_by(TrialRow.created_at, TrialRow.id)).all()
        return {families.current_json(direction, knobs): Trial(status, median_ms, error)
                for knobs, status, median_ms, error in rows}

    @_store_errors
    def best(self, family: str, fingerprint: str, direction: str = "fwd") -> list[BestTrial]:
        """Per tuned problem: its fastest variant by each one's latest ok trial (malformed rows skipped with a warning:
        base.best_per_problem)."""
        columns = (TrialRow.id, ProblemRow.batch, ProblemRow.heads_q, ProblemRow.heads_kv, ProblemRow.seqlen_q,
                   ProblemRow.seqlen_k, ProblemRow.head_dim, type_coerce(ProblemRow.causal, Integer),  # as stored
                   ProblemRow.dtype, self._variants_column(), VariantRow.knobs,
                   VariantRow.fingerprint, TrialRow.median_ms, TrialRow.tflops)
        with Session(self.engine) as s:
            rows = s.execute(self._trials(family, fingerprint, direction, *columns).where(TrialRow.status == "ok")
                             .order_by(TrialRow.created_at, TrialRow.id)).all()
        return best_per_problem(rows, direction, self.url)

    @_store_errors
    def fingerprints(self, family: str, direction: str = "fwd") -> list[str]:
        """Template fingerprints with trials of `family` and `direction`."""
        with Session(self.engine) as s:
            return list(s.scalars(select(VariantRow.fingerprint).distinct().join(TrialRow.variant).join(TrialRow.gpu)
                                  .where(GpuRow.family == family, VariantRow.direction == direction)))

    @_store_errors
    def gpu_families(self) -> list[str]:
        """The GPU families with trials here."""
        with Session(self.engine) as s:
            return list(s.scalars(select(GpuRow.family).distinct().join(TrialRow, TrialRow.gpu_id == GpuRow.id)))

    @_store_errors
    def summary(self, family: str, fingerprint: str, direction: str = "fwd") -> list[tuple[Problem, int, int]]:
        """Per well-formed problem tuned on `family`: (problem, trials, failed trials); a no_valid_variant row is
        no trial."""
        with Session(self.engine) as s:
            rows = s.execute(select(ProblemRow, func.sum(case((TrialRow.status != "no_valid_variant", 1), else_=0)),
                                    func.sum(case((TrialRow.status.notin_(("ok", "no_valid_variant")), 1), else_=0)))
                             .join(TrialRow.problem).join(TrialRow.variant).join(TrialRow.gpu)
                             .where(GpuRow.family == family, VariantRow.fingerprint == fingerprint,
                                    VariantRow.direction == direction)
                             .group_by(ProblemRow.id).order_by(ProblemRow.id)
                             .options(*[undefer(ProblemRow.variants)] * (self.version >= 2))).all()
        summary = [(self._problem_of(p), int(count or 0), int(failed or 0)) for p, count, failed in rows]
        return [row for row in summary if row[0] is not None]

    @_store_errors
    def unusable(self, family: str, fingerprint: str, direction: str = "fwd") -> dict[str, str]:
        """Per problem key tuned on `family` without an ok trial: why, as "no valid variant (reasons)" or "all N
        trials failed (statuses)"."""
        return self._unusable(self._trials(family, fingerprint, direction))

    @_store_errors
    def unusable_key(self, family: str, fingerprint: str, direction: str, problem_key: str) -> str | None:
        """`unusable` of one problem, or None."""
        return self._unusable(self._trials(family, fingerprint, direction)
                              .where(ProblemRow.key == problem_key)).get(problem_key)

    def _unusable(self, trials) -> dict[str, str]:
        query = trials.with_only_columns(ProblemRow.key, TrialRow.status, TrialRow.error).order_by(TrialRow.id)
        outcomes: dict[str, list[tuple[str, str | None]]] = {}
        with Session(self.engine) as s:
            for key, status, error in s.execute(query):
                outcomes.setdefault(key, []).append((status, error))
        return unusable_reasons(outcomes)

    @_store_errors
    def baseline(self, family: str, problem: Problem, backend: str, torch_version: str | None = None
                 ) -> float | None:
        """The latest time of `backend` on `problem` on this GPU family (measured under `torch_version`, if given)."""
        same_torch = () if torch_version is None else (BaselineRow.torch_version == torch_version,)
        with Session(self.engine) as s:
            return s.scalars(select(BaselineRow.median_ms).join(ProblemRow).join(GpuRow)
                             .where(GpuRow.family == family, ProblemRow.key == problem.key(),
                                    BaselineRow.backend == backend, *same_torch)
                             .order_by(BaselineRow.id.desc())).first()

    def _variants_column(self):
        """ProblemRow.variants, or "{}" in a schema-1 database (plain problems only)."""
        return ProblemRow.variants if self.version >= 2 else literal("{}")

    def _problem_of(self, row: ProblemRow) -> Problem | None:
        """The problem of a row, None where it is malformed."""
        try:
            return stored_problem([getattr(row, name) for name in PLAIN_FIELDS[:6]], int(row.causal), row.dtype,
                                  row.variants if self.version >= 2 else "{}")
        except ValueError:
            return None

    @_store_errors
    def count_trials(self, status: str | None = None) -> int:
        with Session(self.engine) as s:
            query = select(func.count(TrialRow.id))
            return s.scalar(query if status is None else query.where(TrialRow.status == status))


def _gpu_of(row: GpuRow) -> Gpu:
    major, minor = row.capability.split(".")
    return Gpu(row.family, row.name, (int(major), int(minor)), row.multiprocessors, 0, 0)





# A claim older than this is taken for abandoned even where its process cannot be asked (another host): longer
# than a batch of trials at the default --trial-timeout takes.
CLAIM_EXPIRY = timedelta(hours=1)


def _lock(s: Session, problem_id: int) -> None:
    """Hold the problem's row until the session commits: its claims, problem claims and trials change one
    writer at a time (a no-op update takes the row lock on PostgreSQL, the database's on SQLite)."""
    s.execute(update(ProblemRow).where(ProblemRow.id == problem_id).values(key=ProblemRow.key))


def _abandoned(host: str, pid: int, created_at: datetime) -> bool:
    if host != _host():
        return _now() - created_at > CLAIM_EXPIRY
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        pass
    return False


def _host() -> str:
    return socket.gethostname() or platform.node()


def _now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)

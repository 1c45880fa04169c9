"""SQLAlchemy 2 models: one model a table. Table names start with `autoflash_`, apart from whatever else a
database holds (older tuning databases also hold Optuna's `studies`, `trials`, ...)."""

from datetime import datetime

from sqlalchemy import Boolean, DateTime, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Bump base.SCHEMA_VERSION on any change of the tables below, with the step that brings a database of the version
# before it up to date (base.SCHEMA_STEPS); a database of a newer version is refused. A new table needs no bump:
# Store creates it in an older database, and older code never reads it.

# Trial outcomes. Only "ok" trials are ever chosen. "no_valid_variant" records a problem whose search space
# is empty (no variant passes knobs.violations()): its variant's knobs are "{}" and its error says why.
STATUSES = ("ok", "compile_error", "out_of_resources", "timeout", "crashed", "wrong_result", "no_valid_variant")


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    __tablename__ = "autoflash_schema"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class GpuRow(Base):
    __tablename__ = "autoflash_gpus"
    __table_args__ = (UniqueConstraint("family", "name", "capability"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    family: Mapped[str] = mapped_column(String(64), index=True)
    name: Mapped[str] = mapped_column(String(128))
    capability: Mapped[str] = mapped_column(String(16))  # "9.0"
    multiprocessors: Mapped[int] = mapped_column(Integer)


class ProblemRow(Base):
    __tablename__ = "autoflash_problems"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(128), unique=True)
    batch: Mapped[int] = mapped_column(Integer)
    heads_q: Mapped[int] = mapped_column(Integer)
    heads_kv: Mapped[int] = mapped_column(Integer)
    seqlen_q: Mapped[int] = mapped_column(Integer)
    seqlen_k: Mapped[int] = mapped_column(Integer)
    head_dim: Mapped[int] = mapped_column(Integer)
    causal: Mapped[bool] = mapped_column(Boolean)
    dtype: Mapped[str] = mapped_column(String(16))
    # Problem.stored_variants() as JSON, "{}" for a plain problem (schema 2). Deferred: a schema-1 database, read-only,
    # has no such column and is read without it (Store._problem_of).
    variants: Mapped[str] = mapped_column(Text, default="{}", server_default="{}", deferred=True)


class VariantRow(Base):
    __tablename__ = "autoflash_variants"
    __table_args__ = (UniqueConstraint("direction", "knobs", "fingerprint"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    direction: Mapped[str] = mapped_column(String(8))  # "fwd"
    knobs: Mapped[str] = mapped_column(Text)  # FwdKnobs.to_json()
    fingerprint: Mapped[str] = mapped_column(String(32), index=True)  # codegen.template_fingerprint(family, direction)


class TrialRow(Base):
    __tablename__ = "autoflash_trials"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("autoflash_gpus.id"), index=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("autoflash_problems.id"), index=True)
    variant_id: Mapped[int] = mapped_column(ForeignKey("autoflash_variants.id"), index=True)
    status: Mapped[str] = mapped_column(String(24))  # one of STATUSES
    median_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tflops: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    triton_version: Mapped[str] = mapped_column(String(32))
    torch_version: Mapped[str] = mapped_column(String(32))
    autoflash_version: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    gpu: Mapped[GpuRow] = relationship()
    problem: Mapped[ProblemRow] = relationship()
    variant: Mapped[VariantRow] = relationship()


class BaselineRow(Base):
    """A reference implementation (torch SDPA) timed on the same GPU and problem, for speedups."""
    __tablename__ = "autoflash_baselines"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_id: Mapped[int] = mapped_column(ForeignKey("autoflash_gpus.id"), index=True)
    problem_id: Mapped[int] = mapped_column(ForeignKey("autoflash_problems.id"), index=True)
    backend: Mapped[str] = mapped_column(String(32))  # "sdpa"
    median_ms: Mapped[float] = mapped_column(Float)
    torch_version: Mapped[str] = mapped_column(String(32))
    host: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    gpu: Mapped[GpuRow] = relationship()
    problem: Mapped[ProblemRow] = relationship()


class ClaimRow(Base):
    """A variant a tuner is timing now for a problem on a GPU family: unique, so that concurrent tuners never time
    one variant twice nor more than --trials variants (Store.claim). Deleted with its trial's recording, or when
    its tuner stops; one whose process is gone is taken over (Store.claim says when)."""
    __tablename__ = "autoflash_claims"
    __table_args__ = (UniqueConstraint("gpu_family", "problem_id", "variant_id"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_family: Mapped[str] = mapped_column(String(64))
    problem_id: Mapped[int] = mapped_column(ForeignKey("autoflash_problems.id"))
    variant_id: Mapped[int] = mapped_column(ForeignKey("autoflash_variants.id"))
    host: Mapped[str] = mapped_column(String(128))
    pid: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class ProblemClaimRow(Base):
    """A problem and direction one process is tuning, on first use (autoflash/tune/on_miss.py) or in `autoflash tune`,
    until `expires_at`: unique, so that of many processes (data-parallel ranks) one tunes and the others wait for it,
    and tuners sharing a database each take problems no other holds (cli/tune.py: in_turn). Deleted when its tuner is
    done. One whose process died still stands until `expires_at`, so that no other process of the same job
    tunes the problem again and ranks keep reading one choice (Store.claim_problem)."""
    __tablename__ = "autoflash_problem_claims"
    __table_args__ = (UniqueConstraint("gpu_family", "problem_id", "direction"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    gpu_family: Mapped[str] = mapped_column(String(64))
    problem_id: Mapped[int] = mapped_column(ForeignKey("autoflash_problems.id"))
    direction: Mapped[str] = mapped_column(String(8))
    host: Mapped[str] = mapped_column(String(128))
    pid: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    expires_at: Mapped[datetime] = mapped_column(DateTime)

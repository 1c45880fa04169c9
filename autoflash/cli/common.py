"""Options and helpers shared by the commands."""

import click


def resolve_gpu(gpu_name: str | None):
    """The GPU family to read or file results under: --gpu, else the GPU here."""
    from autoflash import gpu as gpus

    return gpu_name.lower() if gpu_name else gpus.current().family


def as_url(db: str | None) -> str | None:
    """A SQLAlchemy URL as given; a SQLite file path (`tuning_db/h100.db`) as its sqlite:/// URL."""
    from pathlib import Path

    return f"sqlite:///{Path(db).resolve()}" if db and "://" not in db else db


def open_store(db_url: str | None, readonly: bool = False):
    from sqlalchemy.exc import ArgumentError, OperationalError

    from autoflash.db.store import SchemaMismatch, Store

    db_url = as_url(db_url)
    try:
        return Store(db_url, readonly=readonly)
    except SchemaMismatch as e:
        raise click.ClickException(str(e)) from e
    except OperationalError as e:
        raise click.ClickException(f"cannot open the database {db_url or '(default)'}: {e.orig}") from e
    except ArgumentError as e:
        raise click.ClickException(f"{db_url!r} is neither a SQLAlchemy URL nor a file path: {e}") from e


def problems_of(shapes_file: str):
    from autoflash.shapes import ShapesError, load_problems

    try:
        return load_problems(shapes_file)
    except ShapesError as e:
        raise click.ClickException(str(e)) from e


gpu_option = click.option("--gpu", "gpu_name", help="GPU family (h100, a100, interpreter, ...); default: the GPU here")
db_option = click.option("--db", "db_url", help="SQLAlchemy URL or SQLite file [default: $AUTOFLASH_DB, else "
                                                "SQLite in ~/.local/share/autoflash]")
mode_option = click.option("--mode", type=click.Choice(("fwd", "bwd", "both")), default="fwd", show_default=True,
                           help="forward kernels, backward kernels, or both")
shapes_option = click.option("--shapes", "shapes_file", type=click.Path(exists=True, dir_okay=False),
                             help="problems file (YAML; see examples/shapes.yaml)")

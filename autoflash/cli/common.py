"""Options and helpers shared by the commands."""

import os

import click

DEBUG_ENV = "AUTOFLASH_DEBUG"


def one_line(error: BaseException, message: str | None = None) -> click.ClickException:
    """`error` as click's one-line error (`message`, else its text); with AUTOFLASH_DEBUG=1 it is raised as it is,
    traceback and all."""
    if os.environ.get(DEBUG_ENV) == "1":
        raise error
    return click.ClickException(message or str(error))


def resolve_gpu(gpu_name: str | None):
    """The GPU family to read or file results under: --gpu, else the GPU here."""
    from autoflash import gpu as gpus

    return gpu_name.lower() if gpu_name else gpus.current().family


def require_extra(extra: str, *modules: str) -> None:
    """A one-line error, not a traceback, when a module of an extra (`tune`: optuna, sqlalchemy; `plot`: matplotlib)
    is missing."""
    for module in modules:
        try:
            __import__(module)
        except ModuleNotFoundError:
            command = click.get_current_context().command_path
            raise click.ClickException(f"{command} needs {module}, which is not installed: "
                                       f"pip install 'autoflash[{extra}]'") from None


def open_store(db: str | None, readonly: bool = False):
    """The store of --db (a URL or a SQLite file path; default $AUTOFLASH_DB, else the per-user file); unless
    `readonly`, one that takes a write now (not a read-only or full one)."""
    require_extra("tune", "sqlalchemy")
    from autoflash.db.base import StoreError
    from autoflash.db.store import Store

    try:
        store = Store(db, readonly=readonly)
        if not readonly:
            store.check_writable()
        return store
    except StoreError as e:
        raise one_line(e) from e


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

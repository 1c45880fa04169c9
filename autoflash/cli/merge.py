"""autoflash merge: gather the results of several tuning databases into one."""

import click

from autoflash.cli.common import open_store


@click.command()
@click.argument("sources", nargs=-1, required=True)
@click.option("--into", "into_url", required=True, help="SQLAlchemy URL or SQLite file to copy into (created if new)")
@click.option("--standalone", is_flag=True, help="SQLite: leave the result as one self-contained file (as tuning_db/ ships)")
@click.option("--current-only", is_flag=True, help="copy only trials of the templates this autoflash renders")
def merge(sources, into_url, standalone, current_only):
    """Copy the trials and baselines of the SOURCES databases (SQLAlchemy URLs or SQLite files) into --into, keeping their
    versions and times; rows already there are not copied twice."""
    from autoflash.codegen import every_current_fingerprint
    from autoflash.families import DIRECTIONS

    from autoflash.db.base import StoreError

    into = open_store(into_url)
    fingerprints = {d: {f for _, f in every_current_fingerprint(d)} for d in DIRECTIONS} if current_only else None
    try:
        for source in sources:
            source_store = open_store(source, readonly=True)
            try:
                trials, baselines = into.merge(source_store, fingerprints)
            finally:
                source_store.close()
            click.echo(f"{source}: {trials} trial(s), {baselines} baseline(s) copied into {into.url}")
        if standalone:
            into.make_standalone()
    except StoreError as e:  # a database locked by another process, a disk full: one line
        raise click.ClickException(str(e)) from e
    finally:
        into.close()

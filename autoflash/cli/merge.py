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
    from autoflash.codegen import current_fingerprints
    from autoflash.families import DIRECTIONS

    into = open_store(into_url)
    fingerprints = {d: set(current_fingerprints(d).values()) for d in DIRECTIONS} if current_only else None
    for source in sources:
        trials, baselines = into.merge(open_store(source, readonly=True), fingerprints)
        click.echo(f"{source}: {trials} trial(s), {baselines} baseline(s) copied into {into.url}")
    if standalone:
        into.make_standalone()

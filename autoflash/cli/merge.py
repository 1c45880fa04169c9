"""autoflash merge: gather the results of several tuning databases into one."""

import click

from autoflash.cli.common import open_store


@click.command()
@click.argument("sources", nargs=-1, required=True)
@click.option("--into", "into_url", required=True, help="SQLAlchemy URL of the database to copy into (created if new)")
@click.option("--standalone", is_flag=True, help="SQLite: leave the result as one self-contained file (as tuning_db/ ships)")
def merge(sources, into_url, standalone):
    """Copy the trials and baselines of the SOURCES databases (SQLAlchemy URLs) into --into, keeping their
    versions and times; rows already there are not copied twice."""
    into = open_store(into_url)
    for url in sources:
        trials, baselines = into.merge(open_store(url, readonly=True))
        click.echo(f"{url}: {trials} trial(s), {baselines} baseline(s) copied into {into.url}")
    if standalone:
        into.make_standalone()

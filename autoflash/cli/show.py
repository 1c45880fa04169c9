"""autoflash show: the tuned problems of a database."""

import click

from autoflash.cli.common import db_option, gpu_option, open_store, resolve_gpu


@click.command()
@gpu_option
@db_option
def show(gpu_name, db_url):
    """List tuned problems: best variant, time, TFLOP/s, trials and failures."""
    from autoflash import codegen

    store, family = open_store(db_url), resolve_gpu(gpu_name)
    fingerprint = codegen.template_fingerprint()
    best = {p: (knobs, trial) for p, knobs, trial in store.best(family, fingerprint)}
    rows = store.summary(family, fingerprint)
    if not rows:
        raise click.ClickException(f"nothing tuned for GPU family '{family}' with templates {fingerprint} in {store.url}")
    click.echo(f"{store.url}: GPU family {family}, templates {fingerprint}")
    click.echo(f"{'problem':<36} {'trials':>6} {'failed':>6} {'ms':>9} {'TFLOP/s':>8}  best variant")
    for problem, trials, failed in rows:
        knobs, trial = best.get(problem, (None, None))
        speed = f"{trial.median_ms:9.4f} {trial.tflops:8.1f}" if trial else f"{'-':>9} {'-':>8}"
        click.echo(f"{problem.label():<36} {trials:>6} {failed:>6} {speed}  {knobs or '(none passed)'}")

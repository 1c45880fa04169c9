"""autoflash show: the tuned problems of a database, forward and backward."""

import click

from autoflash.cli.common import db_option, gpu_option, open_store, resolve_gpu


@click.command()
@gpu_option
@db_option
def show(gpu_name, db_url):
    """List tuned problems per direction: best variant (or why none works), time, TFLOP/s, trials and failures."""
    from autoflash import codegen
    from autoflash.knobs import DIRECTIONS

    store, family = open_store(db_url, readonly=True), resolve_gpu(gpu_name)  # reading never changes the file
    fingerprints = {d: codegen.template_fingerprint(d) for d in DIRECTIONS}
    rows = [(d, row) for d in DIRECTIONS for row in store.summary(family, fingerprints[d], d)]
    if not rows:
        raise click.ClickException(f"nothing tuned for GPU family '{family}' with templates "
                                   f"{', '.join(f'{d} {f}' for d, f in fingerprints.items())} in {store.url}")
    best = {(d, p): (knobs, trial) for d in DIRECTIONS for p, knobs, trial in store.best(family, fingerprints[d], d)}
    unusable = {d: store.unusable(family, fingerprints[d], d) for d in DIRECTIONS}
    click.echo(f"{store.url}: GPU family {family}, templates "
               + ", ".join(f"{d} {f}" for d, f in fingerprints.items()))
    click.echo(f"{'problem':<36} {'dir':<3} {'trials':>6} {'failed':>6} {'ms':>9} {'TFLOP/s':>8}  best variant")
    for direction, (problem, trials, failed) in rows:
        knobs, trial = best.get((direction, problem), (None, None))
        speed = f"{trial.median_ms:9.4f} {trial.tflops:8.1f}" if trial else f"{'-':>9} {'-':>8}"
        why = unusable[direction].get(problem.key())
        click.echo(f"{problem.label():<36} {direction:<3} {trials:>6} {failed:>6} {speed}  {knobs or why}")

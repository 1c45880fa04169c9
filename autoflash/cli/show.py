"""autoflash show: the tuned problems of a database, forward and backward."""

import click

from autoflash.cli.common import db_option, gpu_option, open_store, resolve_gpu


@click.command()
@gpu_option
@db_option
def show(gpu_name, db_url):
    """List tuned problems per direction and kernel family: best variant, time, TFLOP/s, trials and failures."""
    from autoflash.codegen import current_fingerprints
    from autoflash.families import DIRECTIONS

    store, gpu_family = open_store(db_url, readonly=True), resolve_gpu(gpu_name)  # reading never changes the file
    fingerprints = [(d, f, fingerprint) for d in DIRECTIONS for f, fingerprint in current_fingerprints(d).items()]
    named = ", ".join(f"{d} {f} {fingerprint}" for d, f, fingerprint in fingerprints)
    rows = [(d, fingerprint, row) for d, _, fingerprint in fingerprints
            for row in store.summary(gpu_family, fingerprint, d)]
    if not rows:
        raise click.ClickException(f"nothing tuned for GPU family '{gpu_family}' with templates {named} in {store.url}")
    best = {(d, b.fingerprint, b.problem): b for d, _, fingerprint in fingerprints
            for b in store.best(gpu_family, fingerprint, d)}
    click.echo(f"{store.url}: GPU family {gpu_family}, templates {named}")
    click.echo(f"{'problem':<36} {'dir':<3} {'trials':>6} {'failed':>6} {'ms':>9} {'TFLOP/s':>8}  best variant")
    for direction, fingerprint, (problem, trials, failed) in rows:
        b = best.get((direction, fingerprint, problem))
        speed = f"{b.median_ms:9.4f} {b.tflops:8.1f}" if b else f"{'-':>9} {'-':>8}"
        click.echo(f"{problem.label():<36} {direction:<3} {trials:>6} {failed:>6} {speed}  "
                   f"{b.knobs if b else '(none passed)'}")

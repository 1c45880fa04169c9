"""autoflash show: the tuned problems of a database, forward and backward."""

import click

from autoflash.cli.common import db_option, gpu_option, open_store, resolve_gpu


@click.command()
@gpu_option
@db_option
def show(gpu_name, db_url):
    """List tuned problems per direction: best variant of any kernel family (or why none works), time,
    TFLOP/s, trials and failures."""
    from autoflash.codegen import current_fingerprints
    from autoflash.families import DIRECTIONS

    store, gpu_family = open_store(db_url, readonly=True), resolve_gpu(gpu_name)  # reading never changes the file
    fingerprints = [(d, f, fingerprint) for d in DIRECTIONS for f, fingerprint in current_fingerprints(d).items()]
    named = ", ".join(f"{d} {f} {fingerprint}" for d, f, fingerprint in fingerprints)
    counts: dict[tuple, list[int]] = {}  # (direction, problem) -> [trials, failed], over the families
    for d, _, fingerprint in fingerprints:
        for problem, trials, failed in store.summary(gpu_family, fingerprint, d):
            total = counts.setdefault((d, problem), [0, 0])
            total[0], total[1] = total[0] + trials, total[1] + failed
    if not counts:
        raise click.ClickException(f"nothing tuned for GPU family '{gpu_family}' with templates {named} in {store.url}")
    best, unusable = {}, {}
    for d, family, fingerprint in fingerprints:
        for b in store.best(gpu_family, fingerprint, d):
            if (d, b.problem) not in best or b.median_ms < best[d, b.problem].median_ms:
                best[d, b.problem] = b
        for key, why in store.unusable(gpu_family, fingerprint, d).items():
            unusable.setdefault((d, key), []).append(f"{family}: {why}")
    click.echo(f"{store.url}: GPU family {gpu_family}, templates {named}")
    click.echo(f"{'problem':<36} {'dir':<3} {'trials':>6} {'failed':>6} {'ms':>9} {'TFLOP/s':>8}  best variant")
    for (direction, problem), (trials, failed) in counts.items():
        b = best.get((direction, problem))
        speed = f"{b.median_ms:9.4f} {b.tflops:8.1f}" if b else f"{'-':>9} {'-':>8}"
        why = "; ".join(unusable.get((direction, problem.key()), [])) or "(none passed)"
        click.echo(f"{problem.label():<36} {direction:<3} {trials:>6} {failed:>6} {speed}  {b.knobs if b else why}")

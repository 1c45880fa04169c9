"""autoflash show: the tuned problems of a database, forward and backward."""

from contextlib import contextmanager

import click

from autoflash.cli.common import db_option, gpu_option, open_store, require_extra, resolve_gpu


@click.command()
@gpu_option
@db_option
def show(gpu_name, db_url):
    """List tuned problems per direction: best variant of any kernel family (or why none works), time,
    TFLOP/s, trials and failures. Without --db and before the first `autoflash tune`, the databases shipped
    with autoflash."""
    from autoflash.db.urls import default_url, user_url
    from autoflash.dispatch import shipped_urls

    require_extra("tune", "sqlalchemy")  # before saying anything
    gpu_family = resolve_gpu(gpu_name)
    if db_url or user_url():
        with _opened(db_url) as store:
            if not _show(store, gpu_family):
                raise click.ClickException(f"nothing tuned for GPU family '{gpu_family}' with the current templates "
                                           f"in {store.url}")
        return
    shipped, shown, held = shipped_urls(), False, set()
    click.echo(f"no user database yet (autoflash tune writes one at {default_url()}); "
               + (f"showing the {len(shipped)} database(s) shipped with autoflash" if shipped
               else "and none is shipped"))
    for url in shipped:
        with _opened(url) as store:
            shown = _show(store, gpu_family) or shown
            held |= set(store.gpu_families())
    if not shown:
        hint = f"they hold trials of {', '.join(sorted(held))}: pass --gpu {min(held)}" if held else "tune first"
        raise click.ClickException(f"nothing tuned for GPU family '{gpu_family}' with the current templates in the "
                                   f"shipped databases; {hint}")


@contextmanager
def _opened(db_url):
    store = open_store(db_url, readonly=True)  # reading never changes the file
    try:
        yield store
    finally:
        store.close()


def _show(store, gpu_family: str) -> bool:
    """Print the tuned problems of `gpu_family` in `store` under the current templates; whether it holds any."""
    from autoflash.codegen import current_fingerprints, every_current_fingerprint, is_current
    from autoflash.families import DIRECTIONS

    named = ", ".join(f"{d} {f} {fingerprint}" for d in DIRECTIONS for f, fingerprint in current_fingerprints(d).items())
    # Every variant set's kernels; a problem's records count under its own set's (is_current).
    fingerprints = sorted((d, f, fingerprint) for d in DIRECTIONS for f, fingerprint in every_current_fingerprint(d))
    counts: dict[tuple, list[int]] = {}  # (direction, problem) -> [trials, failed], over the families
    for d, family, fingerprint in fingerprints:
        for problem, trials, failed in store.summary(gpu_family, fingerprint, d):
            if is_current(fingerprint, family, d, problem.gates()):
                total = counts.setdefault((d, problem), [0, 0])
                total[0], total[1] = total[0] + trials, total[1] + failed
    if not counts:
        return False
    best, unusable = {}, {}
    keys = {(d, problem.key()): problem for d, problem in counts}
    for d, family, fingerprint in fingerprints:
        for b in store.best(gpu_family, fingerprint, d):
            if is_current(fingerprint, family, d, b.problem.gates()) and \
                    ((d, b.problem) not in best or b.median_ms < best[d, b.problem].median_ms):
                best[d, b.problem] = b
        for key, why in store.unusable(gpu_family, fingerprint, d).items():
            if (d, key) in keys and is_current(fingerprint, family, d, keys[d, key].gates()):
                unusable.setdefault((d, key), []).append(f"{family}: {why}")
    click.echo(f"{store.url}: GPU family {gpu_family}, templates {named}")
    click.echo(f"{'problem':<36} {'dir':<3} {'trials':>6} {'failed':>6} {'ms':>9} {'TFLOP/s':>8}  best variant")
    for (direction, problem), (trials, failed) in counts.items():
        b = best.get((direction, problem))
        # the rate from today's count (a record's stored one keeps the count of its day)
        tflops = problem.tflops(direction, b.median_ms) if b else None  # (none for a mask_mod's problem)
        speed = (f"{b.median_ms:9.4f}" if b else f"{'-':>9}") + (f" {tflops:8.1f}" if tflops else f" {'-':>8}")
        why = "; ".join(unusable.get((direction, problem.key()), [])) or "(none passed)"
        click.echo(f"{problem.label():<36} {direction:<3} {trials:>6} {failed:>6} {speed}  {b.knobs if b else why}")
    return True

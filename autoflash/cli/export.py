"""autoflash export: chosen variants as a standalone package (torch + triton only)."""

from pathlib import Path

import click

from autoflash.cli.common import db_option, gpu_option, problems_of, resolve_gpu, shapes_option


@click.command()
@gpu_option
@shapes_option
@db_option
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="package folder to write")
@click.option("--force", is_flag=True, help="write into --out even if it holds something other than an earlier export")
def export(gpu_name, shapes_file, db_url, out_dir, force):
    """Write the best forward and backward variants (of SHAPES, or of every tuned problem) as a standalone
    Python package."""
    if not force:
        _refuse_foreign_folder(Path(out_dir))
    from autoflash import gpu as gpus
    from autoflash.db.urls import as_url
    from autoflash.dispatch import Dispatcher, default_urls
    from autoflash.export import export as write_package
    from autoflash.families import DIRECTIONS

    gpu_family = resolve_gpu(gpu_name)
    try:
        gpu = gpus.by_family(gpu_family)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    urls = [as_url(db_url)] if db_url else default_urls()
    dispatcher = Dispatcher(urls)
    if shapes_file:
        problems = problems_of(shapes_file)
    else:
        problems = list(dict.fromkeys(r.problem for d in DIRECTIONS for _, records in dispatcher.sources(gpu_family, d)
                                      for r in records))
        if not problems:
            raise click.ClickException(f"nothing tuned for GPU family '{gpu_family}' in {urls}; pass --shapes")
    # The backward of deterministic=True too (the exported attention takes the flag); tensors=(): an export
    # cannot see the calls' tensors, and a backward's choice does not depend on them.
    choices = {p: {d: dispatcher.choice(p, gpu, d) for d in DIRECTIONS}
               | {"bwd_deterministic": dispatcher.for_call(p, gpu, "bwd", tensors=(), deterministic=True)}
               for p in problems}
    out = write_package(choices, Path(out_dir), gpu_family)
    for d in DIRECTIONS:
        chosen = [per_direction[d] for per_direction in choices.values()]
        click.echo(f"wrote {out} {d}: {len(chosen)} problem(s), {sum(1 for c in chosen if c.tuned)} from tuning "
                   f"records, {len(set(c.knobs for c in chosen))} variant(s)")


EXPORT_HEADER = "# Exported by autoflash"  # the first line of every exported __init__.py


def _refuse_foreign_folder(out: Path) -> None:
    """An export writes __init__.py: only into a new or empty folder, or over an earlier export."""
    if not out.is_dir() or not any(out.iterdir()):
        return
    init = out / "__init__.py"
    try:
        with init.open(encoding="utf-8", errors="replace") as f:
            earlier_export = f.readline().startswith(EXPORT_HEADER)
    except OSError:
        earlier_export = False
    if not earlier_export:
        raise click.ClickException(f"{out} is not empty and holds no earlier autoflash export: "
                                   "pick an empty or new folder for --out, or pass --force to write into it")

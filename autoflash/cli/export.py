"""autoflash export: chosen variants as a standalone package (torch + triton only)."""

import importlib
import os
import sys
from pathlib import Path

import click

from autoflash.cli.common import db_option, gpu_option, problems_of, resolve_gpu, shapes_option


@click.command()
@gpu_option
@shapes_option
@db_option
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False), help="package folder to write")
@click.option("--force", is_flag=True, help="write into --out even if it holds something other than an earlier export")
@click.option("--mask-mod", "mask_mod_name", metavar="MODULE:NAME",
              help="export the problems with this mask_mod: an autoflash.MaskMod (its captures' dtypes and ranks, "
                   "not their data, are exported) or a def without captures, importable from here")
@click.option("--score-mod", "score_mod_name", metavar="MODULE:NAME",
              help="export the problems with this score_mod: an autoflash.ScoreMod or a def without captures")
def export(gpu_name, shapes_file, db_url, out_dir, force, mask_mod_name, score_mod_name):
    """Write the best forward and backward variants (of SHAPES, or of every tuned problem) as a standalone
    Python package. With --mask-mod or --score-mod, the problems carry the mod (tuned records of its fingerprint
    where a database holds them, else the family's default) and the package runs it."""
    if not force:
        _refuse_foreign_folder(Path(out_dir))
    from autoflash import gpu as gpus
    from autoflash.db.urls import as_url
    from autoflash.dispatch import Dispatcher, default_urls
    from autoflash.export import chosen, export as write_package
    from autoflash.families import DIRECTIONS

    gpu_family = resolve_gpu(gpu_name)
    try:
        gpu = gpus.by_family(gpu_family)
    except ValueError as e:
        raise click.ClickException(str(e)) from e
    mods = {label: _loaded_mod(label, name) for label, name in (("mask_mod", mask_mod_name),
                                                                ("score_mod", score_mod_name)) if name}
    fingerprints = {label: mod.fingerprint() for label, mod in mods.items()}
    urls = [as_url(db_url)] if db_url else default_urls()
    dispatcher = Dispatcher(urls)
    if shapes_file:
        try:
            problems = [p.with_variants(p.window, p.softcap, p.alibi, **fingerprints).validate()
                        for p in problems_of(shapes_file)]
        except ValueError as e:
            raise click.ClickException(f"{shapes_file}: {e}") from e
    else:
        problems = list(dict.fromkeys(r.problem for d in DIRECTIONS for _, records in dispatcher.sources(gpu_family, d)
                                      for r in records if (r.problem.mask_mod, r.problem.score_mod)
                                      == (fingerprints.get("mask_mod", ""), fingerprints.get("score_mod", ""))))
        if not problems:
            mods_named = "".join(f" with {mod.title} ({mod.fingerprint()})" for mod in mods.values())
            raise click.ClickException(f"nothing tuned{mods_named} for GPU family '{gpu_family}' in {urls}; pass "
                                       "--shapes")
    choices = chosen(problems, gpu, dispatcher)
    out = write_package(choices, Path(out_dir), gpu_family, tuple(mods.values()))
    for d in DIRECTIONS:
        chosen_ones = [per_direction[d] for per_direction in choices.values()]
        click.echo(f"wrote {out} {d}: {len(chosen_ones)} problem(s), {sum(1 for c in chosen_ones if c.tuned)} from "
                   f"tuning records, {len(set(c.knobs for c in chosen_ones))} variant(s)")
    for mod in mods.values():
        click.echo(f"wrote {out}: {mod.title} (fingerprint {mod.fingerprint()}), called as "
                   f"{'MaskMod' if mod.KIND.label == 'mask_mod' else 'ScoreMod'}({mod.fn.__name__!r}, *captures)")


def _loaded_mod(label: str, reference: str):
    """--mask-mod's or --score-mod's MODULE:NAME (importable from the current folder) as an autoflash.MaskMod or
    ScoreMod."""
    from autoflash.mask_mod import as_mask_mod
    from autoflash.score_mod import as_score_mod

    option = f"--{label.replace('_', '-')} {reference}"
    module, _, name = reference.partition(":")
    if not module or not name:
        raise click.ClickException(f"{option}: write MODULE:NAME, e.g. mymods:DOCUMENTS")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        value = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise click.ClickException(f"{option}: {e}") from e
    kind_class = "MaskMod" if label == "mask_mod" else "ScoreMod"
    try:
        return (as_mask_mod if label == "mask_mod" else as_score_mod)(value)
    except TypeError as e:
        raise click.ClickException(f"{option}: {e} (name an autoflash.{kind_class} for a mod with captures: their "
                                   "dtypes and ranks are exported, not their data)") from e


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

"""autoflash bench: autoflash beside plain SDPA (no backend forced) and its flash, cuDNN and efficient backends."""

import datetime
import json
import platform
import sys

import click

from autoflash.cli.common import mode_option, problems_of, require_extra


def row_json(row: dict, problem, context: dict) -> str:
    """One JSON line of `--out`: the row, its problem's fields (sets as sorted lists) and the run's context."""
    return json.dumps(dict(row, problem=problem.__dict__, **context), default=sorted)


def summary(results, direction: str) -> str:
    """autoflash's speed over each SDPA backend's, over the problems both ran (autoflash.bench.ratio_summary)."""
    from autoflash.bench import ratio_summary

    parts = []
    for backend in ("sdpa", "sdpa_cudnn", "sdpa_flash"):
        ratios = []
        for problem, rows in results:
            speeds = {r["backend"]: r.get("tflops") for r in rows}
            if speeds.get("autoflash") and speeds.get(backend):
                ratios.append((speeds["autoflash"] / speeds[backend], problem.label()))
        if ratios:
            parts.append(f"{direction} vs {backend}: {ratio_summary(ratios)}")
    return "\n".join(parts)


@click.command()
@click.option("--shapes", "shapes_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="problems file (YAML; see examples/shapes.yaml)")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="write a PNG chart of TFLOP/s here")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), help="append JSON lines (one per row) here")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="timings of each implementation a problem, the implementations interleaved (the median is kept)")
@click.option("--graph", is_flag=True, help="time replays of CUDA graphs of many calls: the GPU's time alone, without "
              "the host time per call that short kernels otherwise wait on")
@mode_option
def bench(shapes_file, plot_path, out_path, rounds, graph, mode):
    """Time autoflash and SDPA's backends on every problem of SHAPES (forward, backward or both)."""
    if plot_path:
        require_extra("plot", "matplotlib")  # before hours of timing, not after
    import torch
    import triton

    import autoflash
    from autoflash import codegen
    from autoflash.bench import bench_problem, plot, precompile
    from autoflash.gpu import usable_cores

    if not torch.cuda.is_available():
        raise click.ClickException("autoflash bench needs a CUDA GPU")
    device = torch.device("cuda")
    context = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   autoflash=autoflash.__version__, host=platform.node(),
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   command="autoflash " + " ".join(sys.argv[1:]))
    problems = problems_of(shapes_file)
    for direction in ("fwd", "bwd") if mode == "both" else (mode,):
        context["templates"] = codegen.current_fingerprints(direction)
        precompile(problems, direction, workers=min(len(problems), usable_cores()))
        results = []
        click.echo(f"{direction + ' problem':<36} " + " ".join(f"{n:>14}" for n in (
            "autoflash", "sdpa", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient")) + "   vs SDPA  source")
        for problem in problems:
            rows = bench_problem(problem, device, direction, rounds, graph)
            results.append((problem, rows))
            speeds = {r["backend"]: r.get("tflops") for r in rows}
            plain = speeds["sdpa"]  # the ratio users see: against SDPA with no backend forced
            ratio = f"{speeds['autoflash'] / plain:6.2f}x" if speeds["autoflash"] and plain else "     -"
            why = next(line for line in rows[0]["explain"].splitlines() if line.startswith(f"{direction} why:"))
            click.echo(f"{problem.label():<36} " + " ".join(f"{v:14.1f}" if v else f"{'error':>14}"
                                                           for v in speeds.values()) + f"   {ratio}  {why[13:]}")
            if out_path:
                with open(out_path, "a") as f:
                    f.writelines(row_json(row, problem, context) + "\n" for row in rows)
        click.echo(summary(results, direction))
        if plot_path:
            path = plot_path if mode != "both" else plot_path.replace(".png", f"_{direction}.png")
            plot(results, path, direction)
            click.echo(f"chart: {path}")

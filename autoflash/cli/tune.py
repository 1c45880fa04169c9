"""autoflash tune: search the variant space for each problem of a problems file, forward and/or backward."""

import os
import sys

import click

from autoflash.cli.common import db_option, mode_option, one_line, open_store, problems_of, require_extra
from autoflash.tune import SAMPLERS


@click.command()
@click.option("--shapes", "shapes_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="problems file (YAML; see examples/shapes.yaml)")
@click.option("--gpu", "gpu_name", help="GPU family to file results under (h100, a100, ...); default: the GPU here")
@click.option("--trials", type=click.IntRange(min=1),
              help="evaluated variants per problem, earlier runs included [default: 60; grid: all]")
@click.option("--time-budget", type=click.FloatRange(min=0), help="seconds per problem, at most")
@mode_option
@db_option
@click.option("--sampler", type=click.Choice(SAMPLERS), default="tpe", show_default=True)
@click.option("--seed", type=int, help="sampler seed, for repeatable searches")
@click.option("--trial-timeout", type=click.FloatRange(min=1), default=180, show_default=True,
              help="seconds one variant may take to compile, check and time")
@click.option("--workers", type=click.IntRange(min=0), help="compile processes [default: cores - 1; 0 when interpreting]")
@click.option("--interpret", is_flag=True,
              help="run on the CPU in Triton's interpreter; results filed under GPU 'interpreter' (timings meaningless)")
def tune(shapes_file, gpu_name, trials, time_budget, mode, db_url, sampler, seed, trial_timeout, workers, interpret):
    """Tune the kernels of every problem in SHAPES (forward, backward or both) and record every trial."""
    require_extra("tune", "optuna", "sqlalchemy")
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is imported
    from optuna.exceptions import StorageInternalError

    from autoflash import gpu as gpus
    from autoflash.db.base import StoreError
    from autoflash.tune.runner import Runner
    from autoflash.families import DIRECTIONS
    from autoflash.tune.tuner import tune_problem

    problems, here = problems_of(shapes_file), gpus.current()
    if here.family == "interpreter" and not interpret:
        raise click.ClickException("no CUDA GPU here: pass --interpret to tune in Triton's interpreter")
    if gpu_name is not None and gpu_name.lower() != here.family:
        raise click.ClickException(f"--gpu {gpu_name} does not match the GPU here ({here.name}, family "
                                   f"'{here.family}'): results are filed under the GPU that measured them")
    bf16 = [p.label() for p in problems if p.dtype == "bfloat16"]
    if here.family == "interpreter" and bf16:
        raise click.ClickException(f"{len(bf16)} bfloat16 problem(s) ({bf16[0]}, ...) cannot be tuned in Triton's "
                                   "interpreter, whose tl.dot on bfloat16 is wrong (every trial would be "
                                   "wrong_result): tune them on a GPU, or tune float16 here")
    directions = DIRECTIONS if mode == "both" else (mode,)
    check_memory(problems, directions, *memory_of(here))
    store = open_store(db_url)
    click.echo(f"tuning {len(problems)} problem(s) on {here.name} ({here.family}); database {store.url}")
    reports = []
    try:
        with Runner(interpret=interpret, compile_workers=workers, trial_timeout=trial_timeout) as runner:
            for problem in problems:
                for direction in directions:
                    target = trials or (10 ** 9 if sampler == "grid" else 60)
                    label = f"{problem.label()} {direction}"
                    with click.progressbar(length=min(target, 10 ** 4), label=label, file=sys.stderr) as bar:
                        reports.append(tune_problem(problem, gpu=here, store=store, runner=runner, direction=direction,
                                                    sampler=sampler, n_trials=target, time_budget=time_budget,
                                                    seed=seed, on_trial=lambda knobs, ms: bar.update(1)))
    except KeyboardInterrupt:
        click.echo(f"\ninterrupted: every finished trial is saved in {store.url}; run the same command to resume",
                   err=True)
        sys.exit(130)
    except (StoreError, StorageInternalError) as e:  # the disk filled up, the server went away, ...
        raise one_line(e, f"tuning stopped: {database_failure(store.url, e)}; every trial finished before is "
                          "saved: run the same command to resume") from e
    finally:
        if reports:
            click.echo(format_reports(reports))


def database_failure(url: str, error: BaseException) -> str:
    """One line on a database write that failed: Optuna's StorageInternalError says only "exceeding max length" and
    keeps the driver's error as its cause."""
    from autoflash.db.base import StoreError, cannot_open

    if isinstance(error, StoreError):
        return str(error)
    cause = error.__cause__ or error
    return str(cannot_open(url, getattr(cause, "orig", None) or cause))


def memory_of(gpu) -> tuple[int, str]:
    """(bytes, name) of the memory the tuner's tensors live in: the GPU's, or the host's under the interpreter."""
    if gpu.family == "interpreter":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine's memory"
    import torch

    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory, f"the {gpu.name}"


def check_memory(problems, directions, limit: int, where: str) -> None:
    """Refuse, before anything starts, a problem whose tensors alone exceed `limit` bytes."""
    for problem in problems:
        for direction in directions:
            need = problem.tensor_bytes(direction)
            if need > limit:
                raise click.ClickException(
                    f"{problem.label()} ({direction}) needs {need / 2 ** 30:,.1f} GiB for its tensors alone, "
                    f"{where} has {limit / 2 ** 30:,.1f} GiB: shorten it in the problems file")


def format_reports(reports) -> str:
    lines = [f"{'problem':<36} {'dir':<3} {'trials':>6} {'failed':>6} {'ms':>9} {'TFLOP/s':>8} {'vs SDPA':>7} {'wall s':>7}  best"]
    for r in reports:
        ms = f"{r.best_ms:9.4f} {r.tflops:8.1f}" if r.best_ms else f"{'-':>9} {'-':>8}"
        speedup = f"{r.speedup:6.2f}x" if r.speedup else f"{'-':>7}"
        best = r.best.to_json() if r.best else f"no valid variant: {r.no_valid_variant}" if r.no_valid_variant \
            else "(no variant passed)"
        lines.append(f"{r.problem.label():<36} {r.direction:<3} {r.trials:>6} {r.failures:>6} {ms} {speedup} {r.wall_s:7.1f}  {best}")
    return "\n".join(lines)

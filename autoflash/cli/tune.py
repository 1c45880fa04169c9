"""autoflash tune: search the variant space for each problem of a problems file, forward and/or backward."""

import os
import subprocess
import sys
import tempfile
import threading
import time

import click

from autoflash.cli.common import db_option, mode_option, one_line, open_store, problems_of, require_extra
from autoflash.tune import SAMPLERS

# How long a tuner's hold on the problem it is tuning stands (unless released, or its process dies on the host of the
# one asking): tuners order their problems by these holds (in_turn), and tuning on first use waits for one (on_miss),
# so a tuner that died on another host holds its waiters this long at most. A problem tuned for longer loses its hold
# on the way: another tuner may then join it, timing its other variants beside this one, as without holds.
HOLD_S = 600.0


@click.command()
@click.option("--shapes", "shapes_file", required=True, type=click.Path(exists=True, dir_okay=False),
              help="problems file (YAML; see examples/shapes.yaml)")
@click.option("--gpu", "gpu_name", help="GPU family to file results under (h100, a100, ...); default: the GPU here")
@click.option("--trials", type=click.IntRange(min=1),
              help="evaluated variants per problem, earlier runs included [default: 60; grid: all]")
@click.option("--time-budget", type=click.FloatRange(min=0),
              help="seconds per problem and family: no trial starts after them (those started finish)")
@mode_option
@db_option
@click.option("--sampler", type=click.Choice(SAMPLERS), default="tpe", show_default=True)
@click.option("--seed", type=int, help="sampler seed, for repeatable searches")
@click.option("--trial-timeout", type=click.FloatRange(min=1), default=180, show_default=True,
              help="seconds one variant may take to compile, check and time")
@click.option("--workers", type=click.IntRange(min=0),
              help="compile processes a tuner [default: cores - 1, shared among --devices' tuners, at most --trials; "
                   "0 when interpreting]")
@click.option("--interpret", is_flag=True,
              help="run on the CPU in Triton's interpreter; results filed under GPU 'interpreter' (timings meaningless)")
@click.option("--devices", help="GPUs to tune on, one tuner process each, sharing the database: indices such as "
                                "0,1,3 [default: every visible GPU]; with --interpret, that many CPU tuners")
@click.option("--families", "family_names",
              help="kernel families to search, comma-separated, e.g. gluon [default: every family the tuner "
                   "searches: tl, gluon]")
@click.option("--warm-from", "warm_from", multiple=True,
              help="database (URL or SQLite file, repeatable) whose winners of each problem are first guesses, "
                   "this GPU's then other GPUs': e.g. tuning_db/h200.db when tuning an H100, or the shipped "
                   "database when retuning into a fresh one; only read")
@click.option("--begin-at", default="0/1", hidden=True,
              help="i/N: start at the i-th of N equal parts of the problems and go round (set by --devices)")
def tune(shapes_file, gpu_name, trials, time_budget, mode, db_url, sampler, seed, trial_timeout, workers, interpret,
         devices, family_names, warm_from, begin_at):
    """Tune the kernels of every problem in SHAPES (forward, backward or both) and record every trial."""
    started = time.monotonic()
    require_extra("tune", "optuna", "sqlalchemy")
    from autoflash.families import DIRECTIONS

    directions = DIRECTIONS if mode == "both" else (mode,)
    searched = family_list(family_names, directions)
    chosen = device_list(devices, interpret)
    # One tuner process per device; one device given that this process does not see alone is one such process
    # too (its compile and timing workers inherit CUDA_VISIBLE_DEVICES).
    visible = visible_devices()
    alone = visible is not None and len(visible) == 1 and chosen == ["0"]
    if len(chosen) > 1 or (devices and not interpret and not alone):
        options = dict(shapes=shapes_file, gpu=gpu_name, trials=trials, time_budget=time_budget, mode=mode,
                       db=db_url, sampler=sampler, seed=seed, trial_timeout=trial_timeout, interpret=interpret,
                       families=family_names, warm_from=warm_from,
                       workers=workers if workers is not None else default_workers(interpret, len(chosen),
                                                                                   trials_target(trials, sampler)))
        sys.exit(fan_out(chosen, options))
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is imported
    from optuna.exceptions import StorageInternalError

    from autoflash import gpu as gpus
    from autoflash.db.base import StoreError
    from autoflash.tune.runner import Runner
    from autoflash.tune.tuner import tune_problem

    problems, here = begin_at_part(problems_of(shapes_file), begin_at, kernels_shared), gpus.current()
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
    check_memory(problems, directions, *memory_of(here))
    store = open_store(db_url)
    warm_stores = [open_store(url, readonly=True) for url in warm_from]
    click.echo(f"tuning {len(problems)} problem(s) on {here.name} ({here.family}); database {store.url}")
    reports, target = [], trials_target(trials, sampler)
    if workers is None:
        workers = default_workers(interpret, 1, target)
    try:
        with Runner(interpret=interpret, compile_workers=workers, trial_timeout=trial_timeout) as runner:
            click.echo(f"{len(runner.compilers)} compile worker(s) and a measuring worker starting "
                       f"({time.monotonic() - started:.1f} s after the start)")
            # a KV cache serves decode and chunked prefill, which have no backward
            jobs = [(problem, direction) for problem in problems for direction in directions
                    if not (direction == "bwd" and "PAGED" in problem.variants)]
            for problem, direction in in_turn(jobs, taker(store, here)):
                label = f"{problem.label()} {direction}"
                try:
                    with click.progressbar(length=min(target, 10 ** 4), label=label, file=sys.stderr) as bar:
                        reports.append(tune_problem(problem, gpu=here, store=store, runner=runner, direction=direction,
                                                    sampler=sampler, n_trials=target, time_budget=time_budget,
                                                    seed=seed, on_trial=lambda knobs, ms: bar.update(1),
                                                    family_names=searched[direction], warm_stores=warm_stores))
                finally:
                    store.release_problem(here, problem, direction)
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
            click.echo(f"{len(reports)} problem(s) {time.monotonic() - started:.1f} s after the start")


def default_workers(interpret: bool, tuners: int, target: int) -> int:
    """A tuner's compile workers where --workers does not say: its share of the cores but one among `tuners`, and
    no more than a family's batch compiles at once (`target`; each worker costs an import of torch and a GPU
    context, NOTES 139); none in the interpreter, where compiling is running."""
    from autoflash.tune.runner import default_compile_workers

    cores = default_compile_workers(interpret)
    return min(max(1, cores // tuners), target) if cores else 0


def trials_target(trials: int | None, sampler: str) -> int:
    """Variants per problem and family: --trials, else every valid one (grid) or 60."""
    return trials or (10 ** 9 if sampler == "grid" else 60)


def family_list(names: str | None, directions) -> dict:
    """Direction -> the kernel families to search: those --families names that the tuner searches for it (every one
    without --families). A name no searched family has, or one leaving a direction without a family, is refused."""
    from autoflash import families

    searched = {d: [f.name for f in families.searched(d)] for d in directions}
    if names is None:
        return searched
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    known = sorted({name for names in searched.values() for name in names})
    unknown = [n for n in wanted if n not in known]
    if unknown or not wanted:
        raise click.BadParameter(f"{', '.join(unknown) or repr(names)}: the tuner searches {', '.join(known)}",
                                 param_hint="--families")
    chosen = {d: [n for n in names if n in wanted] for d, names in searched.items()}
    for direction, names in chosen.items():
        if not names:
            raise click.BadParameter(f"no family of {', '.join(wanted)} has {direction} kernels; the tuner searches "
                                     f"{', '.join(searched[direction])} for them", param_hint="--families")
    return chosen


def visible_devices() -> list[str] | None:
    """CUDA_VISIBLE_DEVICES's entries (indices or UUIDs), None when it is not set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if visible is None else [d.strip() for d in visible.split(",") if d.strip()]


def physical_device(device: str) -> str:
    """The CUDA_VISIBLE_DEVICES entry of the device that this process calls `device` (an index among those it sees):
    a child given it sees that GPU, not the machine's GPU of the same index."""
    visible = visible_devices()
    if visible is None:
        return device
    if int(device) >= len(visible):
        raise click.BadParameter(f"GPU {device} is not visible: CUDA_VISIBLE_DEVICES={','.join(visible)} shows "
                                 f"{len(visible)}, indexed from 0", param_hint="--devices")
    return visible[int(device)]


def device_list(devices: str | None, interpret: bool) -> list[str]:
    """The --devices to tune on: the given indices, else every visible GPU (one under --interpret)."""
    if devices is None:
        if interpret:
            return ["0"]
        import torch

        return [str(i) for i in range(torch.cuda.device_count())] or ["0"]
    chosen = [d.strip() for d in devices.split(",") if d.strip()]
    if not chosen or not all(d.isdigit() for d in chosen) or len(set(chosen)) != len(chosen):
        raise click.BadParameter(f"expected distinct GPU indices such as 0,1,3, got {devices!r}",
                                 param_hint="--devices")
    for device in chosen if not interpret else ():
        physical_device(device)  # (refuses an index past the visible GPUs)
    return chosen


def begin_at_part(problems: list, begin_at: str, group=None) -> list:
    """The problems from the start of the i-th of N equal parts, round to the one before it: tuners that begin at
    different parts spread over the problems, then each helps the others finish (claims keep them apart). With N > 1
    and `group` (problem -> key), the problems in the order of their keys first (stably): problems that share
    compiled kernels then fall in one tuner's part, which compiles them once, where interleaved parts had every
    tuner compile them at the same time (NOTES T3, T4)."""
    try:
        part, parts = (int(x) for x in begin_at.split("/"))
    except ValueError:
        raise click.BadParameter(f"expected i/N, got {begin_at!r}", param_hint="--begin-at") from None
    if parts > 1 and group is not None:
        problems = sorted(problems, key=group)
    start = len(problems) * part // max(parts, 1)
    return problems[start:] + problems[:start]


def in_turn(jobs: list, take):
    """`jobs` in order, each taken first (`take(job)`: False while another live tuner holds it); one held elsewhere
    is put off until every other is done, then taken anyway (its tuner helps finish it, or reports what the other
    recorded). So tuners that meet in their lists leapfrog each other to the end, each on problems of its own, where
    the one behind used to queue behind the other on every problem it was tuning (NOTES 142: 98 s of waits in a
    388-s two-GPU run)."""
    pending = list(jobs)
    while pending:
        job = next((job for job in pending if take(job)), pending[0])
        pending.remove(job)
        yield job


def taker(store, gpu):
    """`in_turn`'s take for tuners sharing `store`: hold the (problem, direction) in it (Store.claim_problem) unless
    a live process holds it; one whose holder died (its claim stands until it expires) is taken unheld."""
    return lambda job: store.claim_problem(gpu, *job, HOLD_S) or not store.problem_claim_live(gpu, *job)


def kernels_shared(problem) -> tuple:
    """What decides which compiled kernels a problem runs, besides the knobs: its variants, dtype, head dim, causal
    flag and the variants' settings (lengths and head counts are kernel arguments)."""
    return (sorted(problem.variants), problem.dtype, problem.head_dim, problem.causal, problem.window, problem.softcap,
            problem.alibi, problem.mask_mod, problem.score_mod, problem.page_size)


def fan_out(devices: list[str], options: dict) -> int:
    """One `autoflash tune` per device (CUDA_VISIBLE_DEVICES=that device) on the same database, the i-th beginning
    at the i-th part of the problems; their output line by line, prefixed by the device. A tuner that dies leaves
    the others running (they take its claimed variants over, and finish its problems as they go round). The exit
    status: 0 when every tuner succeeded, else the first failure's."""
    args = [options["shapes"]]
    for name in ("gpu", "trials", "time_budget", "mode", "db", "sampler", "seed", "trial_timeout", "workers",
                 "families"):
        if options[name] is not None:
            args += [f"--{name.replace('_', '-')}", str(options[name])]
    args += ["--interpret"] if options["interpret"] else []
    args += [arg for url in options["warm_from"] for arg in ("--warm-from", url)]
    click.echo(f"tuning on {len(devices)} devices ({', '.join(devices)}), one process each, sharing the database")
    children = []
    for i, device in enumerate(devices):
        # the child sees its GPU alone, as its device 0: the index counts among this process's visible GPUs
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=device if options["interpret"] else physical_device(device))
        command = [sys.executable, "-m", "autoflash", "tune", "--shapes", *args, "--devices", "0",
                   "--begin-at", f"{i}/{len(devices)}"]
        children.append((device, subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                  text=True)))
    errors = {}

    def relay(device, child):
        for line in child.stdout:
            click.echo(f"[gpu {device}] {line.rstrip()}")

    def keep_errors(device, child):
        errors[device] = child.stderr.read()  # progress bars and errors: shown for a tuner that failed

    threads = [threading.Thread(target=f, args=pair) for pair in children for f in (relay, keep_errors)]
    for thread in threads:
        thread.start()
    try:
        statuses = [child.wait() for _, child in children]
    except KeyboardInterrupt:  # the tuners heard it too (one process group): each saves what it finished
        for _, child in children:
            child.wait()
        click.echo("\ninterrupted: every finished trial is saved; run the same command to resume", err=True)
        return 130
    for thread in threads:
        thread.join()
    for (device, _), status in zip(children, statuses):
        if status:
            click.echo(f"[gpu {device}] exited with status {status}: {failure(errors[device], device)}", err=True)
    return next((status for status in statuses if status), 0)


def failure(stderr: str, device: str) -> str:
    """What a tuner that failed said: its error's last line (not the progress labels it printed before), and the
    file that keeps all it wrote to stderr."""
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()]
    starts = [i for i, line in enumerate(lines) if line.startswith(("Traceback (most recent call last)", "Error: "))]
    said = next((line for line in lines[starts[-1]:][::-1] if not line.startswith(" ")), "") if starts else ""
    fd, path = tempfile.mkstemp(prefix=f"autoflash-tune-gpu{device}-", suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(stderr)
    return f"{said or 'no error message'} (its stderr: {path})"


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
    lines = [f"{'problem':<36} {'dir':<3} {'trials':>6} {'failed':>6} {'ms':>9} {'TFLOP/s':>8} {'KV TB/s':>7} "
             f"{'vs SDPA':>7} {'wall s':>7} {'compile':>7} {'timing':>7} {'waits':>6}  best"]
    for r in reports:
        tbps = f"{r.kv_tbps:7.2f}" if r.kv_tbps else f"{'-':>7}"
        rate = f"{r.tflops:8.1f}" if r.tflops else f"{'-':>8}"
        ms = f"{r.best_ms:9.4f} {rate} {tbps}" if r.best_ms else f"{'-':>9} {'-':>8} {'-':>7}"
        speedup = f"{r.speedup:6.2f}x" if r.speedup else f"{'-':>7}"
        best = r.best.to_json() if r.best else f"no valid variant: {r.no_valid_variant}" if r.no_valid_variant \
            else "(no variant passed)" if r.trials else "(no trial finished here: other tuners hold its trials)"
        phases = " ".join(f"{r.seconds.get(name, 0.0):{width}.1f}" for name, width in (("compile", 7), ("time", 7),
                                                                                        ("wait", 6)))
        lines.append(f"{r.problem.label():<36} {r.direction:<3} {r.trials:>6} {r.failures:>6} {ms} {speedup} "
                     f"{r.wall_s:7.1f} {phases}  {best}")
    return "\n".join(lines)

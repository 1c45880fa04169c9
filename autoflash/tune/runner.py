"""Run trials in worker processes, so that no variant can take the tuner down with it.

Compile workers (one per core, GPU only) render, compile and run each variant once, ahead of
measurement and in parallel: Triton compilation is CPU-bound. One measuring worker then checks
and times the variants that compiled, one at a time. A worker that dies (an illegal memory
access) or outlives the per-trial timeout is killed and replaced, and its variant is recorded as
crashed (with the last line the worker wrote to stderr) or timeout; the run goes on.

Each compile worker holds one input set of its problem on the GPU: fifteen of them can run a large problem's GPU
out of memory (a paged KV cache of 32 x 32k tokens is ~5 GB a set), which says nothing of the variant. So a compile
worker short of device memory hands the variant on unrun (the measuring worker compiles and checks it), and the
compile workers free their inputs before the measuring worker builds its own.

Workers fork from a server process that imported torch and autoflash once (where the platform has one), so a dozen of
them start in about the time of one import, not of a dozen at once; the runner hands variants to each as soon as
it is up (NOTES 144).
"""

import multiprocessing
import os
import tempfile
import time
from collections import Counter
from dataclasses import replace
from multiprocessing.connection import wait

import torch

from autoflash.families import knobs_from_json
from autoflash.gpu import usable_cores
from autoflash.knobs import Knobs
from autoflash.problem import Problem
from autoflash.reference import sdpa_attention
from autoflash.tune import past
from autoflash.tune.packed import PackedBench
from autoflash.tune.trial import Bench, Outcome, classify

DEFAULT_LOADER = "autoflash.codegen:load"
_STARTUP_TIMEOUT = 600.0  # importing torch and building a problem's inputs and reference


def _context():
    """Forked from a server that preloads this module (torch, triton, the templates' loader), else spawned."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    return context


def _worker(conn, role: str, stderr: str, loader: str, interpret: bool, environ: dict):
    """A worker process: the runner's environment as it is now (the fork server keeps the one it started with), its
    stderr into the file `stderr` (whose last line tells why it died, if it does), then `_serve`."""
    os.environ.clear()
    os.environ.update(environ)
    fd = os.open(stderr, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)
    _serve(conn, role, loader, interpret)


# A compile worker's answer where the GPU's memory ran short in it: the variant goes on to the measuring worker.
_UNRUN = Outcome("ok")
# A worker's answer to a trial that reached it past the deadline it came with: not started, no outcome.
_NOT_STARTED = "not started"


def _device_memory_short(outcome: Outcome) -> bool:
    """The GPU's memory ran out (torch's allocator: "CUDA out of memory"), as opposed to a variant's shared memory
    or registers (Triton's "out of resource: shared memory")."""
    return outcome.status == "out_of_resources" and "out of memory" in (outcome.error or "").lower()


def _serve(conn, role: str, loader: str, interpret: bool):
    """Worker main loop: answer one request at a time, keeping the inputs of the latest problem and direction."""
    if interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    device = torch.device("cuda" if torch.cuda.is_available() and not interpret else "cpu")
    if device.type == "cuda" and role == "measure":
        _warm_up(device)
    bench, built, unbuilt = None, None, None  # the latest problem's Bench, its (problem, direction), or why not
    conn.send("ready")
    while True:
        request = conn.recv()
        if request is None:
            return
        kind, problem, direction, knobs_json, start_by = request
        if kind == "release":  # the runner measures next: the latest problem's inputs go
            bench, built = None, None
            if device.type == "cuda":
                torch.cuda.empty_cache()
            conn.send("released")
            continue
        if (problem, direction) != built:
            bench, built = None, (problem, direction)  # free the last problem's tensors first
            bench_class = PackedBench if "VARLEN" in problem.variants else Bench
            try:
                bench, unbuilt = bench_class(problem, direction, device, loader, measure=role == "measure"), None
            except Exception as e:  # e.g. its fp64 reference does not fit the device: every trial says so
                unbuilt = classify(e)
                unbuilt = replace(unbuilt, error=f"building the problem's inputs and fp64 reference failed: "
                                                 f"{unbuilt.error}")
                if device.type == "cuda":
                    torch.cuda.empty_cache()
        if bench is None:
            if role == "compile" and _device_memory_short(unbuilt):
                conn.send(_UNRUN)
                continue
            conn.send(unbuilt.error if kind == "sdpa" else unbuilt)
            if unbuilt.fatal:
                return
            continue
        if kind == "sdpa":
            try:
                conn.send(bench.sdpa_ms())
            except Exception as e:
                conn.send(f"{type(e).__name__}: {e}")
            continue
        if past(start_by):  # (checked as the trial would start: a request delayed on a loaded host starts nothing)
            conn.send(_NOT_STARTED)
            continue
        knobs = knobs_from_json(direction, knobs_json)
        outcome = bench.compile(knobs) if role == "compile" else bench.measure(knobs)
        if role == "compile" and _device_memory_short(outcome):
            outcome = _UNRUN
            if device.type == "cuda":
                torch.cuda.empty_cache()
        conn.send(outcome)
        if outcome.fatal:
            return


def _warm_up(device: torch.device):
    """The measuring worker's GPU context, cuBLAS (the fp64 reference) and SDPA's libraries (the baseline), made
    while the compile workers start, not in the first problem's timing seconds (NOTES 140: 10.5 -> 5.2 s). Not in
    the compile workers: the driver creates contexts one at a time host-wide, so theirs made at the start only
    lengthen it (ready 7.9 -> 18.4 s with two tuners). A failure here is left to the first request to report."""
    try:
        x = torch.ones(64, 64, device=device, dtype=torch.float64)
        x @ x
        for dtype in (torch.float16, torch.bfloat16):
            q = torch.ones(1, 2, 128, 64, device=device, dtype=dtype, requires_grad=True)
            sdpa_attention(q, q, q, True).sum().backward()
        torch.cuda.synchronize(device)
    except Exception:
        pass


class _Worker:
    def __init__(self, role: str, args: tuple):
        self.role, self.args = role, args
        self.job: Knobs | None = None
        self.times_out_at = 0.0
        self._start()

    def _start(self):
        context = _context()
        self.conn, child = context.Pipe()
        self.stderr = tempfile.NamedTemporaryFile(prefix=f"autoflash_{self.role}_", suffix=".log")
        self.process = context.Process(target=_worker, args=(child, self.role, self.stderr.name, *self.args,
                                                             dict(os.environ)), daemon=True)
        self.process.start()
        child.close()
        self.ready, self.ready_by = False, time.monotonic() + _STARTUP_TIMEOUT

    def last_words(self) -> str:
        """The last line the worker wrote to stderr: a dead worker's traceback ends with its error."""
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - 4096))
        lines = [line.strip() for line in self.stderr.read().decode(errors="replace").splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Whether the worker is up, waiting `timeout` seconds for it (None: until it is, or until its start times
        out); a worker that died starting, or did not start in time, raises."""
        if self.ready:
            return True
        left = self.ready_by - time.monotonic()
        wait_s = max(0.0, left if timeout is None else min(timeout, left))
        try:
            said = self.conn.recv() if self.conn.poll(wait_s) else None
        except (EOFError, OSError):  # it died starting: its last words say why
            said = "died"
        if said == "ready":
            self.ready = True
        elif said is not None or time.monotonic() >= self.ready_by:
            self.process.join(5)
            words = self.last_words()
            raise RuntimeError(f"a {self.role} worker failed to start (exit code {self.process.exitcode})"
                               + (f": {words}" if words else ""))
        return self.ready

    def send(self, request, timeout: float):
        self.wait_ready()
        self.conn.send(request)
        self.times_out_at = time.monotonic() + timeout

    def release(self):
        """Have the worker free its problem's inputs (a worker that does not answer is replaced); one not up yet
        holds none."""
        if not self.ready:
            return
        try:
            self.send(("release", None, None, None, None), _STARTUP_TIMEOUT)
            if self.conn.poll(_STARTUP_TIMEOUT) and self.conn.recv() == "released":
                return
        except (EOFError, OSError):
            pass
        self.restart()

    def restart(self):
        self.process.kill()
        self.process.join()
        self.conn.close()
        self.stderr.close()
        self._start()

    def stop(self):
        """Ask the worker to exit (it frees its GPU context on the way out); `close` waits for it."""
        try:
            self.conn.send(None)
        except (OSError, EOFError):
            pass

    def close(self):
        self.stop()
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.stderr.close()


def default_compile_workers(interpret: bool) -> int:
    """One compile worker a core but the tuner's; none in the interpreter, where compiling is running."""
    return 0 if interpret else max(1, usable_cores() - 1)


class Runner:
    """Compile, check and time variants; `run` returns one Outcome per variant it started. The workers live
    as long as the runner, across problems: start one runner for a whole tuning run. They start in the background:
    `run` hands variants to those that are up, `wait_ready` waits for all."""

    def __init__(self, *, interpret: bool, compile_workers: int | None = None, trial_timeout: float = 180.0,
                 loader: str = DEFAULT_LOADER):
        self.timeout = trial_timeout
        self.seconds: Counter = Counter()  # wall seconds spent compiling ("compile") and checking and timing ("time")
        args = (loader, interpret)
        if compile_workers is None:
            compile_workers = default_compile_workers(interpret)
        self.compilers = [_Worker("compile", args) for _ in range(compile_workers)]
        self.measurer = _Worker("measure", args)

    def wait_ready(self):
        for worker in (*self.compilers, self.measurer):
            worker.wait_ready()

    @property
    def measuring(self) -> bool:
        """Whether the measuring worker is up (not still starting)."""
        return self.measurer.wait_ready(0)

    def run(self, problem: Problem, variants: list[Knobs], on_outcome=lambda knobs, outcome: None,
            deadline: float | None = None) -> list[Outcome | None]:
        """One outcome per variant (all of one direction), None for a variant not started by `deadline` (a
        time.monotonic() time: no variant starts after it, one started finishes); `on_outcome` hears each final one
        as soon as it is known."""
        def compiled(knobs, outcome):
            if outcome.status != "ok":
                on_outcome(knobs, outcome)
        started = time.monotonic()
        if self.compilers:  # they start the variants; each one started is then checked and timed, deadline or not
            outcomes = self._map(self.compilers, problem, variants, compiled, deadline)
            for worker in self.compilers:  # their inputs would crowd the measuring worker's out of the GPU
                worker.release()
            compiled_at = time.monotonic()
            self.seconds["compile"] += compiled_at - started
            started = compiled_at
            to_measure = [k for k in variants if k in outcomes and outcomes[k].status == "ok"]
            outcomes.update(self._map([self.measurer], problem, to_measure, on_outcome, None))
        else:
            outcomes = self._map([self.measurer], problem, variants, on_outcome, deadline)
        self.seconds["time"] += time.monotonic() - started
        return [outcomes.get(k) for k in variants]

    def sdpa_ms(self, problem: Problem, direction: str = "fwd") -> float | None:
        """torch SDPA on `problem` (its forward, or its backward alone), timed by the measuring worker;
        None where it cannot run."""
        started = time.monotonic()
        self.measurer.send(("sdpa", problem, direction, None, None), self.timeout)
        try:
            answer = self.measurer.conn.recv() if self.measurer.conn.poll(self.timeout) else None
        except (EOFError, OSError):  # the worker died under it
            answer = None
        if answer is None:
            self.measurer.restart()
        self.seconds["time"] += time.monotonic() - started
        return answer if isinstance(answer, float) else None

    def _map(self, workers: list[_Worker], problem: Problem, variants: list[Knobs], on_outcome,
             deadline: float | None) -> dict[Knobs, Outcome]:
        """Hand variants to idle workers until `deadline`; collect outcomes as they come; replace dead or hung
        workers. A variant not handed out by the deadline, or handed out but reaching its worker after it (the
        worker checks again as it would start it), has no outcome."""
        pending, outcomes = list(variants), {}
        busy: dict[object, _Worker] = {}
        while True:
            if past(deadline):
                pending.clear()
            for worker in workers:
                if pending and worker.job is None and worker.wait_ready(0):
                    worker.job = pending.pop(0)
                    worker.send(("trial", problem, worker.job.DIRECTION, worker.job.to_json(), deadline), self.timeout)
                    busy[worker.conn] = worker
            starting = [w for w in workers if not w.ready] if pending else []
            if not busy and not starting:
                return outcomes
            first_timeout = min([w.times_out_at for w in busy.values()] + [w.ready_by for w in starting])
            for conn in wait([*busy, *(w.conn for w in starting)], timeout=max(0.0, first_timeout - time.monotonic())):
                if conn not in busy:  # a worker that is up (or died starting): the next round sees which
                    continue
                worker = busy.pop(conn)
                try:
                    outcome = conn.recv()
                except (EOFError, OSError):  # the process died under the variant
                    worker.process.join(5)  # reaped, so that its exit code (-11: a segfault) is known
                    words = worker.last_words()
                    outcome = Outcome("crashed", error=f"worker died (exit code {worker.process.exitcode})"
                                      + (f": {words}" if words else ""), fatal=True)
                if outcome == _NOT_STARTED:  # the deadline passed on the way: no outcome, as one never handed out
                    worker.job = None
                    continue
                outcomes[worker.job] = outcome
                on_outcome(worker.job, outcome)
                worker.job = None
                if outcome.fatal:
                    worker.restart()
            now = time.monotonic()
            for conn, worker in list(busy.items()):
                if worker.times_out_at <= now:
                    del busy[conn]
                    outcomes[worker.job] = Outcome("timeout", error=f"no result within {self.timeout:.0f} s")
                    on_outcome(worker.job, outcomes[worker.job])
                    worker.job = None
                    worker.restart()

    def close(self):
        workers = (*self.compilers, self.measurer)
        for worker in workers:  # all at once: each takes ~1 s to free its GPU context
            worker.stop()
        for worker in workers:
            worker.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

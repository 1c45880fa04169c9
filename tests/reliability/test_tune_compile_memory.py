"""Each compile worker holds an input set of its problem on the GPU, fifteen of them at once: on a paged KV cache
of 32 x 32k tokens (~5 GB a set) they ran the H100 out of memory, and 18 of 40 trials were recorded as the
variants' failures (out_of_resources), never to be chosen. Device memory short in a compile worker now hands the
variant on unrun to the measuring worker, which compiles and checks it itself; a variant's own shared-memory
limit still fails it; and the compile workers free their inputs before the measuring worker builds its own."""

import threading
from multiprocessing import Pipe

from autoflash.problem import Problem
from autoflash.tune import runner

BIG = Problem(32, 64, 8, 1, 32768, 128, False, "bfloat16")
SMALL = Problem(1, 2, 2, 16, 16, 16, False, "float16")
built = []


class _Bench:
    """Builds for SMALL only; compiling runs short of device memory or of shared memory, as the knobs say."""

    def __init__(self, problem, direction, device, loader, measure):
        if problem == BIG:
            raise RuntimeError("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
        self.problem = problem
        built.append(problem)

    def compile(self, knobs):
        if knobs.num_warps == 8:
            return runner.classify(RuntimeError("CUDA out of memory. Tried to allocate 512.00 MiB"))
        if knobs.num_warps == 2:
            return runner.classify(type("OutOfResources", (Exception,), {})(
                "out of resource: shared memory, Required: 262144, Hardware limit: 232448"))
        return runner.Outcome("ok")

    def measure(self, knobs):
        return runner.classify(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))


def _answer(conn):
    assert conn.poll(30), "the worker did not answer (it died)"
    return conn.recv()


def _worker(role, monkeypatch):
    monkeypatch.setattr(runner, "Bench", _Bench)
    ours, theirs = Pipe()
    thread = threading.Thread(target=runner._serve, args=(theirs, role, runner.DEFAULT_LOADER, True), daemon=True)
    thread.start()
    assert _answer(ours) == "ready"
    return ours, thread


def _stop(ours, thread):
    ours.send(None)
    thread.join(10)
    assert not thread.is_alive()


def test_device_memory_short_in_a_compile_worker_is_not_the_variants_failure(monkeypatch):
    ours, thread = _worker("compile", monkeypatch)
    for problem, knobs, status in ((BIG, '{"family": "tl"}', "ok"),  # the inputs do not fit: handed on
                                   (SMALL, '{"family": "tl", "num_warps": 8}', "ok"),  # its run does not fit
                                   (SMALL, '{"family": "tl", "num_warps": 2}', "out_of_resources"),  # the variant's
                                   (SMALL, '{"family": "tl"}', "ok")):
        ours.send(("trial", problem, "fwd", knobs, None))
        outcome = _answer(ours)
        assert outcome.status == status and not outcome.fatal, (problem, knobs, outcome)
        assert status == "ok" or "shared memory" in outcome.error
    _stop(ours, thread)


def test_the_measuring_worker_still_records_device_memory_short(monkeypatch):
    ours, thread = _worker("measure", monkeypatch)
    ours.send(("trial", SMALL, "fwd", '{"family": "tl"}', None))
    outcome = _answer(ours)
    assert outcome.status == "out_of_resources" and "out of memory" in outcome.error
    _stop(ours, thread)


def test_release_frees_the_inputs_and_the_next_trial_builds_them_again(monkeypatch):
    ours, thread = _worker("compile", monkeypatch)
    built.clear()
    for _ in range(2):
        ours.send(("trial", SMALL, "fwd", '{"family": "tl"}', None))
        assert _answer(ours).status == "ok"
    assert built == [SMALL]  # kept across the problem's trials
    ours.send(("release", None, None, None, None))
    assert _answer(ours) == "released"
    ours.send(("trial", SMALL, "fwd", '{"family": "tl"}', None))
    assert _answer(ours).status == "ok" and built == [SMALL, SMALL]
    _stop(ours, thread)

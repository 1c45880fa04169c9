"""A problem whose inputs or fp64 reference cannot be built (a 32k-token backward's reference ran the H100 out of
memory) is answered as failed trials by the tuner's worker, which lives on for the next problem; before, the
worker died and the `autoflash tune` run with it (rc 1, the problems after it never tuned)."""

import threading
from multiprocessing import Pipe

from autoflash.problem import Problem
from autoflash.tune import runner

BIG = Problem(1, 32, 8, 32768, 32768, 128, True, "bfloat16")
SMALL = Problem(1, 2, 2, 16, 16, 16, False, "float16")


class _Bench:
    """Builds for SMALL only; its trials succeed."""

    def __init__(self, problem, direction, device, loader, measure):
        if problem == BIG:
            raise RuntimeError("CUDA out of memory. Tried to allocate 34.00 GiB")
        self.problem, self.direction = problem, direction

    def measure(self, knobs):
        return runner.Outcome("ok", median_ms=1.0)

    def sdpa_ms(self):
        return 2.0


def _answer(conn):
    assert conn.poll(30), "the worker did not answer (it died)"
    return conn.recv()


def test_a_problem_that_cannot_be_built_fails_its_trials_and_the_worker_goes_on(monkeypatch):
    monkeypatch.setattr(runner, "Bench", _Bench)
    ours, theirs = Pipe()
    worker = threading.Thread(target=runner._serve, args=(theirs, "measure", runner.DEFAULT_LOADER, True),
                              daemon=True)
    worker.start()
    assert _answer(ours) == "ready"
    knobs = '{"family": "tl"}'
    ours.send(("trial", BIG, "bwd", knobs, None))
    outcome = _answer(ours)
    assert outcome.status == "out_of_resources" and not outcome.fatal
    assert "fp64 reference failed" in outcome.error and "out of memory" in outcome.error
    ours.send(("sdpa", BIG, "bwd", None, None))
    assert "out of memory" in _answer(ours)  # a reason, not a time: the tuner reports no SDPA ratio
    ours.send(("trial", SMALL, "fwd", knobs, None))
    assert _answer(ours).status == "ok"
    ours.send(None)
    worker.join(10)
    assert not worker.is_alive()

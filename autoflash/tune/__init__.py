"""Tuning: search.py (Optuna, knows nothing of SQL or Triton) -> runner.py (compile, check, time in
worker processes) -> timing.py (medians that the L2 cache does not flatter); tuner.py ties them to the store."""

import time

# The samplers search.make_sampler makes: named here, so that `autoflash --help` lists them without Optuna.
SAMPLERS = ("tpe", "random", "grid")


def past(deadline: float | None) -> bool:
    """Whether `deadline` (a time.monotonic() time; None: none) has come."""
    return deadline is not None and time.monotonic() >= deadline


def earliest(deadline: float | None, budget_s: float | None) -> float | None:
    """The earlier of `deadline` (a time.monotonic() time) and `budget_s` seconds from now (None: no limit)."""
    if budget_s is None:
        return deadline
    end = time.monotonic() + budget_s
    return end if deadline is None else min(deadline, end)

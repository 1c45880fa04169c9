"""Tuning: search.py (Optuna, knows nothing of SQL or Triton) -> runner.py (compile, check, time in
worker processes) -> timing.py (medians that the L2 cache does not flatter); tuner.py ties them to the store."""

# The samplers search.make_sampler makes: named here, so that `autoflash --help` lists them without Optuna.
SAMPLERS = ("tpe", "random", "grid")

"""A kernel loader whose every variant loads SECONDS slower, noting when each load began (a time.monotonic() time,
one a line, in the file $SLOW_KERNELS_LOG): to test that no trial starts past a deadline.

Used as `loader="slow_kernels:load"` (tests/ is on the workers' path); the variants are real.
"""

import os
import time

from autoflash import codegen

SECONDS = 5.0
LOG_ENV = "SLOW_KERNELS_LOG"


def load(knobs, *gates):
    with open(os.environ[LOG_ENV], "a") as log:
        log.write(f"{time.monotonic()}\n")
    time.sleep(SECONDS)
    return codegen.load(knobs, *gates)

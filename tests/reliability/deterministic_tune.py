"""`python deterministic_tune.py tune ...`: the autoflash command, with each variant's time a fixed function of its
knobs, so that two runs of one search pick the same winner (interpreter timings are noise).

The variants still run and are checked as in any run; only their measured time is replaced. Spawned workers import
this file again as `__mp_main__`, so the patch below holds in them too. Each problem's searched space, a pure
function that takes seconds in the interpreter, is computed once per test session and then read from a file.
"""

import dataclasses
import hashlib
import json
import os
import tempfile
import zlib
from pathlib import Path

from autoflash.tune import tuner
from autoflash.tune.search import valid_points
from autoflash.tune.trial import Bench

_measure = Bench.measure


def fixed_ms(knobs_json: str) -> float:
    return 1.0 + zlib.crc32(knobs_json.encode()) % 1000 / 100


def _measure_deterministically(self, knobs):
    outcome = _measure(self, knobs)
    return dataclasses.replace(outcome, median_ms=fixed_ms(knobs.to_json())) if outcome.status == "ok" else outcome


Bench.measure = _measure_deterministically
_searched_space = tuner.searched_space


def _remembered_space(family, problem, gpu, direction="fwd"):
    key = hashlib.sha256(repr((family.name, problem, gpu, direction)).encode()).hexdigest()[:24]
    path = Path(os.environ["AUTOFLASH_CACHE_DIR"]) / "searched_spaces" / f"{key}.json"
    if not path.exists():
        is_valid, space = _searched_space(family, problem, gpu, direction)
        points = valid_points(space, is_valid) if all(space.values()) else []
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as f:
            json.dump({"space": space, "points": points}, f)
        os.replace(f.name, path)
    saved = json.loads(path.read_text())
    valid = {json.dumps(point, sort_keys=True) for point in saved["points"]}
    return (lambda point: json.dumps(point, sort_keys=True) in valid), saved["space"]


tuner.searched_space = _remembered_space

if __name__ == "__main__":
    from autoflash.cli import main

    main()

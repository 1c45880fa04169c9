"""A knob against the Gluon family's default, cell by cell, from one run of benchmarks/gluon_fwd.py or gluon_bwd.py
with `--variants '["default", {... the knob ...}]'` (gpu_next.sh's knob steps): for each problem and each variant
naming KNOB, the median time of its repeats against the default's and against plain SDPA's, then the geomean.

    python benchmarks/knob_ratio.py ROWS.jsonl KNOB
"""

import json
import math
import statistics
import sys

DEFAULTS = ("gluon default", 'gluon "default"')  # gluon_bwd.py's and gluon_fwd.py's name for the default's rows


def main(argv=None):
    path, knob = (argv or sys.argv[1:])[:2]
    times = {}  # problem -> backend -> ms of each repeat
    for row in map(json.loads, open(path)):
        times.setdefault(row["problem"], {}).setdefault(row["backend"], []).append(row["ms"])
    ratios = {}
    for problem, by in times.items():
        ms = {backend: statistics.median(repeats) for backend, repeats in by.items()}
        default = next((ms[name] for name in DEFAULTS if name in ms), None)
        for backend in ms:
            if backend.startswith("gluon") and knob in backend and default:
                ratios.setdefault(backend, []).append(default / ms[backend])
                print(f"{problem:32s} {backend[6:]:50s} {default / ms[backend]:.3f}x default, "
                      f"{ms['sdpa'] / ms[backend]:.3f}x sdpa (default {ms['sdpa'] / default:.3f}x)")
    for backend, values in ratios.items():
        print(f"geomean {backend[6:]} / default {math.exp(sum(map(math.log, values)) / len(values)):.3f}x over "
              f"{len(values)}")


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env bash
# How many Triton compiles this host runs at once at full speed (NOTES 142): two tuners' compile pools (11 workers
# each at 11 trials) slowed each other's compiles 1.45x on an nvidia-h200-x2 host of 32 cores, where T4's earlier
# host showed no slowdown. Compiles one Gluon forward variant for sm_90 (no GPU used; tests/gluon_sm90.py) in N
# processes at once, each with a Triton cache of its own, for each N given; one JSON line per N: the mean and the
# slowest process's seconds (Python's start and Triton's import, ~2 s, then the compile, ~4 s on one free core),
# with the host's CPU model and cores.
#   . .device/setup.sh && bash benchmarks/compile_capacity.sh $OUT [N ...]     # N: 1 11 22 by default
set -u
out=$1
shift
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
model=$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)
case='[[{}, 128, "float16", true, true]]'
[ $# -gt 0 ] || set -- 1 11 22
for n in "$@"; do
    for ((i = 0; i < n; i++)); do
        ( start=$(date +%s.%N)
          TRITON_CACHE_DIR=$tmp/cache_${n}_$i env -u TRITON_INTERPRET python tests/gluon_sm90.py "$case" > /dev/null 2> "$tmp/err_${n}_$i" \
              || { echo "compile $i of $n failed: $(tail -n 1 "$tmp/err_${n}_$i")" >&2; exit 1; }
          python -c "print(round($(date +%s.%N) - $start, 2))" > "$tmp/seconds_${n}_$i" ) &
    done
    wait
    python - "$tmp" "$n" "$model" "$(nproc)" <<'EOF' | tee -a "$out/$(date +%F)_compile_capacity.jsonl"
import json, pathlib, sys
tmp, n, model, cores = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
seconds = [float(p.read_text()) for p in sorted(tmp.glob(f"seconds_{n}_*"))]
print(json.dumps(dict(processes=n, done=len(seconds), mean_s=round(sum(seconds) / max(1, len(seconds)), 2),
                      slowest_s=max(seconds, default=None), cpu=model, cores=cores,
                      command="bash benchmarks/compile_capacity.sh OUT")))
EOF
done

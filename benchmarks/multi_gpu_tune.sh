#!/usr/bin/env bash
# Wall time of one tuning campaign on 1 GPU and on 2 (issue 19's speed-up): the same problems file, trials and seed,
# a fresh SQLite database and a fresh Triton cache each, so neither run starts from the other's compiled kernels.
#   . .device/setup.sh && bash benchmarks/multi_gpu_tune.sh $OUT [shapes file] [trials]
# Writes $OUT/<date>_multi_gpu_tune.jsonl (one line per run: devices, seconds, trials recorded) and the logs.
# DEVICE_SETS="0" or "0,1" runs one of the two (a campaign longer than a device call: each in a call of its own).
# A run longer than a call (NOTES 140): RESUME=folder keeps each run's database there (a folder of the tree, copied
# back from $OUT between calls: the next call resumes from it) and LIMIT=seconds interrupts the tuners after that long
# (SIGINT: every finished trial is saved); each call's line gives its seconds, and "finished" once the run is done.
set -uo pipefail
out=$1 shapes=${2:-examples/small_batch.yaml} trials=${3:-3}
mkdir -p "$out"
day=$(date +%F)
gpu=$(python -c "import torch; print(torch.cuda.get_device_name())")
host="\"cpu\": \"$(lscpu | sed -n 's/^Model name: *//p' | head -n 1)\", \"cores\": $(nproc)"  # (hosts differ: NOTES 142)
versions=$(python -c "import torch, triton, optuna; print(f'\"torch\": \"{torch.__version__}\", \"triton\": \"{triton.__version__}\", \"optuna\": \"{optuna.__version__}\"')")
for devices in ${DEVICE_SETS:-0 0,1}; do
    tag=${devices/,/_}
    if [ -n "${RESUME:-}" ]; then
        mkdir -p "$RESUME" && db=$(realpath "$RESUME")/multi_gpu_$tag.db
    else
        db=/tmp/multi_gpu_$tag.db && rm -f "$db"
    fi
    start=$(date +%s.%N)
    TRITON_CACHE_DIR=/tmp/triton_cache_$tag timeout -s INT -k 60 "${LIMIT:-0}" python -m autoflash tune --shapes "$shapes" \
        --mode fwd --trials "$trials" --seed 0 --db "sqlite:///$db" --devices "$devices" \
        >> "$out/${day}_multi_gpu_tune_$tag.log" 2>&1
    rc=$?
    seconds=$(python -c "print(round($(date +%s.%N) - $start, 1))")
    [ -n "${RESUME:-}" ] && cp "$db"* "$out/"  # (with its -wal and -shm files, where SQLite left them)
    recorded=$(python -c "import sqlite3; print(sqlite3.connect('$db').execute('select count(*) from autoflash_trials').fetchone()[0])" \
               2>/dev/null || echo null)
    line="{\"devices\": \"$devices\", \"seconds\": $seconds, \"rc\": $rc, \"finished\": $([ $rc = 0 ] && echo true || echo false), \"trial_rows\": $recorded, \"shapes\": \"$shapes\", \"trials\": $trials, \"gpu\": \"$gpu\", $host, $versions, \"date\": \"$day\", \"command\": \"${RESUME:+RESUME=$RESUME }${LIMIT:+LIMIT=$LIMIT }bash benchmarks/multi_gpu_tune.sh OUT $shapes $trials\"}"
    echo "$line" | tee -a "$out/${day}_multi_gpu_tune.jsonl"
done

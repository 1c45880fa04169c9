#!/usr/bin/env bash
# Retune problem files after a template change, warm-started from the database's earlier winners (the tuner
# tries them first), and print each file's report:
#   bash benchmarks/retune.sh fwd "fa_grid fa_grid_bf16 odd_shapes gqa small_batch" /tmp/retune.db [trials]
# The database starts as a copy of tuning_db/h100.db; gather its current records into the shipped one with
#   autoflash merge --into tuning_db/h100.db /tmp/retune.db --current-only --standalone
set -uo pipefail
mode=$1 files=$2 db=$3 trials=${4:-4}
[ -f "$db" ] || cp tuning_db/h100.db "$db"
for f in $files; do
    python -m autoflash tune --gpu h100 --mode "$mode" --shapes "examples/$f.yaml" --trials "$trials" --db "$db" \
        2>>"${db%.db}.stderr"  # progress bars, and what a dying worker says (NOTES G-bwd7: its cause was lost)
    rc=$?
    echo "$f rc $rc"
    [ $rc = 130 ] && exit 130  # interrupted: the finished trials are saved, the files after it wait
done

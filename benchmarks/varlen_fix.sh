#!/usr/bin/env bash
# NOTES V5: the packed forward's fix branches (benchmarks/results/varlen_fix/<branch>.patch, each `git format-patch`
# of the branch on main) beside main, on one machine. Each tree is this one copied (patched) under /tmp/vf_<name>.
# Run in session 19 (NOTES 64) from commit aee5b11; fix12 landed after it (33a95f7, d658380), so on later commits the
# patches no longer apply: `git worktree add /tmp/vf aee5b11` to rerun.
#   . .device/setup.sh && bash benchmarks/varlen_fix.sh bench $OUT [TREES]   # speed, the Gluon default forced
#   . .device/setup.sh && bash benchmarks/varlen_fix.sh tests $OUT [TREES]   # tests/test_gpu_varlen.py on each
# TREES: names among main, varlen-fwd-fix1, varlen-fwd-fix2, varlen-fwd-fix12 (default: all four). The Gluon default
# is forced beside the dispatched knobs since a branch moves the VARLEN forward's fingerprint (its packed records no
# longer count there). Logs and rows: $OUT/vf_<name>_*.{log,jsonl}, packed into $OUT/vf_<phase>.tgz; one line a run
# in $OUT/vf_summary.txt. Under VF_BUDGET (540) seconds.
set -uo pipefail
phase=${1:?usage: bash benchmarks/varlen_fix.sh bench|tests OUT [TREES]} out=${2:?OUT}
trees=${3:-main varlen-fwd-fix1 varlen-fwd-fix2 varlen-fwd-fix12}
mkdir -p "$out"
root=$(pwd)
. "$root/benchmarks/patched_tree.sh"
budget=${VF_BUDGET:-540}
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
say() { echo "$*" | tee -a "$out/vf_summary.txt"; }
knobs='[{}, {"family": "gluon", "default": true}]'  # {}: as dispatched, and the dense baselines

for name in $trees; do
    dir=/tmp/vf_$name patch=
    [ "$name" = main ] || patch="$root/benchmarks/results/varlen_fix/$name.patch"
    copy_tree "$dir" "$patch" || { say "$name: PATCH FAILED (does main still match?)"; continue; }
    case $phase in
    bench)
        for lengths in 2048,2048 128,8192; do
            lim=$(left); [ "$lim" -gt 150 ] && lim=150
            if [ "$lim" -lt 45 ]; then say "$name $lengths: SKIPPED (${lim}s left)"; continue; fi
            rows="$out/vf_${name}_${lengths/,/_}.jsonl"
            (cd "$dir" && PYTHONPATH="$dir:$PYTHONPATH" timeout -k 10 "$lim" python benchmarks/varlen.py \
                --lengths "$lengths" --knobs "$knobs" --profile --out "$rows" > "$out/vf_${name}_${lengths/,/_}.log" 2>&1)
            say "$name $lengths: rc=$? | $(grep -E -A1 '^fwd ' "$out/vf_${name}_${lengths/,/_}.log" | grep -v -e '^--' -e _warn \
                | sed -E 's/ \{"block_m.*//' | tr -s ' ' | tr '\n' ';')"
        done ;;
    tests)
        lim=$(left); [ "$lim" -gt 200 ] && lim=200
        if [ "$lim" -lt 60 ]; then say "$name tests: SKIPPED (${lim}s left)"; continue; fi
        (cd "$dir" && PYTHONPATH="$dir:$PYTHONPATH" timeout -k 10 "$lim" python -m pytest -q -m gpu -n 8 \
            tests/test_gpu_varlen.py -p no:cacheprovider > "$out/vf_${name}_tests.log" 2>&1)
        say "$name tests: rc=$? | $(result_line "$out/vf_${name}_tests.log")" ;;
    esac
done
(cd "$out" && tar czf "vf_$phase.tgz" vf_varlen* vf_main* && rm -f vf_varlen* vf_main*)  # (8 files come back)
say "varlen_fix.sh $phase: $(( $(date +%s) - t0 ))s of ${budget}s"

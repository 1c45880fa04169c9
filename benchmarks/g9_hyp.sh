#!/usr/bin/env bash
# NOTES G9: tile_overlap computes wrong results under causal masking, with dynamic tiles and with three consumers.
# Four candidate fixes (benchmarks/results/g9_hyp/hypN.patch, each `git format-patch` of branch g9-hypN on main; each
# also lets violations() run those cases and makes test_tile_overlap cover them: causal and full x plain, ping-pong,
# O in Q, both, dynamic, three consumers x head dims 64/128 x 4 lengths: 97 tests), then, in the time left,
# diagnostics (benchmarks/g9_diag.py).
#   hyp1  the cross-tile step in series: this tile's last P V waited for before the next tile's S0 is issued
#   hyp2  the step's two wgmma groups kept, but nothing it read (K0, V, this tile's Q slot) released until both are done
#   hyp3  the step's two wgmma groups kept, its softmax not: S0 carried raw, block 0's softmax at the next tile's top
#   hyp4  the bracket: hyp1 with a proxy fence and a warpgroup barrier before each issue, the Q slot held as in hyp2
# Reading: hyp1 and hyp4 pass, hyp2 and hyp3 fail -> two wgmma groups in flight across the tile boundary are the
# fault; hyp3 passes -> the next tile's softmax under the P V or its P/m/l carried through the epilogue; hyp2 passes
# -> a slot released too early; all fail -> not the step (see the diagnostics: diag_nostart runs the same structure
# with the step never taken; ctrl_* cases are main's kernels without tile_overlap).
#
#   . .device/setup.sh && bash benchmarks/g9_hyp.sh $OUT
#
# Each hypothesis runs on a copy of this tree (no .git needed: `patch -p1`) under /tmp/g9_hypN:
#   python -m pytest -q -m gpu -n 8 -x tests/test_gluon_fwd.py -k tile_overlap   (timeout 120 s)
# logs: $OUT/g9_hypN.log, one summary line each; $OUT/g9_diag*.{log,jsonl}. Total under G9_BUDGET (490) seconds.
set -uo pipefail
out=${1:?usage: bash benchmarks/g9_hyp.sh OUT}
mkdir -p "$out"
root=$(pwd)
patches="$root/benchmarks/results/g9_hyp"
budget=${G9_BUDGET:-490}
t0=$(date +%s)
left() { echo $(( budget - ($(date +%s) - t0) )); }
summary="$out/g9_summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }

. "$root/benchmarks/patched_tree.sh"

for n in 1 2 3 4; do
    dir=/tmp/g9_hyp$n log="$out/g9_hyp$n.log"
    lim=$(left); [ "$lim" -gt 120 ] && lim=120
    if [ "$lim" -lt 40 ]; then say "hyp$n: SKIPPED (${lim}s of the budget left)"; continue; fi
    if ! copy_tree "$dir" "$patches/hyp$n.patch"; then say "hyp$n: PATCH FAILED (does main still match?)"; continue; fi
    start=$(date +%s)
    (cd "$dir" && PYTHONPATH="$dir" timeout -k 10 "$lim" python -m pytest -q -m gpu -n 8 -x tests/test_gluon_fwd.py \
        -k tile_overlap -p no:cacheprovider > "$log" 2>&1)
    rc=$?
    took=$(( $(date +%s) - start ))
    case $rc in
        0) verdict=PASS ;;
        124|137) verdict=TIMEOUT ;;
        *) verdict=FAIL ;;
    esac
    # (-q's progress characters: how far a run got, where it timed out)
    progress=$(grep -E '^[.FsExX]+( +\[ *[0-9]+%\])?$' "$log" | tr -cd '.FE' )
    failed=$(tr -cd 'FE' <<< "$progress" | wc -c)
    say "hyp$n: $verdict rc=$rc ${took}s (${#progress} run, $failed failed) | $(result_line "$log")"
done

# -- diagnostics, in the time left: main's tile_overlap kernels (and controls without it) per block of rows; then the
# same structure with the step never taken (diag_nostart.patch) --
lim=$(left)
if [ "$lim" -ge 60 ]; then
    [ "$lim" -gt 200 ] && lim=200
    (PYTHONPATH="$root" timeout -k 10 "$lim" python benchmarks/g9_diag.py --out "$out/g9_diag.jsonl" \
        > "$out/g9_diag.log" 2>&1)
    say "diag (main's kernels): rc=$? (benchmarks/g9_diag.py; $out/g9_diag.log)"
    grep -E "^[a-z0-9_]+:|^    wrong|^    fault" "$out/g9_diag.log" | cut -c1-400 | tee -a "$summary"
else
    say "diag: SKIPPED (${lim}s left)"
fi
lim=$(left)
if [ "$lim" -ge 45 ] && copy_tree /tmp/g9_nostart "$patches/diag_nostart.patch"; then
    cp "$root/benchmarks/g9_diag.py" /tmp/g9_nostart/benchmarks/
    (cd /tmp/g9_nostart && PYTHONPATH=/tmp/g9_nostart timeout -k 10 "$lim" python benchmarks/g9_diag.py \
        --cases to_causal_static_d128,to_full_dynamic_d128,to_c3_causal_123 --out "$out/g9_diag_nostart.jsonl" \
        > "$out/g9_diag_nostart.log" 2>&1)
    say "diag_nostart (the step never taken): rc=$?"
    grep -E "^[a-z0-9_]+:|^    wrong" "$out/g9_diag_nostart.log" | cut -c1-300 | tee -a "$summary"
else
    say "diag_nostart: SKIPPED (${lim}s left)"
fi
say "g9_hyp.sh: $(( $(date +%s) - t0 ))s of ${budget}s"

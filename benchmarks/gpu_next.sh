#!/usr/bin/env bash
# The GPU steps that land a template change (fingerprints change: every record of the changed families must be
# re-measured before main ships them). One step per device call (each fits the 10-minute limit on an H100):
#   . .device/setup.sh && bash benchmarks/gpu_next.sh check   $OUT   # GPU tests of the kernels, the Gluon sweep
#   . .device/setup.sh && bash benchmarks/gpu_next.sh gluon   $OUT   # G6: dynamic tiles against the defaults
#   . .device/setup.sh && bash benchmarks/gpu_next.sh fwd     $OUT   # retune fwd (tl + gluon), merged
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bwd     $OUT   # retune bwd, merged (TRIALS=12 ...: more a problem)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bench   $OUT   # the FA grid, fwd and bwd, from the new db
#   . .device/setup.sh && bash benchmarks/gpu_next.sh varlen  $OUT   # packed sequences and KV caches: tests, speed
#   . .device/setup.sh && bash benchmarks/gpu_next.sh gbwd    $OUT   # variants' and varlen's GPU tests; the Gluon
#                                                                       backward's checks, tests and speed
#   . .device/setup.sh && bash benchmarks/gpu_next.sh variants $OUT  # window/softcap/ALiBi beside FlexAttention
#   . .device/setup.sh && bash benchmarks/gpu_next.sh sweeps  $OUT   # varlen/KV-cache: tests, host tables, key splits
#                                                                       (NOTES V1, K1), compile overhead (issue 19)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh variant-knobs $OUT  # the variants' forward under 8 warps (NOTES 53)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bwd-knobs $OUT  # tl backward points without spills (NOTES 54)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh varlen-tma $OUT # packed sequences through descriptors (NOTES 55)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh on-miss $OUT    # tune on first use, three untuned problems (18)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh small-passes $OUT  # NOTES 100-102: graphs off/on, host per call,
#                                                                       a forward's two timings, then holdout
#   . .device/setup.sh && bash benchmarks/gpu_next.sh cross-splits $OUT  # NOTES 107-108: query_splits off/on in GPU
#                                                                       time, replayed host steps, then holdout
#   . .device/setup.sh && bash benchmarks/gpu_next.sh group-floor $OUT  # NOTES 109: borrowed GQA causal backwards
#                                                                       split floored, off/on, then holdout
#   . .device/setup.sh && bash benchmarks/gpu_next.sh holdout $OUT    # the fallback on 24 held-out problems, from a
#                                                                       fresh wheel (18; carry dist, built here first)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bwd-all $OUT    # every backward file retuned, merged, benched
#                                                                       (after a Gluon backward template change: NOTES G-bwd8, G-bwd17)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh gluon-variants $OUT  # window, softcap,
#                                                                       ALiBi in the Gluon backward (NOTES G-bwd15)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh dq-writer $OUT # dQ by a warp of its own (NOTES G-bwd16)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bwd-causal-short $OUT  # dQ added by the warpgroups in turns at
#                                                                       d64: its GPU tests, then beside the default (NOTES G-bwd20)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bwd-d128 $OUT  # dV's wgmma after dS^T's store (dv_late,
#       NOTES G-bwd21): its GPU tests (~200 s), then default vs dv_late on the fp16 grid's 12 d128 cells (~320 s)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh split-keys $OUT  # past head dim 128 the warpgroups on 32 keys
#                                                                       each: its GPU tests, then speed (NOTES 116)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh split-keys-tiles $OUT  # the same over two column tiles, to
#                                                                       head dim 192: tests, then speed (NOTES 118)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh consumer-keys $OUT  # the forward's consumers each to their
#                                                                       own rows' diagonal: tests, speed (NOTES 120)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh gqa     $OUT   # the Gluon backward's GPU
#                                                                       tests, group_splits beside the default on
#                                                                       GQA causal, host time (NOTES G-bwd13/14)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh deep-bwd $OUT   # the FA grid's backward searched on to 10 trials
#   . .device/setup.sh && bash benchmarks/gpu_next.sh deep-fwd $OUT   # a family (a rerun resumes), merged, benched; forward too
#                                                                       (NOTES 60)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh gluon-varlen $OUT  # branch gfwd-varlen: the Gluon forward over
#                                                                       packed sequences, tests then speed (NOTES V3)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh varlen-retune $OUT  # then its packed problems retuned, merged
#   . .device/setup.sh && bash benchmarks/gpu_next.sh gluon-varlen-bwd $OUT  # branch gbwd-varlen: the Gluon backward
#                                                                       over packed sequences, tests then speed (NOTES V4)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh gluon-maskmod $OUT  # branch gluon-maskmod: the Gluon forward's
#                                                                       mask_mod gate, tests then speed (NOTES G8)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh gluon-maskmod-bwd $OUT  # branch gbwd-maskmod: the Gluon
#                                                                       backward's mask_mod gate, tests then speed (NOTES G-bwd19)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh tile-overlap $OUT  # branch gfwd-tile-overlap: a tile's block 0
#                                                                       under the last tile's last P V, tests then speed (NOTES G9)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh one-loop $OUT  # G10: one masked key-block loop (a patched copy),
#                                                                       its tests, then short cells beside the default
#   . .device/setup.sh && bash benchmarks/gpu_next.sh tile-overlap-hyp3 $OUT  # G9: main's cross-tile step beside
#                                                                       hyp3's (results/g9_hyp/hyp3.patch), fp16 grid
#   . .device/setup.sh && bash benchmarks/gpu_next.sh paged-retune $OUT  # KV-cache decode searched again (NOTES 67),
#       benched; with PATCH=benchmarks/results/paged_rows/paged-rows.patch on a copy with it (NOTES K7)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh decode-gap $OUT  # decode's time outside its kernels (69)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh skip-idle $OUT  # G15: idle consumers' blocks released unread
#   . .device/setup.sh && bash benchmarks/gpu_next.sh head-dim-split $OUT  # G16 (with the branch head-dim-split
#                                                                       checked out): tests, then beside the default
#   . .device/setup.sh && bash benchmarks/gpu_next.sh fwd-host $OUT  # G18: the Gluon forward's descriptors copied
#                                                                       per call: host time before, tests, after
#   . .device/setup.sh && bash benchmarks/gpu_next.sh host-floor $OUT # host time per call, garbage collector on/off,
#                                                                       the autograd backward profiled (NOTES 76)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh mqa-split $OUT  # G-bwd22: uneven group splits, tests, then
#                                                                       MQA 71:1 and GQA 7:1 backward before/after
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bwd-split $OUT  # G-bwd23: the backward's head dim in two
#                                                                       column tiles: tests, d160/d192 padded vs split
#   . .device/setup.sh && bash benchmarks/gpu_next.sh shared-scores $OUT  # G-bwd24: S^T and dP^T once a step past
#                                                                       head dim 128: tests, d224/d256 before/after
#   . .device/setup.sh && bash benchmarks/gpu_next.sh split-retune $OUT  # after G-bwd23: the campaign's d160/d192
#                                                                       backward records searched one trial further (79)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh short128-ncu $OUT  # the 128-token GQA forward's kernels beside
#                                                                       SDPA's under ncu (NOTES 109, issue 18)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh short-ncu $OUT  # stall sampling, short causal vs 16k vs cuDNN (66)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bwd-graphs $OUT  # NOTES 94, branch bwd-graphs (wheel in dist/
#       first): small backwards from CUDA graphs, tests, host time, the held-out run
#   . .device/setup.sh && bash benchmarks/gpu_next.sh capture $OUT  # NOTES 87: a training step captured whole (its
#                                                                       GPU test), the bench's backward under graphs, the bisect
# Issue 18's coverage campaign, resumable call by call (copy the returned tuning_db/<family>.db back between calls),
# on any kind (every visible GPU tunes; nvidia-h100-x4 or nvidia-h200-x4 for speed):
#   . .device/setup.sh && bash benchmarks/campaign.sh $OUT 540 4
# A step of this file on GPU 0 while the campaign tunes on the others, in one call (a branch's step: PATCH=file):
#   . .device/setup.sh && PATCH=bg.patch bash benchmarks/beside_campaign.sh $OUT bwd-graphs 470
# Several of these steps (or any commands) at once, each on its own GPUs and cores, one archive back (NOTES 111):
#   . .device/setup.sh && bash benchmarks/gpu_parallel.sh $OUT 570 'bash benchmarks/gpu_next.sh variants $out' ...
# On the 2-GPU kind (nvidia-h200-x2):
#   . .device/setup.sh && bash benchmarks/gpu_next.sh ring    $OUT   # ring attention beside one GPU (NOTES 46, R1)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh ring-dynamic $OUT  # the steps' tiles claimed dynamically (R2)
#   . .device/setup.sh && bash benchmarks/multi_gpu_tune.sh   $OUT   # a campaign on 1 GPU and on 2 (issue 19)
# Logs and JSON lines land in $OUT, named by the GPU family (the device tool brings them back); copy what NOTES cite
# to benchmarks/results/. A machine may be a fresh one at every call: after fwd and after bwd, copy the returned
# <gpu family>.db over tuning_db/ here before the next step (bwd retunes on top of fwd's records; bench reads both).
set -uo pipefail
step=$1 out=$2

reap() {  # a timed-out pytest's xdist workers outlive it and keep their GPU memory: the next step would run out.
          # Only this step's GPUs (CUDA_VISIBLE_DEVICES): a campaign on the machine's other GPUs is left alone.
    nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} --query-compute-apps=pid --format=csv,noheader \
        2>/dev/null | xargs -r kill -9 2>/dev/null
}
limit() {  # timeout [-s SIG] SECONDS CMD...; then reap what it left behind
    timeout -k 10 "$@"; local rc=$?
    [ $rc -ge 124 ] && reap
    return $rc
}
patched_copy() {  # patched_copy NAME PATCH: continue in /tmp/NAME, a copy of this tree with PATCH applied and its
                  # databases re-keyed to the patched templates (a knob whose off position renders the old source)
    local root db; root=$(pwd); . benchmarks/patched_tree.sh
    copy_tree "/tmp/$1" "$root/$2" || { echo "PATCH FAILED: $2"; exit 1; }
    for db in "/tmp/$1"/tuning_db/*.db; do python benchmarks/rekey_records.py "$root" "/tmp/$1" "$db"; done
    cd "/tmp/$1" && export PYTHONPATH="/tmp/$1:$PYTHONPATH"
}
knob_tests() {  # knob_tests NAME KEYWORDS: the Gluon forward's and the packed forward's GPU tests that -k KEYWORDS selects
    limit 240 python -m pytest -q -m gpu -n 12 -p no:cacheprovider tests/test_gluon_fwd.py tests/test_gpu_varlen.py \
        -k "$2" > "$out/${day}_${gpu}_gpu_tests_$1.log" 2>&1
    echo "$1 gpu tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_$1.log" | tail
}
bwd_knob() {  # bwd_knob KNOB BENCH: the Gluon backward's GPU tests that turn KNOB on, then KNOB beside the default
               # on benchmarks/gluon_bwd.py's BENCH cells: per-cell ratios and their geomean
    local knob=$1 bench=$2 rows="$out/${day}_${gpu}_gluon_bwd_$1.jsonl" tests
    mapfile -t tests < <(python -m pytest -q --collect-only -m gpu tests/test_gluon_bwd.py -p no:cacheprovider \
        | grep -e "$knob=True" -e "::test_$knob")
    limit 200 python -m pytest -q -m gpu -n 16 -p no:cacheprovider "${tests[@]}" \
        > "$out/${day}_${gpu}_gpu_tests_gluon_bwd_$knob.log" 2>&1
    echo "$knob tests (${#tests[@]}) rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests_gluon_bwd_$knob.log"
    limit 320 python benchmarks/gluon_bwd.py --bench "$bench" --out "$rows" --variants "[\"default\", {\"$knob\": true}]" \
        > "$out/${day}_${gpu}_gluon_bwd_$knob.log" 2>&1
    echo "$knob bench rc $?"; cat "$out/${day}_${gpu}_gluon_bwd_$knob.log"
    python benchmarks/knob_ratio.py "$rows" "$knob"
}
reap  # a warm machine may still hold the last call's orphans
mkdir -p "$out"
day=$(date +%F)
gpu=$(python -c "from autoflash.gpu import current; print(current().family)")  # (its database, the file names)
case $step in
check)
    python -m pytest -q -m gpu -n 16 --ignore=tests/test_gpu_large.py > "$out/${day}_${gpu}_gpu_tests.log" 2>&1
    echo "gpu tests rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests.log"
    python benchmarks/gluon_fwd.py --check > "$out/${day}_${gpu}_gluon_check.log" 2>&1
    echo "gluon sweep rc $?"; grep -c "^ok" "$out/${day}_${gpu}_gluon_check.log"; grep FAIL "$out/${day}_${gpu}_gluon_check.log" | head
    ;;
gluon)
    python benchmarks/gluon_fwd.py --bench fa_grid_fp16 --out "$out/${day}_${gpu}_gluon_dynamic_g6.jsonl" \
        --variants '["default", {"default": true, "persistent": true, "dynamic": true}]' \
        > "$out/${day}_${gpu}_gluon_dynamic_g6.log" 2>&1
    echo "gluon bench rc $?"; cat "$out/${day}_${gpu}_gluon_dynamic_g6.log"
    ;;
fwd|bwd)  # warm-started from the shipped winners (the tuner tries them first); rows already merged are not copied twice
    db=/tmp/retune_$step.db
    rm -f "$db"
    files="fa_grid fa_grid_bf16"
    [ "$step" = fwd ] && files="$files odd_shapes gqa small_batch"
    # stopped with SIGINT before the device's 10-minute limit: the tuner saves what it finished, the merge runs
    limit -s INT "${RETUNE_S:-470}" bash benchmarks/retune.sh "$step" "$files" "$db" "${TRIALS:-2}" \
        > "$out/${day}_${gpu}_retune_$step.log" 2>&1
    python -m autoflash merge --into tuning_db/$gpu.db "$db" --current-only --standalone
    cp tuning_db/$gpu.db "$out/$gpu.db"
    tail -n 40 "$out/${day}_${gpu}_retune_$step.log"
    ;;
bench)
    for mode in fwd bwd; do
        python -m autoflash bench --shapes examples/fa_grid.yaml --mode "$mode" \
            --out "$out/${day}_${gpu}_bench_fa_grid_${mode}.jsonl" > "$out/${day}_${gpu}_bench_fa_grid_${mode}.log" 2>&1
        echo "bench $mode rc $?"; tail -n 30 "$out/${day}_${gpu}_bench_fa_grid_${mode}.log"
    done
    ;;
varlen)
    python -m pytest -q -m gpu -n 8 tests/test_gpu_varlen.py > "$out/${day}_${gpu}_gpu_tests_varlen.log" 2>&1
    echo "varlen gpu tests rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests_varlen.log"
    for draw in uniform log; do  # (issue 17's lengths, ~64k tokens; then the shorter log-uniform batch of 49.-117.)
        python benchmarks/varlen.py --draw $draw --out "$out/${day}_${gpu}_varlen.jsonl" \
            > "$out/${day}_${gpu}_varlen_$draw.log" 2>&1
        echo "varlen bench ($draw) rc $?"; cat "$out/${day}_${gpu}_varlen_$draw.log"
    done
    python benchmarks/kvcache_decode.py --out "$out/${day}_${gpu}_kvcache_decode.jsonl" \
        > "$out/${day}_${gpu}_kvcache_decode.log" 2>&1
    echo "kvcache bench rc $?"; cat "$out/${day}_${gpu}_kvcache_decode.log"
    ;;
gbwd)  # each part under its own limit: a hung kernel (an mbarrier phase wrong) costs only its part
    limit 200 python -m pytest -q -m gpu -n 16 tests/test_attention_variants.py tests/test_gpu_varlen.py \
        > "$out/${day}_${gpu}_gpu_tests_variants_varlen.log" 2>&1
    echo "variants/varlen gpu tests rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests_variants_varlen.log"
    limit 90 python benchmarks/gluon_bwd.py --check --every 4 > "$out/${day}_${gpu}_gluon_bwd_check.log" 2>&1
    echo "gluon bwd check rc $?"; grep -c "^ok" "$out/${day}_${gpu}_gluon_bwd_check.log"
    grep -v "^ok" "$out/${day}_${gpu}_gluon_bwd_check.log" | tail -n 15
    limit 150 python -m pytest -q -m gpu -n 16 tests/test_gluon_bwd.py > "$out/${day}_${gpu}_gpu_tests_gluon_bwd.log" 2>&1
    echo "gluon bwd gpu tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_gluon_bwd.log" | tail
    limit -s INT "${BENCH_S:-120}" python benchmarks/gluon_bwd.py --bench fa_grid \
        --variants '["default", {"block_n": 128, "warpgroups": 2}, {"num_buffers": 3}]' \
        --out "$out/${day}_${gpu}_gluon_bwd_bench.jsonl" > "$out/${day}_${gpu}_gluon_bwd_bench.log" 2>&1
    echo "gluon bwd bench rc $?"; cat "$out/${day}_${gpu}_gluon_bwd_bench.log" | tail -n 30
    ;;
gluon-variants)  # the Gluon backward's window/softcap/ALiBi, tests then speed (G-bwd15)
    limit 300 python -m pytest -q -m gpu -n 8 tests/test_gluon_bwd.py -k window_softcap_alibi \
        tests/test_attention_variants.py -p no:cacheprovider > "$out/${day}_${gpu}_gpu_tests_gluon_variants.log" 2>&1
    echo "gluon variant tests rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests_gluon_variants.log"
    limit 280 python benchmarks/variants.py --out "$out/${day}_${gpu}_variants_gluon_bwd.jsonl" \
        > "$out/${day}_${gpu}_variants_gluon_bwd.log" 2>&1
    echo "variants bench rc $?"; grep -v Warning "$out/${day}_${gpu}_variants_gluon_bwd.log"
    ;;
variants)
    python benchmarks/variants.py --out "$out/${day}_${gpu}_variants.jsonl" > "$out/${day}_${gpu}_variants.log" 2>&1
    echo "variants bench rc $?"; cat "$out/${day}_${gpu}_variants.log" | grep -v Warning
    ;;
sweeps)
    limit 200 python -m pytest -q -m gpu -n 8 tests/test_gpu_varlen.py tests/test_varlen.py \
        tests/test_varlen_tables.py tests/test_kvcache.py > "$out/${day}_gpu_tests_sweeps.log" 2>&1
    echo "varlen/kvcache gpu tests rc $?"; tail -3 "$out/${day}_gpu_tests_sweeps.log"
    python benchmarks/kvcache_decode.py --out "$out/${day}_kvcache_splits.jsonl" \
        --knobs '[{}, {"kv_splits": 1}, {"kv_splits": 2}, {"kv_splits": 4}, {"kv_splits": 16}]' 2>&1 | grep -v Warn
    python benchmarks/varlen.py --out "$out/${day}_varlen_knobs.jsonl" \
        --knobs '[{}, {"num_warps": 8}, {"block_n": 128, "num_warps": 8}, {"num_stages": 3}]' 2>&1 | grep -v Warn
    python benchmarks/compile_overhead.py --out "$out/${day}_compile_overhead.jsonl" 2>&1 | grep -v Warn
    ;;
variant-knobs)  # the tl forward's d128 default spills under triton 3.6 (NOTES 53): 8 warps beside it
    python benchmarks/variants.py --cases 'causal window 4096,causal softcap,causal alibi,full softcap,documents' \
        --knobs '[{}, {"num_warps": 8}, {"num_warps": 8, "num_stages": 3}, {"block_n": 128, "num_warps": 8}]' \
        --out "$out/${day}_${gpu}_variants_knobs.jsonl" 2>&1 | grep -v Warn
    ;;
varlen-tma)  # packed sequences through device descriptors per sequence (NOTES 55): tests, then beside pointers
    limit 200 python -m pytest -q -m gpu -n 6 tests/test_gpu_varlen.py > "$out/${day}_${gpu}_gpu_tests_varlen_tma.log" 2>&1
    echo "varlen gpu tests rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests_varlen_tma.log"
    python benchmarks/varlen.py --out "$out/${day}_${gpu}_varlen_tma.jsonl" --knobs '[{}, {"num_warps": 8},
        {"loads": "tma", "num_warps": 8}, {"loads": "tma", "num_warps": 8, "num_stages": 3},
        {"loads": "tma", "block_n": 128, "num_warps": 8}]' 2>&1 | grep -v Warn
    ;;
holdout)  # issue 18: dispatch's fallback on examples/holdout.yaml (no database holds them), from a fresh wheel install
          # with no user database. Build the wheel here first: pip wheel --no-deps -w dist . ; carry dist and .device
    site=/tmp/holdout_site run=/tmp/holdout_run
    rm -rf "$site" "$run" && mkdir -p "$run/home" && cp examples/holdout.yaml "$run/"
    python -m pip install -q --no-deps --no-index --target "$site" dist/autoflash-*.whl || exit 1
    family=$(python -c "from autoflash.gpu import current; print(current().family)")
    (cd "$run" && unset AUTOFLASH_DB && export HOME="$run/home" PYTHONPATH="$site:/tmp/site" &&
        python -c "import autoflash; print('autoflash from', autoflash.__file__)" &&
        limit 560 python -m autoflash bench --shapes holdout.yaml --mode both --rounds 3 \
        --out "$out/${day}_${family}_holdout_wheel.jsonl") > "$out/${day}_${family}_holdout_wheel.log" 2>&1
    echo "holdout rc $?"; grep -v Warn "$out/${day}_${family}_holdout_wheel.log" | tail -n 60
    ;;
on-miss)  # issue 18: tune on first use, three problems nobody tuned (first call's time, speed before and after)
    limit -s INT 560 python benchmarks/on_miss.py --budget-s "${BUDGET_S:-45}" --out "$out/${day}_${gpu}_on_miss.jsonl" \
        --db-dir "$out/${day}_${gpu}_on_miss_dbs" 2>&1 | grep -v Warn
    ;;
bwd-knobs)  # the tl backward's d128 records spill under triton 3.6 (NOTES 54): the points that do not, beside them
    limit -s INT "${BENCH_S:-300}" python benchmarks/gluon_bwd.py --bench fa_grid --variants '[
        {"family": "tl", "block_m": 32, "block_n": 128, "num_warps": 8, "num_stages": 3, "causal_split": false},
        {"family": "tl", "block_m": 32, "block_n": 128, "num_warps": 8, "num_stages": 4, "causal_split": false},
        {"family": "tl", "block_m": 16, "block_n": 128, "num_warps": 8, "num_stages": 4, "causal_split": false}]' \
        --out "$out/${day}_${gpu}_tl_bwd_knobs.jsonl" > "$out/${day}_${gpu}_tl_bwd_knobs.log" 2>&1
    echo "tl bwd knobs rc $?"; tail -n 50 "$out/${day}_${gpu}_tl_bwd_knobs.log"
    ;;
dq-writer)  # dQ's tiles added by a warp of their own, beside the default (NOTES G-bwd16)
    limit 500 python benchmarks/gluon_bwd.py --bench fa_grid_fp16 --out "$out/${day}_${gpu}_gluon_bwd_dq_writer.jsonl" \
        --variants '["default", {"dq_writer": true}]' > "$out/${day}_${gpu}_gluon_bwd_dq_writer.log" 2>&1
    echo "dq writer bench rc $?"; cat "$out/${day}_${gpu}_gluon_bwd_dq_writer.log"
    ;;
bwd-causal-short)  # dq_turns (NOTES G-bwd20): its GPU tests, then beside the default on the fp16 grid's d64 cells
    bwd_knob dq_turns d64
    ;;
bwd-d128)  # dv_late (NOTES G-bwd21): its GPU tests, then beside the default on the fp16 grid's d128 cells
    bwd_knob dv_late d128
    ;;
split-keys)  # NOTES 116: split_keys' GPU tests, then beside the default past head dim 128 (padded d224/d256 and
            # Gemma-2's GQA d256; d160-d256 at 4k and 16k)
    limit 240 python -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_gluon_bwd.py -k split_keys \
        > "$out/${day}_${gpu}_gpu_tests_gluon_bwd_split_keys.log" 2>&1
    echo "split_keys tests rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests_gluon_bwd_split_keys.log"
    rows="$out/${day}_${gpu}_gluon_bwd_split_keys.jsonl"
    for bench in padded wide; do
        limit 160 python benchmarks/gluon_bwd.py --bench $bench --out "$rows" --variants \
            '["default", {"split_keys": true, "num_buffers": 1, "block_m": 64, "head_dim_split": false}]' \
            >> "$out/${day}_${gpu}_gluon_bwd_split_keys.log" 2>&1
        echo "split_keys $bench bench rc $?"
    done
    python benchmarks/knob_ratio.py "$rows" split_keys
    ;;
split-keys-tiles)  # NOTES 118: split_keys over two column tiles, its GPU tests, then beside the default and split_keys
                  # over the padded tile at d160/d192 (the wide bench), the gate lifted for the bench alone
    limit 240 python -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_gluon_bwd.py \
        -k "test_split_keys_over_column_tiles or test_split_keys_with_variants" \
        > "$out/${day}_${gpu}_gpu_tests_split_keys_tiles.log" 2>&1
    echo "split_keys tiles tests rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests_split_keys_tiles.log"
    rows="$out/${day}_${gpu}_gluon_bwd_split_keys_tiles.jsonl"
    AUTOFLASH_UNTESTED=1 limit 240 python benchmarks/gluon_bwd.py --bench wide --out "$rows" --variants \
        '["default", {"split_keys": true, "head_dim_split": true, "num_buffers": 2, "block_m": 64},
          {"split_keys": true, "head_dim_split": true, "num_buffers": 1, "block_m": 64},
          {"split_keys": true, "num_buffers": 1, "block_m": 64, "head_dim_split": false}]' \
        > "$out/${day}_${gpu}_gluon_bwd_split_keys_tiles.log" 2>&1
    echo "split_keys tiles bench rc $?"
    python benchmarks/knob_ratio.py "$rows" split_keys
    ;;
consumer-keys)  # NOTES 120: each forward consumer to its own rows' diagonal; its GPU tests, then the short causal
               # cells beside the default and 64-key blocks without it
    limit 240 python -m pytest -q -m gpu -n 16 -p no:cacheprovider tests/test_gluon_fwd.py -k consumer_keys \
        > "$out/${day}_${gpu}_gpu_tests_consumer_keys.log" 2>&1
    echo "consumer_keys tests rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests_consumer_keys.log"
    rows="$out/${day}_${gpu}_gluon_fwd_consumer_keys.jsonl"
    limit 240 python benchmarks/gluon_fwd.py --bench short --out "$rows" --variants '["default",
        {"default": true, "causal": true, "consumer_keys": true},
        {"default": true, "causal": true, "block_n": 64, "num_buffers": 3},
        {"default": true, "causal": true, "block_n": 64, "num_buffers": 3, "consumer_keys": true}]' \
        > "$out/${day}_${gpu}_gluon_fwd_consumer_keys.log" 2>&1
    echo "consumer_keys bench rc $?"; grep -v -i warn "$out/${day}_${gpu}_gluon_fwd_consumer_keys.log" | tail -14
    ;;
gqa)  # before the retune (bwd-all): correctness, then whether group_splits pays and by how much
    limit 240 python -m pytest -q -m gpu -n 16 tests/test_gluon_bwd.py -p no:cacheprovider \
        > "$out/${day}_${gpu}_gpu_tests_gluon_bwd_gqa.log" 2>&1
    echo "gluon bwd tests rc $?"; tail -3 "$out/${day}_${gpu}_gpu_tests_gluon_bwd_gqa.log"
    limit 240 python benchmarks/gluon_bwd.py --bench gqa_causal --out "$out/${day}_${gpu}_gluon_bwd_group_splits.jsonl" \
        --variants '["default", {"group_splits": 2}, {"group_splits": 4}, {"group_splits": 8}]' \
        > "$out/${day}_${gpu}_gluon_bwd_group_splits.log" 2>&1
    echo "group_splits bench rc $?"; cat "$out/${day}_${gpu}_gluon_bwd_group_splits.log"
    limit 60 python benchmarks/overhead.py --out "$out/${day}_${gpu}_overhead_bwd_gqa.jsonl"
    ;;
bwd-all)  # every shipped backward file retuned on the current templates (a gluon backward template or launcher
          # change makes its records stale: NOTES G-bwd7, G-bwd8), merged, then the three benches of issue 15
    db=/tmp/retune_bwd_all.db
    rm -f "$db" "${db%.db}.stderr"
    limit -s INT "${RETUNE_S:-380}" bash benchmarks/retune.sh bwd "fa_grid fa_grid_bf16 gqa odd_shapes bwd_spread" \
        "$db" "${TRIALS:-2}" > "$out/${day}_${gpu}_retune_bwd_all.log" 2>&1
    python -m autoflash merge --into tuning_db/$gpu.db "$db" --current-only --standalone
    cp tuning_db/$gpu.db "$out/$gpu.db"
    grep -v "it/s\]" "${db%.db}.stderr" | tail -n 200 > "$out/${day}_${gpu}_retune_bwd_all.stderr"
    grep " rc " "$out/${day}_${gpu}_retune_bwd_all.log"
    for f in fa_grid bwd_spread odd_shapes; do
        limit 60 python -m autoflash bench --shapes "examples/$f.yaml" --mode bwd \
            --out "$out/${day}_${gpu}_bench_${f}_bwd.jsonl" > "$out/${day}_${gpu}_bench_${f}_bwd.log" 2>&1
        echo "bench $f rc $?"
    done
    ;;
deep-bwd|deep-fwd)  # NOTES 60: the records hold 2-4 trials a family (the default and the last winner); search
                    # on from them (the studies resume), stopped before the call's limit, then the grid's bench
    # SHAPES=examples/fa_grid_bf16.yaml for the bf16 grid; BENCH=0 to search only (a call's time is short)
    mode=${step#deep-} shapes=${SHAPES:-examples/fa_grid.yaml} db=/tmp/deep_$mode.db
    name=$(basename "$shapes" .yaml)_$mode
    [ -f "$db" ] || cp tuning_db/$gpu.db "$db"
    limit -s INT "${RETUNE_S:-400}" python -m autoflash tune --gpu "$gpu" --mode "$mode" --shapes "$shapes" \
        --trials "${TRIALS:-10}" --db "$db" > "$out/${day}_${gpu}_deep_$name.log" 2>&1
    echo "deep $name tune rc $?"; tail -n 30 "$out/${day}_${gpu}_deep_$name.log"
    python -m autoflash merge --into tuning_db/$gpu.db "$db" --current-only --standalone
    cp tuning_db/$gpu.db "$out/$gpu.db"
    [ "${BENCH:-1}" = 0 ] && exit 0
    limit 120 python -m autoflash bench --shapes "$shapes" --mode "$mode" \
        --out "$out/${day}_${gpu}_bench_${name}_deep.jsonl" > "$out/${day}_${gpu}_bench_${name}_deep.log" 2>&1
    echo "bench rc $?"; tail -n 28 "$out/${day}_${gpu}_bench_${name}_deep.log"
    ;;
gluon-varlen)  # branch gfwd-varlen: the Gluon forward's VARLEN gate (NOTES V3), correctness first
    limit 240 python -m pytest -q -m gpu -n 8 tests/test_gpu_varlen.py -k "not gluon_varlen_backward" -p no:cacheprovider \
        > "$out/${day}_${gpu}_gpu_tests_gluon_varlen.log" 2>&1
    echo "varlen gpu tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_gluon_varlen.log" | tail
    limit 240 python benchmarks/varlen.py --out "$out/${day}_${gpu}_varlen_gluon.jsonl" \
        --knobs '[{}, {"family": "gluon", "default": true}, {"family": "gluon", "default": true, "q_buffers": 1}]' \
        2>&1 | grep -v Warn
    ;;
gluon-varlen-bwd)  # branch gbwd-varlen: the Gluon backward's VARLEN gate (NOTES V4), correctness first; then
    # fwd+bwd with the backward dispatched (untuned on Hopper: the Gluon default), forced to Gluon's default, to tl's
    limit 300 python -m pytest -q -m gpu -n 8 tests/test_gpu_varlen.py -p no:cacheprovider \
        -k "gluon_varlen_backward or varlen_forward_backward" > "$out/${day}_${gpu}_gpu_tests_gluon_varlen_bwd.log" 2>&1
    echo "varlen bwd gpu tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_gluon_varlen_bwd.log" | tail
    limit 240 python benchmarks/varlen.py --out "$out/${day}_${gpu}_varlen_gluon_bwd.jsonl" \
        --knobs '[{}, {"family": "gluon", "default": true, "direction": "bwd"}, {"family": "tl", "default": true, "direction": "bwd"}]' \
        2>&1 | grep -v Warn
    ;;
varlen-retune)  # after gluon-varlen: the packed problems' forward searched with the Gluon family, merged
    cp tuning_db/$gpu.db /tmp/varlen.db
    limit 240 python -m autoflash tune --gpu "$gpu" --mode "${MODE:-fwd}" --shapes examples/varlen.yaml --trials "${TRIALS:-4}" \
        --db /tmp/varlen.db > "$out/${day}_${gpu}_varlen_retune.log" 2>&1
    echo "varlen retune rc $?"; tail -n 4 "$out/${day}_${gpu}_varlen_retune.log"
    python -m autoflash merge --into tuning_db/$gpu.db /tmp/varlen.db --current-only --standalone
    cp tuning_db/$gpu.db "$out/$gpu.db"
    limit 120 python benchmarks/varlen.py --out "$out/${day}_${gpu}_varlen_retuned.jsonl" 2>&1 | grep -v Warn
    ;;
gluon-maskmod)  # branch gluon-maskmod: the Gluon forward's MASK_MOD gate (NOTES G8), correctness first
    limit 400 python -m pytest -q -m gpu -n 8 tests/test_gluon_fwd.py -k mask_mod -p no:cacheprovider \
        > "$out/${day}_${gpu}_gpu_tests_gluon_maskmod.log" 2>&1
    echo "maskmod gpu tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_gluon_maskmod.log" | tail
    limit 180 python benchmarks/variants.py --cases 'documents,causal documents,prefix-lm' \
        --knobs '[{}, {"family": "tl", "default": true}]' --out "$out/${day}_${gpu}_variants_gluon_maskmod.jsonl" \
        2>&1 | grep -v Warn
    ;;
gluon-maskmod-bwd)  # branch gbwd-maskmod: the Gluon backward's MASK_MOD gate (NOTES G-bwd19), correctness first;
    # then the backward as dispatched (untuned: the Gluon default) beside tl's default and FlexAttention
    limit 420 python -m pytest -q -m gpu -n 8 tests/test_gluon_bwd.py tests/test_gluon_fwd.py::test_mask_mod_gradients \
        tests/test_mask_mod.py -k mask_mod \
        -p no:cacheprovider > "$out/${day}_${gpu}_gpu_tests_gluon_maskmod_bwd.log" 2>&1
    echo "maskmod bwd gpu tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_gluon_maskmod_bwd.log" | tail
    limit 170 python benchmarks/variants.py --cases 'documents,causal documents,prefix-lm' \
        --knobs '[{}, {"family": "tl", "default": true, "direction": "bwd"}]' \
        --out "$out/${day}_${gpu}_variants_gluon_maskmod_bwd.jsonl" 2>&1 | grep -v Warn
    ;;
tile-overlap)  # branch gfwd-tile-overlap (NOTES G9): correctness first, then the FA grid beside the defaults
    # (-k: tile_overlap's tests and the two-Q-tile control at its shapes, test_two_q_tiles_several_tiles_a_program)
    limit 220 python -m pytest -q -m gpu -n 8 tests/test_gluon_fwd.py -k "tile_overlap or several_tiles" -p no:cacheprovider \
        > "$out/${day}_${gpu}_gpu_tests_tile_overlap.log" 2>&1
    echo "tile-overlap gpu tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_tile_overlap.log" | tail
    rows="$out/${day}_${gpu}_gluon_tile_overlap.jsonl"
    # (GRID=fa_grid_fp16 halves it, should the whole grid not fit the call's 10 minutes; rows are written per problem)
    limit -s INT 340 python benchmarks/gluon_fwd.py --bench "${GRID:-fa_grid}" --out "$rows" --variants '["default",
        {"default": true, "q_buffers": 2, "dynamic": false}, {"default": true, "tile_overlap": true},
        {"default": true, "q_buffers": 2, "dynamic": false, "tile_overlap": true}]' \
        > "$out/${day}_${gpu}_gluon_tile_overlap.log" 2>&1
    echo "tile-overlap bench rc $?"; cat "$out/${day}_${gpu}_gluon_tile_overlap.log"
    python benchmarks/knob_ratio.py "$rows" tile_overlap
    ;;
head-dim-split)  # NOTES G16, with the branch head-dim-split checked out (its databases re-keyed): the Gluon forward's
                # GPU tests (the launcher changed for every variant), then head_dim_split beside the default at the
                # head dims it splits (twice)
    limit 260 python -m pytest -q -m gpu -n 12 -p no:cacheprovider tests/test_gluon_fwd.py tests/test_gpu_varlen.py \
        -k "head_dim_split or defaults or test_variants or mask_mods_on_every_knob or gluon_varlen_forward" \
        > "$out/${day}_gpu_tests_gluon_fwd_split.log" 2>&1
    echo "gluon fwd gpu tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_gpu_tests_gluon_fwd_split.log" | tail
    rows="$out/${day}_gluon_head_dim_split.jsonl"
    limit -s INT 280 python benchmarks/gluon_fwd.py --bench head_dims --repeat 2 --out "$rows" --variants '["default",
        {"default": true, "tile_overlap": false}, {"default": true, "head_dim_split": true, "tile_overlap": false},
        {"default": true, "head_dim_split": true, "block_n": 128, "head_dims": [160]}]' \
        > "$out/${day}_gluon_head_dim_split.log" 2>&1
    echo "bench rc $?"; cat "$out/${day}_gluon_head_dim_split.log"
    python benchmarks/knob_ratio.py "$rows" head_dim_split
    ;;
host-floor)  # NOTES 76.(a): the host time of a call and of the autograd backward (dispatch's default choices), with
            # Python's garbage collector on and off, then cProfile's top entries of the autograd backward
    rows="$out/${day}_${gpu}_overhead_host_floor.jsonl"
    limit 120 python benchmarks/overhead.py --out "$rows" 2>&1 | tail -1
    limit 120 python benchmarks/overhead.py --no-gc --out "$rows" 2>&1 | tail -1
    limit 120 python benchmarks/overhead.py --profile backward_autograd > "$out/${day}_${gpu}_overhead_bwd_profile.txt" 2>&1
    head -40 "$out/${day}_${gpu}_overhead_bwd_profile.txt"
    ;;
fwd-host)  # NOTES G18 (branch fwd-host, its patch under results/fwd_host): the Gluon forward's host time per call on
          # this tree, then on a copy with the patch (records re-keyed) its GPU tests and host time again
    gluon='{"family": "gluon", "default": true}'
    limit 120 python benchmarks/overhead.py --knobs "$gluon" --out "$out/${day}_overhead_gluon_fwd.jsonl" 2>&1 | tail -1
    patched_copy fwd_host benchmarks/results/fwd_host/fwd-host.patch
    knob_tests fwd_host "defaults or head_dim_split or test_variants or gluon_varlen_forward"
    limit 120 python benchmarks/overhead.py --knobs "$gluon" --out "$out/${day}_overhead_gluon_fwd.jsonl" 2>&1 | tail -1
    ;;
mqa-split)  # NOTES G-bwd22 (branch mqa-split, its patch under results/mqa_split): the two held-out problems its
           # default splits (holdout.yaml's MQA 71:1 and GQA 7:1) on this tree, then on a copy with the patch (records
           # re-keyed) its GPU tests and the same two problems
    printf 'problems:\n  - {batch: 4, heads_q: 71, heads_kv: 1, seqlen_q: 2048, head_dim: 64, causal: true, dtype: bfloat16}\n  - {batch: 4, heads_q: 28, heads_kv: 4, seqlen_q: 2048, head_dim: 128, causal: true, dtype: bfloat16}\n' > /tmp/mqa.yaml
    limit 120 python -m autoflash bench --shapes /tmp/mqa.yaml --mode bwd --out "$out/${day}_mqa_split_bwd.jsonl" 2>&1 |
        grep -v -i warn | tail -n 6
    patched_copy mqa_split benchmarks/results/mqa_split/mqa-split.patch
    limit 240 python -m pytest -q -m gpu -n 12 -p no:cacheprovider tests/test_gluon_bwd.py tests/test_gpu_varlen.py \
        -k "uneven or test_defaults" > "$out/${day}_gpu_tests_mqa_split.log" 2>&1
    echo "mqa-split gpu tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_gpu_tests_mqa_split.log" | tail
    limit 120 python -m autoflash bench --shapes /tmp/mqa.yaml --mode bwd --out "$out/${day}_mqa_split_bwd.jsonl" 2>&1 |
        grep -v -i warn | tail -n 6
    ;;
bwd-split)  # NOTES G-bwd23 (branch bwd-split, its patch under results/bwd_split): on a copy of this tree with the
           # patch (records re-keyed) the split's GPU tests and the defaults (the split at 144-192), then d160/d192
           # (bf16, 16 heads, 16k tokens at 1k and 4k) padded to 256 columns in 32-row steps (main's default) beside
           # the new default (two column tiles, 64-row steps) and plain SDPA
    patched_copy bwd_split benchmarks/results/bwd_split/bwd-split.patch
    limit 220 python -m pytest -q -m gpu -n 12 -p no:cacheprovider tests/test_gluon_bwd.py tests/test_gpu_varlen.py \
        -k "head_dim_split or test_defaults" > "$out/${day}_${gpu}_gpu_tests_bwd_split.log" 2>&1
    echo "bwd-split gpu tests rc $?"
    grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_bwd_split.log" | tail
    limit 130 python benchmarks/gluon_bwd.py --bench split --out "$out/${day}_${gpu}_gluon_bwd_head_dim_split.jsonl" \
        --variants '["default", {"head_dim_split": false, "block_m": 32}]' \
        > "$out/${day}_${gpu}_gluon_bwd_head_dim_split.log" 2>&1
    echo "bwd-split bench rc $?"; cat "$out/${day}_${gpu}_gluon_bwd_head_dim_split.log"
    ;;
shared-scores)  # NOTES G-bwd24 (branch bwd-shared-scores, its patch under results/shared_scores): on a copy of this
               # tree with the patch (records re-keyed) its GPU tests (and the every-knob sweep's shared_scores
               # points), then 200-256 (bf16, 16 heads, 16k tokens at 1k and 4k; GQA 2:1) in 32-row steps with S^T
               # and dP^T computed by each warpgroup (main's) beside shared_scores, and plain SDPA
    patched_copy shared_scores benchmarks/results/shared_scores/bwd-shared-scores.patch
    limit 240 python -m pytest -q -m gpu -n 12 -p no:cacheprovider tests/test_gluon_bwd.py -k "shared_scores" \
        > "$out/${day}_${gpu}_gpu_tests_shared_scores.log" 2>&1
    echo "shared-scores gpu tests rc $?"
    grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_shared_scores.log" | tail
    limit 150 python benchmarks/gluon_bwd.py --bench padded --out "$out/${day}_${gpu}_gluon_bwd_shared_scores.jsonl" \
        --variants '[{"block_m": 32}, {"block_m": 32, "shared_scores": true}]' \
        > "$out/${day}_${gpu}_gluon_bwd_shared_scores.log" 2>&1
    echo "shared-scores bench rc $?"; cat "$out/${day}_${gpu}_gluon_bwd_shared_scores.log"
    ;;
split-retune)  # after G-bwd23 (NOTES 79, 85): the database's backward problems at head dims 144-192 (where the
              # default splits) with no head_dim_split trial (re-keyed records, padded), searched one trial further:
              # the warm start times the new default (the split) first; merged, then what the database says of them
    trials=$(python - "$gpu" <<'PY'  # (their problems file in /tmp/split.yaml; prints the trials to ask for)
import sqlite3, sys, yaml
rows = sqlite3.connect(f"tuning_db/{sys.argv[1]}.db").execute("""
    SELECT p.batch, p.heads_q, p.heads_kv, p.seqlen_q, p.seqlen_k, p.head_dim, p.causal, p.dtype, COUNT(*)
    FROM autoflash_trials t JOIN autoflash_problems p ON p.id = t.problem_id
    JOIN autoflash_variants v ON v.id = t.variant_id JOIN autoflash_gpus g ON g.id = t.gpu_id
    WHERE v.direction = 'bwd' AND v.knobs LIKE '%"family": "gluon"%' AND p.head_dim BETWEEN 144 AND 192
      AND p.variants = '{}' AND g.family = ?
    GROUP BY p.id HAVING SUM(v.knobs LIKE '%"head_dim_split": true%') = 0""", (sys.argv[1],)).fetchall()
problems = [dict(batch=b, heads_q=hq, heads_kv=hkv, seqlen_q=sq, seqlen_k=sk, head_dim=d, causal=bool(c), dtype=t)
            for b, hq, hkv, sq, sk, d, c, t, _ in rows]
yaml.safe_dump({"problems": problems}, open("/tmp/split.yaml", "w"))
print(max((n for *_, n in rows), default=0) + 1)  # one trial past the longest study: the split's
PY
)
    [ "$(python -c "import yaml; print(len(yaml.safe_load(open('/tmp/split.yaml'))['problems']))")" = 0 ] \
        && { echo "split retune: every d144-192 backward record has the split's trial"; exit 0; }
    cp tuning_db/$gpu.db /tmp/split.db
    limit 420 python -m autoflash tune --gpu "$gpu" --mode bwd --families gluon --shapes /tmp/split.yaml \
        --trials "${TRIALS:-$trials}" --db /tmp/split.db > "$out/${day}_${gpu}_split_retune.log" 2>&1
    echo "split retune rc $?"; tail -n 4 "$out/${day}_${gpu}_split_retune.log"
    python -m autoflash merge --into tuning_db/$gpu.db /tmp/split.db --current-only --standalone
    cp tuning_db/$gpu.db "$out/$gpu.db"
    python benchmarks/campaign_summary.py tuning_db/$gpu.db "$gpu" /tmp/split.yaml:bwd \
        --out "$out/${day}_${gpu}_split_retune_summary.jsonl" 2>&1 | grep -v -i warn
    ;;
skip-idle)  # NOTES G15 (branch skip-idle, its patch under results/skip_idle): on a copy of this tree with the patch and
           # its database re-keyed, the knob's GPU tests, then the packed batch as dispatched and with skip_idle, twice
           # (skip-idle-after-g16.patch: the same on a tree with G16's head_dim_split)
    patch=benchmarks/results/skip_idle/skip-idle.patch
    patch -p1 -s -f --dry-run < "$patch" > /dev/null 2>&1 ||
        patch=benchmarks/results/skip_idle/skip-idle-after-g16.patch
    patched_copy skip_idle "$patch"
    knob_tests skip_idle "idle"
    for run in 1 2; do
        limit 200 python benchmarks/varlen.py --knobs '[{}, {"family": "gluon", "skip_idle": true}]' \
            --out "$out/${day}_${gpu}_varlen_skip_idle.jsonl" 2>&1 | grep -v -i warn
    done
    ;;
one-loop)  # NOTES G10 (branch one-loop, its patch under results/one_loop): on a copy of this tree with the patch and
          # its database re-keyed, the knob's GPU tests, then beside the Gluon default on the fp16 grid's short cells
          # (twice: the causal 512-2k cells are what it is for), rows per problem
    patched_copy one_loop benchmarks/results/one_loop/one-loop.patch
    knob_tests one_loop "one_loop or one loop"
    rows="$out/${day}_${gpu}_gluon_one_loop.jsonl"
    limit -s INT 300 python benchmarks/gluon_fwd.py --bench short --repeat 2 --out "$rows" \
        --variants '["default", {"default": true, "one_loop": true}]' > "$out/${day}_${gpu}_gluon_one_loop.log" 2>&1
    echo "one-loop bench rc $?"; cat "$out/${day}_${gpu}_gluon_one_loop.log"
    python benchmarks/knob_ratio.py "$rows" one_loop
    ;;
tile-overlap-hyp3)  # NOTES G9: main's cross-tile step (refused under causal) beside hyp3's (results/g9_hyp/hyp3.patch,
    # which passes every case), fp16 grid, one machine: full cells both ways, causal cells hyp3 beside the default
    root=$(pwd); . benchmarks/patched_tree.sh
    limit -s INT 250 python benchmarks/gluon_fwd.py --bench fa_grid_fp16 --out "$out/${day}_${gpu}_g9_main.jsonl" \
        --variants '["default", {"default": true, "tile_overlap": true, "causal": false}]' > "$out/${day}_${gpu}_g9_main.log" 2>&1
    echo "main rc $?"
    if copy_tree /tmp/g9_hyp3 "$root/benchmarks/results/g9_hyp/hyp3.patch"; then
        (cd /tmp/g9_hyp3 && PYTHONPATH=/tmp/g9_hyp3:$PYTHONPATH limit -s INT 250 python benchmarks/gluon_fwd.py \
            --bench fa_grid_fp16 --out "$out/${day}_${gpu}_g9_hyp3.jsonl" \
            --variants '[{"default": true, "tile_overlap": true}]' > "$out/${day}_${gpu}_g9_hyp3.log" 2>&1)
        echo "hyp3 rc $?"
    else
        echo "hyp3: PATCH FAILED"
    fi
    python - "$out/${day}_${gpu}_g9_main.jsonl" "$out/${day}_${gpu}_g9_hyp3.jsonl" <<'PY'
import json, math, sys
cells = {}
for tree, path in zip(("main", "hyp3"), sys.argv[1:]):
    for row in map(json.loads, open(path)):
        name = "default" if row["backend"] == 'gluon "default"' else "overlap" if "tile_overlap" in row["backend"] else None
        if name:
            cells.setdefault(row["problem"], {})[f"{tree} {name}" if name == "overlap" else name] = row["tflops"]
ratios = {"full": [], "causal": []}
for problem, t in cells.items():
    kind = "causal" if "causal" in problem else "full"
    if "hyp3 overlap" in t and (kind == "causal" or "main overlap" in t):
        against = t["default"] if kind == "causal" else t["main overlap"]
        ratios[kind].append(t["hyp3 overlap"] / against)
        print(f"{problem:28s} " + "  ".join(f"{k} {v:.0f}" for k, v in sorted(t.items()))
              + f"  hyp3 / {'default' if kind == 'causal' else 'main overlap'} {ratios[kind][-1]:.3f}")
for kind, r in ratios.items():
    if r:
        print(f"{kind}: geomean {math.exp(sum(map(math.log, r)) / len(r)):.3f} over {len(r)}")
PY
    ;;
paged-retune)  # NOTES 67: the KV-cache decode problems (dense, pages of 16 and 256) searched again with the compile
    # workers' fix (no trial lost to their GPU memory), merged, then the decode bench over 1k-32k lengths and at 32k.
    # PATCH=benchmarks/results/paged_rows/paged-rows.patch (NOTES K7; K2 under paged_chunk/): the same on a copy
    # of this tree with it applied
    dir=$(pwd) tag=${PATCH:+_$(basename "${PATCH%.patch}")}
    if [ -n "${PATCH:-}" ]; then
        root=$dir; . benchmarks/patched_tree.sh
        copy_tree /tmp/paged_tree "$dir/$PATCH" || { echo "PATCH FAILED: $PATCH"; exit 1; }
        dir=/tmp/paged_tree
    fi
    printf 'problems:\n  - {batch: 32, heads_q: 64, heads_kv: 8, seqlen_q: 1, seqlen_k: 32768, head_dim: 128, dtype: bfloat16,\n     kvcache: {page_size: [0, 16, 256]}}\n' > /tmp/paged.yaml
    cd "$dir" && export PYTHONPATH="$dir:$PYTHONPATH"
    cp tuning_db/$gpu.db /tmp/paged.db
    limit 300 python -m autoflash tune --gpu "$gpu" --mode fwd --shapes /tmp/paged.yaml --trials "${TRIALS:-40}" \
        --db /tmp/paged.db > "$out/${day}_${gpu}_paged_retune$tag.log" 2>&1
    echo "paged retune$tag rc $?"; grep -E "varlen|problem" "$out/${day}_${gpu}_paged_retune$tag.log" | tail -n 4 | cut -c1-200
    python -m autoflash merge --into tuning_db/$gpu.db /tmp/paged.db --current-only --standalone
    cp tuning_db/$gpu.db "$out/$gpu$tag.db"
    # (graph replays: a plain ~0.5 ms decode call measures the host as much as the GPU, NOTES 69)
    limit 80 python benchmarks/kvcache_decode.py --graph --profile --out "$out/${day}_${gpu}_kvcache_decode$tag.jsonl" \
        2>&1 | grep -v -i warn
    limit 80 python benchmarks/kvcache_decode.py --graph --profile --lengths 32768 \
        --out "$out/${day}_${gpu}_kvcache_decode_32k$tag.jsonl" 2>&1 | grep -v -i warn
    ;;
decode-gap)  # NOTES 69: a 1k-32k decode call in graphs takes ~50-65 us more than its kernels' profile of plain calls;
            # the kernels profiled in graph replays too, clocks and power sampled beside, and 32k each for contrast
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 100 \
        > "$out/${day}_${gpu}_decode_gap_clocks.csv" &
    smi=$!
    for lengths in 1024,32768 32768; do
        for mode in --graph ""; do
            limit 100 python benchmarks/kvcache_decode.py --lengths $lengths $mode --profile \
                --out "$out/${day}_${gpu}_decode_gap.jsonl" 2>&1 | grep -v -i warn | sed "s/^/$lengths ${mode:-plain} /"
        done
    done
    kill $smi
    ;;
capture)  # NOTES 87: CUDA graph capture of the autograd backward; ~2 minutes on an H100
    limit 120 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_graph.py \
        > "$out/${day}_${gpu}_gpu_tests_graph.log" 2>&1
    echo "graph tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_graph.log" | tail
    head -5 benchmarks/results/host_floor/holdout_short.yaml > /tmp/capture_first.yaml  # (its first problem)
    limit 90 python -m autoflash bench --shapes /tmp/capture_first.yaml --mode bwd --graph --rounds 1 \
        --out "$out/${day}_${gpu}_capture_bench_graph.jsonl" 2>&1 | grep -v -i warn | tail -n 4
    limit 90 python benchmarks/results/host_floor/capture_bisect.py 2>&1 | grep -v -i warn \
        | tee "$out/${day}_${gpu}_capture_bisect.log"
    ;;
small-passes)  # NOTES 100-102: the host time per call of the rows that lose, the forward that bench timed at twice
              # graphs_ab's time (both tools on it, with what dispatch chose), the held-out problems' graphs off/on
              # (101.'s 150 GFLOP bound, 102.'s 71:1 default), then the held-out run from a wheel (built in dist/ first)
    limit 120 python benchmarks/host_per_call.py --out "$out/${day}_${gpu}_host_per_call.jsonl" --only \
        "b32 h12 s512 d64 fp16" "b16 h12 s1024 d64 causal fp16" "b64 h12 s197 d64 fp16" "b8 h16 s512/1024 d64 bf16" \
        "b64 h16 s256 d72 bf16" 2>&1 | grep -v Warn
    printf 'problems:\n  - {batch: 64, heads_q: 16, seqlen_q: 256, head_dim: 72, causal: false, dtype: bfloat16}\n' \
        > /tmp/one_d72.yaml
    python -c "import torch, autoflash; q = torch.randn(64, 16, 256, 72, device='cuda', dtype=torch.bfloat16)
print(autoflash.explain(q, q, q))"
    limit 120 python -m autoflash bench --shapes /tmp/one_d72.yaml --mode fwd --out "$out/${day}_${gpu}_d72_bench.jsonl" 2>&1 | grep -v Warn
    limit 120 python benchmarks/graphs_ab.py --shapes /tmp/one_d72.yaml --out "$out/${day}_${gpu}_d72_graphs_ab.jsonl" 2>&1 | grep -v Warn
    limit -s INT 270 python benchmarks/graphs_ab.py --out "$out/${day}_${gpu}_graphs_ab.jsonl" 2>&1 | grep -v Warn
    bash "$0" holdout "$out"
    ;;
cross-splits)  # NOTES 107, 108: the cross-attention backward's query_splits off and on (GPU time alone), a replayed
               # call's host steps, then the held-out run from a wheel (built in dist/ first)
    limit 150 python benchmarks/graphs_ab.py --switch query_splits --gpu-time --shapes examples/cross_context.yaml \
        --rounds 2 --out "$out/${day}_${gpu}_query_splits_ab_gpu_time.jsonl" 2>&1 | grep -v Warn
    limit 90 python benchmarks/host_breakdown.py --only "b2 h8 s4096/77 d40 fp16" "b32 h32/8 s128 d128 causal bf16" \
        --out "$out/${day}_${gpu}_host_breakdown.jsonl" 2>&1 | grep -v Warn
    bash "$0" holdout "$out"
    ;;
group-floor)  # NOTES 109: a borrowed causal GQA backward's group split floored at the default's, off and on in
              # one process over one prompt's prefills, then the held-out run from a wheel (built in dist/ first)
    limit 240 python benchmarks/graphs_ab.py --switch group_splits --shapes examples/gqa_prompt.yaml --rounds 3 \
        --out "$out/${day}_${gpu}_group_splits_ab.jsonl" 2>&1 | grep -v Warn
    bash "$0" holdout "$out"
    ;;
bwd-graphs)  # NOTES 94, 96 (branch bwd-graphs): small passes replayed from CUDA graphs: the GPU tests, overhead.py's
             # backward, the held-out problems with the graphs off and on interleaved in one process
             # (graphs_ab.py), then the held-out run from this branch's wheel (built in dist/ first)
    limit 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_gpu_graph.py > "$out/${day}_${gpu}_gpu_tests_bwd_graphs.log" 2>&1
    echo "graph tests rc $?"; grep -E "^FAILED|passed|failed" "$out/${day}_${gpu}_gpu_tests_bwd_graphs.log" | tail
    limit 150 python benchmarks/overhead.py --out "$out/${day}_${gpu}_overhead_bwd_graphs.jsonl" 2>&1 | grep -i backward
    limit -s INT 300 python benchmarks/graphs_ab.py --out "$out/${day}_${gpu}_graphs_ab.jsonl" 2>&1 | grep -v Warn
    bash "$0" holdout "$out"
    ;;
short-ncu)  # NOTES 66: stall sampling by instruction of the Gluon default at d64 causal 512 and 16k, and of cuDNN's
    # kernel at 512, for the contrast (one CSV each, compressed)
    for case in "gluon 512 64" "gluon 16384 64" "sdpa 512 64"; do
        name=$(echo "$case" | tr ' ' _)
        limit 120 /usr/local/cuda/bin/ncu --kernel-name regex:'attn_fwd|fprop' --launch-skip 3 --launch-count 1 \
            --section SourceCounters --section WarpStateStats --section InstructionStats --page source \
            --print-source sass --csv python benchmarks/short_causal_ncu.py $case > "$out/ncu_sass_$name.csv" 2>&1
        echo "$case rc $?"; gzip -f "$out/ncu_sass_$name.csv"
    done
    ;;
short128-ncu)  # NOTES 106, 109: the 128-token causal GQA forward (b32 h32/8 s128 d128 bf16: 0.58-0.70x plain SDPA, its
              # kernel): speed of light, memory, stalls and occupancy of the Gluon default, dispatch's choice and
              # SDPA's kernel; then one kernel's stalls by SASS line: SASS=gluon (the default), record or sdpa
    for which in gluon record sdpa; do
        limit 120 /usr/local/cuda/bin/ncu --kernel-name regex:'attn_fwd|fprop|flash' --launch-skip 3 --launch-count 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
            --section LaunchStats --section Occupancy --csv python benchmarks/short_causal_ncu.py $which 128 128 32 32 8 \
            bfloat16 > "$out/ncu_s128_$which.csv" 2>&1
        echo "$which rc $?"; grep -E '"(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Dynamic Shared Memory Per Block)"' "$out/ncu_s128_$which.csv" | cut -c1-200
        gzip -f "$out/ncu_s128_$which.csv"
    done
    sass=${SASS:-gluon}
    limit 150 /usr/local/cuda/bin/ncu --kernel-name regex:'attn_fwd|fprop|flash' --launch-skip 3 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
        python benchmarks/short_causal_ncu.py "$sass" 128 128 32 32 8 bfloat16 > "$out/ncu_s128_sass_$sass.csv" 2>&1
    echo "sass rc $?"; gzip -f "$out/ncu_s128_sass_$sass.csv"
    ;;
ring)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
    python -m pytest -q -m gpu tests/test_ring_attention.py -k two_gpus 2>&1 | tail -n 2
    torchrun --nproc-per-node 2 benchmarks/ring_attention.py --reps 10 --out "$out/${day}_ring_attention.jsonl" \
        > "$out/${day}_ring_attention.log" 2>&1
    echo "ring rc $?"; grep '"speed"' "$out/${day}_ring_attention.jsonl"
    ;;
ring-dynamic)  # R2: the ring's forward steps with tiles claimed from a counter, beside the records' static grid
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    torchrun --nproc-per-node 2 benchmarks/ring_attention.py --reps 10 --totals 32768 65536 \
        --knobs '[{}, {"family": "gluon", "persistent": true, "dynamic": true}]' \
        --out "$out/${day}_ring_attention_dynamic.jsonl" > "$out/${day}_ring_attention_dynamic.log" 2>&1
    echo "ring-dynamic rc $?"; grep '"speed"' "$out/${day}_ring_attention_dynamic.jsonl"
    ;;
*)
    echo "steps: check gluon fwd bwd bench varlen gbwd variants sweeps variant-knobs bwd-knobs varlen-tma on-miss bwd-all gluon-variants dq-writer bwd-causal-short bwd-d128 gqa deep-bwd deep-fwd varlen-retune ring ring-dynamic" >&2; exit 2
    ;;
esac

#!/usr/bin/env bash
# The GPU steps that land a template change (fingerprints change: every record of the changed families must be
# re-measured before main ships them). One step per device call (each fits the 10-minute limit on an H100):
#   . .device/setup.sh && bash benchmarks/gpu_next.sh check   $OUT   # GPU tests of the kernels, the Gluon sweep
#   . .device/setup.sh && bash benchmarks/gpu_next.sh fwd     $OUT   # retune fwd (tl + gluon), merged
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bwd     $OUT   # retune bwd, merged (TRIALS=12 ...: more a problem)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bench   $OUT   # the FA grid, fwd and bwd, from the new db
#   . .device/setup.sh && bash benchmarks/gpu_next.sh varlen  $OUT   # packed sequences and KV caches: tests, speed
#   . .device/setup.sh && bash benchmarks/gpu_next.sh variants $OUT  # window/softcap/ALiBi beside FlexAttention
#   . .device/setup.sh && bash benchmarks/gpu_next.sh mods    $OUT   # the mask_mod cases tuned on first use, merged
#   . .device/setup.sh && bash benchmarks/gpu_next.sh on-miss $OUT    # tune on first use, three untuned problems (18)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh holdout $OUT    # the fallback on 24 held-out problems, from a
#                                                                       fresh wheel (18; carry dist, built here first;
#                                                                       ROUNDS=3 rounds a problem)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh bwd-all $OUT    # every backward file retuned, merged, benched
#                                                                       (after a Gluon backward template change: NOTES G-bwd8, G-bwd17)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh deep-bwd $OUT   # the FA grid's backward searched on to 10 trials
#   . .device/setup.sh && bash benchmarks/gpu_next.sh deep-fwd $OUT   # a family (a rerun resumes), merged, benched; forward too
#                                                                       (NOTES 60)
#   . .device/setup.sh && bash benchmarks/gpu_next.sh varlen-retune $OUT  # the packed problems retuned, merged
#   . .device/setup.sh && bash benchmarks/gpu_next.sh paged-retune $OUT  # KV-cache decode searched again (NOTES 67),
#                                                                       merged, benched
#   . .device/setup.sh && bash benchmarks/gpu_next.sh short128-ncu $OUT  # the 128-token GQA forward's kernels beside
#                                                                       SDPA's under ncu (NOTES 109, issue 18)
# Issue 18's coverage campaign, resumable call by call (copy the returned tuning_db/<family>.db back between calls),
# on any kind (every visible GPU tunes; nvidia-h100-x4 or nvidia-h200-x4 for speed):
#   . .device/setup.sh && bash benchmarks/campaign.sh $OUT 540 4
# A step of this file on GPU 0 while the campaign tunes on the others, in one call (a branch's step: PATCH=file):
#   . .device/setup.sh && PATCH=branch.patch bash benchmarks/beside_campaign.sh $OUT holdout 470
# Several of these steps (or any commands) at once, each on its own GPUs and cores, one archive back (NOTES 111):
#   . .device/setup.sh && bash benchmarks/gpu_parallel.sh $OUT 570 'bash benchmarks/gpu_next.sh variants $out' ...
# On the 2-GPU kind (nvidia-h200-x2):
#   . .device/setup.sh && bash benchmarks/gpu_next.sh ring    $OUT   # ring attention beside one GPU (NOTES 46, R1)
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
variants)  # issue 16's table: every case at 32k tokens (GQA 32/8, d128, bf16), its document mask as the issue sets it
          # (8 documents in 16k tokens), its softcap at head dim 256 too (GQA 16/8: examples/variants.yaml's problem)
    rows="$out/${day}_${gpu}_variants.jsonl"
    limit 280 python benchmarks/variants.py --out "$rows" 2>&1 | grep -v Warning
    limit 120 python benchmarks/variants.py --seqlen 16384 --cases "documents,causal documents" --out "$rows" 2>&1 \
        | grep -v Warning
    limit 120 python benchmarks/variants.py --seqlen 16384 --heads 16/8 --head-dim 256 --cases "causal softcap,full softcap" \
        --out "$rows" 2>&1 | grep -v Warning
    ;;
mods)  # NOTES 159: issue 16's mask_mod cases (16k tokens) tuned on first use, each case's first call untimed, then
      # timed from the records; merged (their mods' own records: dispatch runs them for these mods' fingerprints)
    rm -f /tmp/mods.db
    AUTOFLASH_DB=/tmp/mods.db limit 520 python benchmarks/variants.py --seqlen 16384 \
        --cases "documents,causal documents,prefix-lm" --tune-budget "${BUDGET_S:-60}" \
        --out "$out/${day}_${gpu}_variants_mods_tuned.jsonl" 2>&1 | grep -v Warning
    python -m autoflash merge --into tuning_db/$gpu.db /tmp/mods.db --current-only --standalone
    cp tuning_db/$gpu.db "$out/$gpu.db"
    ;;
holdout)  # issue 18: dispatch's fallback on examples/holdout.yaml (no database holds them), from a fresh wheel install
          # with no user database. Build the wheel here first: pip wheel --no-deps -w dist . ; carry dist and .device
    site=/tmp/holdout_site run=/tmp/holdout_run
    rm -rf "$site" "$run" && mkdir -p "$run/home" && cp examples/holdout.yaml "$run/"
    python -m pip install -q --no-deps --no-index --target "$site" dist/autoflash-*.whl || exit 1
    family=$(python -c "from autoflash.gpu import current; print(current().family)")
    (cd "$run" && unset AUTOFLASH_DB && export HOME="$run/home" PYTHONPATH="$site:/tmp/site" &&
        python -c "import autoflash; print('autoflash from', autoflash.__file__)" &&
        limit 560 python -m autoflash bench --shapes holdout.yaml --mode both --rounds "${ROUNDS:-3}" \
        --out "$out/${day}_${family}_holdout_wheel.jsonl") > "$out/${day}_${family}_holdout_wheel.log" 2>&1
    echo "holdout rc $?"; grep -v Warn "$out/${day}_${family}_holdout_wheel.log" | tail -n 60
    ;;
on-miss)  # issue 18: tune on first use, three problems nobody tuned (first call's time, speed before and after)
    limit -s INT 560 python benchmarks/on_miss.py --budget-s "${BUDGET_S:-45}" --out "$out/${day}_${gpu}_on_miss.jsonl" \
        --db-dir "$out/${day}_${gpu}_on_miss_dbs" 2>&1 | grep -v Warn
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
varlen-retune)  # the packed problems (examples/varlen.yaml) searched again (MODE=bwd: their backward), merged
    cp tuning_db/$gpu.db /tmp/varlen.db
    limit 240 python -m autoflash tune --gpu "$gpu" --mode "${MODE:-fwd}" --shapes examples/varlen.yaml --trials "${TRIALS:-4}" \
        --db /tmp/varlen.db > "$out/${day}_${gpu}_varlen_retune.log" 2>&1
    echo "varlen retune rc $?"; tail -n 4 "$out/${day}_${gpu}_varlen_retune.log"
    python -m autoflash merge --into tuning_db/$gpu.db /tmp/varlen.db --current-only --standalone
    cp tuning_db/$gpu.db "$out/$gpu.db"
    limit 120 python benchmarks/varlen.py --out "$out/${day}_${gpu}_varlen_retuned.jsonl" 2>&1 | grep -v Warn
    ;;
paged-retune)  # NOTES 67: the KV-cache decode problems (dense, pages of 16 and 256) searched again, merged, then the
    # decode bench over 1k-32k lengths and at 32k
    printf 'problems:\n  - {batch: 32, heads_q: 64, heads_kv: 8, seqlen_q: 1, seqlen_k: 32768, head_dim: 128, dtype: bfloat16,\n     kvcache: {page_size: [0, 16, 256]}}\n' > /tmp/paged.yaml
    cp tuning_db/$gpu.db /tmp/paged.db
    limit 300 python -m autoflash tune --gpu "$gpu" --mode fwd --shapes /tmp/paged.yaml --trials "${TRIALS:-40}" \
        --db /tmp/paged.db > "$out/${day}_${gpu}_paged_retune.log" 2>&1
    echo "paged retune rc $?"; grep -E "varlen|problem" "$out/${day}_${gpu}_paged_retune.log" | tail -n 4 | cut -c1-200
    python -m autoflash merge --into tuning_db/$gpu.db /tmp/paged.db --current-only --standalone
    cp tuning_db/$gpu.db "$out/$gpu.db"
    # (graph replays: a plain ~0.5 ms decode call measures the host as much as the GPU, NOTES 69)
    limit 80 python benchmarks/kvcache_decode.py --graph --profile --out "$out/${day}_${gpu}_kvcache_decode.jsonl" \
        2>&1 | grep -v -i warn
    limit 80 python benchmarks/kvcache_decode.py --graph --profile --lengths 32768 \
        --out "$out/${day}_${gpu}_kvcache_decode_32k.jsonl" 2>&1 | grep -v -i warn
    ;;
short128-ncu)  # NOTES 106, 109: the 128-token causal GQA forward (b32 h32/8 s128 d128 bf16: 0.58-0.70x plain SDPA, its
              # kernel): speed of light, memory, stalls and occupancy of the Gluon default, dispatch's choice and
              # SDPA's kernel; then one kernel's stalls by SASS line: SASS=gluon (the default), record or sdpa.
              # CELL: another causal cell, short_causal_ncu.py's arguments after `which` (NOTES 154: the FA grid's
              # d128 causal 512, CELL="512 128")
    read -r -a cell <<< "${CELL:-128 128 32 32 8 bfloat16}"
    for which in gluon record sdpa; do
        limit 120 /usr/local/cuda/bin/ncu --kernel-name regex:'attn_fwd|fprop|flash' --launch-skip 3 --launch-count 1 \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
            --section LaunchStats --section Occupancy --csv python benchmarks/short_causal_ncu.py $which "${cell[@]}" \
            > "$out/ncu_s128_$which.csv" 2>&1
        echo "$which rc $?"; grep -E '"(Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per Thread|Dynamic Shared Memory Per Block)"' "$out/ncu_s128_$which.csv" | cut -c1-200
        gzip -f "$out/ncu_s128_$which.csv"
    done
    sass=${SASS:-gluon}
    limit 150 /usr/local/cuda/bin/ncu --kernel-name regex:'attn_fwd|fprop|flash' --launch-skip 3 --launch-count 1 \
        --section SourceCounters --section WarpStateStats --page source --print-source sass --csv \
        python benchmarks/short_causal_ncu.py "$sass" "${cell[@]}" > "$out/ncu_s128_sass_$sass.csv" 2>&1
    echo "sass rc $?"; gzip -f "$out/ncu_s128_sass_$sass.csv"
    ;;
ring)
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
    python -m pytest -q -m gpu tests/test_ring_attention.py -k two_gpus 2>&1 | tail -n 2
    torchrun --nproc-per-node 2 benchmarks/ring_attention.py --reps 10 --out "$out/${day}_ring_attention.jsonl" \
        > "$out/${day}_ring_attention.log" 2>&1
    echo "ring rc $?"; grep '"speed"' "$out/${day}_ring_attention.jsonl"
    ;;
*)
    echo "steps: check fwd bwd bench varlen variants mods holdout on-miss bwd-all" \
         "deep-bwd deep-fwd varlen-retune paged-retune short128-ncu ring" >&2; exit 2
    ;;
esac

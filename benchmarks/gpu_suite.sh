#!/usr/bin/env bash
# The GPU tests (-m gpu; tests/test_gpu_large.py aside) over as many device calls as they take: the whole suite
# runs ~12 minutes on an H100, past one call's 10. Each call runs the tests that no earlier call on this tree
# reported (passed, failed, skipped or errored) and appends each outcome as a line "OUTCOME test-id" to
# $OUT/gpu_suite_done.txt; copy that file to the repository root (untracked, so it travels with the tree)
# before the next call, and remove it when the tree changes.
# On a host of several GPUs (nvidia-h100-x4, 64 cores: expected to run the suite in one call) the xdist workers
# spread over them, one GPU each (tests/conftest.py: AUTOFLASH_TEST_GPUS), 14 a GPU unless WORKERS says, a core
# each at most (a worker sees one GPU: test_two_gpus_nccl skips, as on one GPU; `gpu_next.sh ring` runs it).
#   . .device/setup.sh && bash benchmarks/gpu_suite.sh $OUT [SECONDS]     # SECONDS: pytest's limit (540)
set -u
out=$1 seconds=${2:-540} done_file=gpu_suite_done.txt
gpus=$(nvidia-smi -L | grep -c "^GPU")
export AUTOFLASH_TEST_GPUS=$gpus
workers=${WORKERS:-$(( gpus * 14 < $(nproc) - 2 ? gpus * 14 : $(nproc) - 2 ))}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
touch "$done_file"
python -m pytest -q --collect-only -m gpu -p no:cacheprovider --ignore=tests/test_gpu_large.py tests 2>/dev/null \
    | grep "::" > "$tmp/all"
cut -d' ' -f2- "$done_file" > "$tmp/done"
grep -vxFf "$tmp/done" "$tmp/all" > "$tmp/todo"
echo "GPU tests: $(wc -l < "$tmp/all"), reported by earlier calls: $(wc -l < "$tmp/done"), to run: $(wc -l < "$tmp/todo")"
cp "$done_file" "$out/gpu_suite_done.txt"
[ -s "$tmp/todo" ] || exit 0
# (pytest reads the ids from the file: `@file`, pytest 8.2 and later; ids hold spaces)
echo "$gpus GPU(s), $workers workers"
timeout -k 10 "$seconds" python -m pytest -v -m gpu -n "$workers" -p no:cacheprovider "@$tmp/todo" \
    > "$out/gpu_suite.log" 2>&1
rc=$?
if [ $rc -ge 124 ]; then  # timed out: xdist's workers may still hold the GPU
    nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} --query-compute-apps=pid --format=csv,noheader |
        xargs -r kill -9  # this run's GPUs only
fi
sed -n 's/^\[gw[0-9]*\] \[ *[0-9]*%\] \(PASSED\|FAILED\|SKIPPED\|ERROR\|XFAIL\|XPASS\) \(.*[^ ]\) *$/\1 \2/p' \
    "$out/gpu_suite.log" >> "$out/gpu_suite_done.txt"
echo "pytest rc $rc; this call: $(grep -c "" "$out/gpu_suite.log") log lines"
cut -d' ' -f1 "$out/gpu_suite_done.txt" | sort | uniq -c
grep -E "^(FAILED|ERROR) " "$out/gpu_suite_done.txt" | head -20
grep -E "^(FAILED|ERROR) " "$out/gpu_suite.log" | head -20
tail -n 3 "$out/gpu_suite.log"

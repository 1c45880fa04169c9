#!/usr/bin/env bash
# Independent jobs at once on a host of several GPUs, each on its own GPUs and their share of the cores: a session's
# device time counts the machine's wall time, not its GPUs (NOTES 111: four jobs of one call on nvidia-h200-x4).
#   . .device/setup.sh && bash benchmarks/gpu_parallel.sh $OUT SECONDS JOB [JOB ...]
# JOB is a command line, run by bash with $out set to its own folder; a job that starts with @GPUS runs on those
# (`@1,2,3 bash benchmarks/gpu_suite.sh $out 520`), the others each on the next GPU that no @GPUS names. A job sees
# only its GPUs (CUDA_VISIBLE_DEVICES) and cores (taskset: GPU g of N owns cores g*C/N up to (g+1)*C/N), and is
# stopped after SECONDS, its GPUs' processes with it. Each job's output goes to $out/job.log; everything comes back
# as $OUT/parallel.tgz (the device tool returns at most 8 files), and the tail of each job's log is printed.
#   bash benchmarks/gpu_parallel.sh $OUT 540 '@1,2,3 WORKERS=42 bash benchmarks/gpu_suite.sh $out 520' \
#       'bash benchmarks/gpu_next.sh holdout $out'
set -u
OUT=$1 seconds=$2
shift 2
gpus=$(nvidia-smi -L | grep -c "^GPU") cores=$(nproc) root=/tmp/gpu_parallel
[ $# -ge 1 ] || { echo "gpu_parallel.sh: no job given"; exit 2; }
[ "$gpus" -ge 1 ] || { echo "gpu_parallel.sh: nvidia-smi lists no GPU"; exit 2; }
rm -rf "$root" && mkdir -p "$root" "$OUT"
nvidia-smi -L | head -n 1
claimed=,
for job in "$@"; do [[ $job == @* ]] && claimed+="${job%% *},"; done
free=()
for ((g = 0; g < gpus; g++)); do [[ ${claimed//@/} == *,$g,* ]] || free+=("$g"); done
k=0 f=0
for job in "$@"; do
    if [[ $job != @* ]]; then
        [ "$f" -lt "${#free[@]}" ] || { echo "job $k: no GPU left that no @GPUS names"; exit 2; }
        devices=${free[$f]} f=$((f + 1))
    else
        devices=${job%% *}
        devices=${devices#@}
        job=${job#* }
    fi
    cpus=""
    for g in ${devices//,/ }; do
        [ "$g" -lt "$gpus" ] || { echo "job $k asks GPU $g; this host has $gpus"; exit 2; }
        cpus+="${cpus:+,}$(( g * cores / gpus ))-$(( (g + 1) * cores / gpus - 1 ))"
    done
    [ "$cores" -ge "$gpus" ] || cpus=0-$((cores - 1))  # (fewer cores than GPUs: no pinning)
    out=$root/job$k && mkdir -p "$out"
    echo "job $k: GPUs $devices, cores $cpus: $job" | tee "$out/job.log"
    (export CUDA_VISIBLE_DEVICES=$devices out
     SECONDS=0
     timeout -k 10 "$seconds" taskset -c "$cpus" bash -c "$job" >> "$out/job.log" 2>&1
     rc=$?
     [ $rc -ge 124 ] && nvidia-smi -i "$devices" --query-compute-apps=pid --format=csv,noheader | xargs -r kill -9
     echo "job $k rc $rc after $SECONDS s" | tee -a "$out/job.log") &
    k=$((k + 1))
done
wait
for log in "$root"/job*/job.log; do echo "== ${log%/job.log}"; grep -v -i warn "$log" | tail -n 25; done
tar czf "$OUT/parallel.tgz" -C /tmp gpu_parallel

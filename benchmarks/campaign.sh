#!/usr/bin/env bash
# Issue 18's coverage campaign (examples/campaign/: prefill, cross-attention, GQA prefill, fp16, short sequences,
# more GQA ratios and one prompt's prefill both ways, decode forward) on this machine's GPU family, for a bounded
# wall time, so that it runs across device calls and sessions:
#   . .device/setup.sh && bash benchmarks/campaign.sh $OUT [seconds, default 540] [trials, default 4]
# Each call resumes where the last one stopped (the tuner never times a variant twice): it tunes into a copy of
# tuning_db/<family>.db, is interrupted (SIGINT: finished trials are kept) when the seconds are spent, merges the
# current records into tuning_db/<family>.db and leaves that file in $OUT, to be copied over the checkout's
# before the next call. Every visible GPU tunes (--devices' default). Prints what is tuned of each file and how fast
# (benchmarks/campaign_summary.py). BWD_FAMILIES=gluon searches the backward in that family alone (C1: on the H200
# the Gluon backward won 204 of 205 problems; the forward keeps every family, `tl` won 26 of 208 there). The other
# GPUs' shipped databases are read for first guesses (--warm-from: their winners of the same problem).
# ENTRIES="prefill:bwd cross:bwd" tunes those files and directions alone, in that order (or a path:
# ENTRIES="/tmp/retime/fwd.yaml:fwd", benchmarks/short_problems.py's). FRESH=1 tunes into an empty
# database, merged into tuning_db/<family>.db after, with that database's winners as first guesses: the default and
# they timed anew (the tuner never times a variant twice in one database; NOTES 112: short calls' earlier trials
# hold host time).
set -uo pipefail
out=$1 seconds=${2:-540} trials=${3:-4}
mkdir -p "$out"
family=$(python -c "from autoflash.gpu import current; print(current().family)")
db=tuning_db/$family.db work=/tmp/campaign_${family}_$$.db  # (one per run: two jobs of gpu_parallel.sh may tune)
rm -f "$work" && { [ -f "$db" ] && [ -z "${FRESH:-}" ] && cp "$db" "$work" || true; }
warm=()
for other in tuning_db/*.db; do [ "$other" != "$db" ] || [ -n "${FRESH:-}" ] && warm+=(--warm-from "$other"); done
end=$(( $(date +%s) + seconds ))
for entry in ${ENTRIES:-prefill:fwd prefill:bwd cross:fwd cross:bwd decode:fwd gqa:fwd gqa:bwd fp16:fwd fp16:bwd \
                short:fwd short:bwd ratios:bwd ratios:fwd small:bwd small:fwd}; do
    file=${entry%:*} mode=${entry##*:}
    [[ $file == */* ]] || file=examples/campaign/$file.yaml  # (a part's name, or a problems file's path)
    families=()
    [ "$mode" = bwd ] && [ -n "${BWD_FAMILIES:-}" ] && families=(--families "$BWD_FAMILIES")
    left=$(( end - $(date +%s) ))
    [ $left -le 10 ] && { echo "$file ($mode): not reached (time spent)"; continue; }
    timeout -s INT -k 60 $left python -m autoflash tune --gpu "$family" --mode "$mode" --shapes "$file" \
        --trials "$trials" --db "$work" "${families[@]}" "${warm[@]}" \
        >> "$out/campaign_$family.log" 2>> "$out/campaign_$family.stderr"
    echo "$file ($mode${families[*]:+, ${families[*]}}): rc $?"
done
python -m autoflash merge --into "$db" "$work" --current-only --standalone
cp "$db" "$out/"
python benchmarks/campaign_summary.py "$db" "$family" examples/campaign/prefill.yaml examples/campaign/cross.yaml \
    examples/campaign/decode.yaml:fwd examples/campaign/gqa.yaml examples/campaign/fp16.yaml \
    examples/campaign/short.yaml examples/campaign/ratios.yaml examples/campaign/small.yaml \
    --out "$out/campaign_summary_$family.jsonl"

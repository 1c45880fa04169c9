#!/usr/bin/env bash
# One call, two jobs, on a kind of several GPUs: a gpu_next.sh step on GPU 0 while campaign.sh tunes on the other
# GPUs, each on its GPUs' share of the cores (benchmarks/gpu_parallel.sh), so that a measurement does not cost a
# call of its own (NOTES 96):
#   . .device/setup.sh && bash benchmarks/beside_campaign.sh $OUT STEP [campaign seconds, default 470]
# PATCH=file: the step runs in a copy of this tree with the patch applied (a branch's `git diff main BRANCH`, kept
# untracked in the tree so that it travels), its wheel built there. ENTRIES and BWD_FAMILIES go to campaign.sh
# (default ENTRIES: the parts of issue 18's campaign). What both write comes back as $OUT/parallel.tgz and the
# merged tuning_db/<family>.db (the device tool returns at most 8 files). The campaign's tuners see GPUs 1.. alone
# (`--devices` counts among the visible GPUs, NOTES 97); the step's reaping of timed-out processes stays on GPU 0.
set -u
OUTDIR=$1 step=$2 seconds=${3:-470}
gpus=$(nvidia-smi -L | grep -c "^GPU")
[ "$gpus" -ge 2 ] || { echo "beside_campaign.sh wants two GPUs or more, this machine has $gpus"; exit 2; }
family=$(python -c "from autoflash.gpu import current; print(current().family)")
root=$(pwd) tree=$(pwd)
if [ -n "${PATCH:-}" ]; then
    tree=/tmp/beside_tree && rm -rf "$tree" && mkdir "$tree"
    git ls-files -z | xargs -0 cp --parents -t "$tree" && cp -r .device "$tree/"
    (cd "$tree" && patch -s -p1 < "$root/$PATCH") || { echo "PATCH FAILED: $PATCH"; exit 1; }
fi
mkdir -p "$OUTDIR"
bash benchmarks/gpu_parallel.sh "$OUTDIR" $((seconds + 90)) \
    "cd $tree && python -m pip wheel -q --no-deps --no-build-isolation -w dist . > /dev/null 2>&1;
     PYTHONPATH=/tmp/site:$tree bash benchmarks/gpu_next.sh $step \$out" \
    "@$(seq -s, 1 $((gpus - 1))) bash benchmarks/campaign.sh \$out $seconds 3; cp tuning_db/$family.db $OUTDIR/"

# Sourced by the device scripts that run a branch without git (benchmarks/g9_hyp.sh, benchmarks/varlen_fix.sh):
# `git format-patch` files under benchmarks/results/ applied to a copy of this tree. Needs $root (the tree).

copy_tree() {  # copy_tree DIR PATCH: this tree (without .git and the results) in DIR, PATCH applied if given
    local dir=$1 patch=$2
    rm -rf "$dir" && mkdir -p "$dir"
    tar -C "$root" --exclude=./.git --exclude=./benchmarks/results -cf - . | tar -C "$dir" -xf - || return 1
    [ -z "$patch" ] && return 0
    # (no --dry-run first: it checks each commit of a series against the unpatched files; a copy that fails is dropped)
    (cd "$dir" && patch -p1 -s -f --no-backup-if-mismatch < "$patch" > /dev/null) || { rm -rf "$dir"; return 1; }
}

result_line() {  # result_line LOG: pytest's last summary line, its first failure and that failure's message
    local log=$1 last first err
    last=$(grep -E " in [0-9.]+s" "$log" | tail -1 | sed 's/=//g; s/^ *//')
    first=$(grep -m1 -E "^FAILED|^ERROR" "$log" | cut -c1-160)
    err=$(grep -m1 -E "^E +" "$log" | sed 's/^E *//' | cut -c1-160)
    echo "${last:-no summary} | ${first:-no failure}${err:+ | $err}"
}

"""NOTES G9: does any PTX instruction read or write a wgmma's accumulator (D) or register A operand between the
wgmma's issue and the wait_group that completes its commit group? Text order, branches ignored.

    python ptx_inflight.py KERNEL.ptx ...   (PTX from tests/gluon_sm90.py's compile: compiled.asm["ptx"])
"""
import re
import sys


def in_flight_uses(path: str) -> list[tuple[int, int, str]]:
    current, groups, hits = [], [], []  # wgmmas not yet committed; committed groups, oldest first
    for n, raw in enumerate(open(path).read().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("//") or line.endswith(":"):
            continue
        if line.startswith("wgmma.mma_async"):  # {D regs}[, {A regs}], descriptors...: a chain may reuse its D
            braces = re.findall(r"\{([^}]*)\}", line)
            current.append((set(re.findall(r"%r\d+", " ".join(braces[:2]))), n))
            continue
        if line.startswith("wgmma.commit_group"):
            groups, current = groups + [current], []
            continue
        wait = re.match(r"wgmma\.wait_group\.sync\.aligned (\d+)", line)
        if wait:
            keep = int(wait.group(1))
            groups = groups[len(groups) - keep:] if keep else []
            continue
        if line.startswith("wgmma") or re.match(r"(@!?%p\d+\s+)?bra", line):
            continue
        used = set(re.findall(r"%r\d+", line))
        hits += [(issued, n, line[:80]) for group in [*groups, current] for regs, issued in group if used & regs]
    return hits


if __name__ == "__main__":
    for path in sys.argv[1:]:
        hits = in_flight_uses(path)
        print(f"{path}: {len(hits)} uses of in-flight wgmma registers")
        for issued, used, line in hits[:8]:
            print(f"  wgmma at line {issued}, used at line {used}: {line}")

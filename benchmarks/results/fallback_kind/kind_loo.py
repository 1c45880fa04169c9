"""Session 29 (no GPU): which of the fallback's hard "kind" fields (Problem._kind: dtype, GQA ratio, head dim) could
be distance terms instead. Two evaluations on recorded trials (benchmarks/leave_one_out.py's):
  loo   leave one problem out, as leave_one_out.py;
  lko   leave the problem's whole kind out under the current rule (every problem sharing dtype, head dim, causal,
        GQA ratio, ...): what an untuned problem of an untuned kind gets, the current rule's heuristic default
        against the soft rule's nearest neighbour of another kind.
Run from the checkout's root, on the tree it ran on (commit 8c3875f: its Problem._kind takes no direction, and the GQA
ratio is its fourth field):  python benchmarks/results/fallback_kind/kind_loo.py [db] [gpu]
Its output: 2026-11-27_kind_loo_{h100,h200}.log beside it (NOTES 92).
"""
import math
import sys
from unittest import mock

sys.path.insert(0, "benchmarks")
from leave_one_out import timed, summary  # noqa: E402
from autoflash import families  # noqa: E402
from autoflash.dispatch import Record, choose  # noqa: E402
from autoflash.gpu import KNOWN  # noqa: E402
from autoflash.problem import Problem  # noqa: E402

KIND, DISTANCE = Problem._kind, Problem.distance


def soft(fields: dict):
    """Problem._kind without `fields` (name -> weight per log2 step, or per mismatch for dtype) and a distance that
    adds them."""
    def kind(self):
        k = list(KIND(self))
        for name in fields:
            k[{"dtype": 0, "head_dim": 1, "ratio": 3}[name]] = None
        return tuple(k)

    def distance(self, other):
        if kind(self) != kind(other):
            return None
        d = sum(abs(math.log2(x) - math.log2(y)) for x, y in (
            (self.seqlen_q, other.seqlen_q), (self.seqlen_k, other.seqlen_k),
            (self.batch * self.heads_q, other.batch * other.heads_q)))
        for name, w in fields.items():
            if name == "dtype":
                d += w * (self.dtype != other.dtype)
            elif name == "ratio":
                d += w * abs(math.log2(self.heads_q // self.heads_kv) - math.log2(other.heads_q // other.heads_kv))
            else:
                d += w * abs(math.log2(self.head_dim) - math.log2(other.head_dim))
        return d
    return kind, distance


def evaluate(times, best, gpu, direction, hide):
    fractions = {}
    for problem in times:
        others = sorted((Record(p, families.knobs_from_json(direction, k), ms, 0.0)
                         for p, (k, ms) in best.items() if not hide(problem, p)), key=lambda r: r.median_ms)
        chosen = choose(problem, gpu, [("x", others)], direction)
        knobs = families.of(chosen.knobs).fit(chosen.knobs, problem, gpu) or chosen.knobs
        ms = times[problem].get(knobs.to_json())
        fractions[problem] = None if ms is None else best[problem][1] / ms
    return fractions


def compared(rule: dict, base: dict) -> str:
    """The rule against the current one on the problems where both choices were timed: p10 / min of each, and
    on how many the rule is more than 2% faster or slower."""
    both = [p for p in rule if rule[p] is not None and base[p] is not None]
    better = sum(rule[p] > base[p] * 1.02 for p in both)
    worse = [rule[p] / base[p] for p in both if rule[p] < base[p] / 1.02]
    return (f"both timed on {len(both)}: rule {summary([rule[p] for p in both])[len('timed on '):]}; current "
            f"{summary([base[p] for p in both]).split(': ', 1)[1]}; better on {better}, worse on {len(worse)}"
            + (f" (worst {min(worse):.3f})" if worse else ""))


def main():
    db = sys.argv[1] if len(sys.argv) > 1 else "tuning_db/h100.db"
    gpu_name = sys.argv[2] if len(sys.argv) > 2 else "h100"
    gpu = KNOWN[gpu_name]
    rules = {"current": {}, "ratio w1": {"ratio": 1.0}, "ratio w2": {"ratio": 2.0}, "dtype w1": {"dtype": 1.0},
             "ratio w1 + dtype w1": {"ratio": 1.0, "dtype": 1.0}, "head_dim w4": {"head_dim": 4.0}}
    for direction in ("fwd", "bwd"):
        times = timed(db, gpu_name, direction)
        best = {p: min(t.items(), key=lambda i: i[1]) for p, t in times.items()}
        base = {}
        for name, fields in rules.items():
            kind, distance = soft(fields)
            with mock.patch.object(Problem, "_kind", kind), mock.patch.object(Problem, "distance", distance):
                loo = evaluate(times, best, gpu, direction, lambda p, o: o == p)
                # the kind as the current rule draws it: hide every problem of the held-out one's current kind
                lko = evaluate(times, best, gpu, direction, lambda p, o: KIND(o) == KIND(p))
            base = base or {"loo": loo, "lko": lko}
            print(f"{gpu_name} {direction} {name:22s} loo {summary(loo.values())}")
            print(f"{gpu_name} {direction} {'':22s}     {compared(loo, base['loo'])}")
            print(f"{gpu_name} {direction} {'':22s} lko {summary(lko.values())}")
            print(f"{gpu_name} {direction} {'':22s}     {compared(lko, base['lko'])}")


if __name__ == "__main__":
    main()

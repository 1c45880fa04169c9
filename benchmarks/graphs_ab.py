"""Small passes with and without CUDA graph replays (autoflash/graphs.py; NOTES 94, 96), interleaved in one process.

    python benchmarks/graphs_ab.py [--shapes examples/holdout.yaml] [--rounds 4] [--switch graphs] [--gpu-time]
                                   --out FILE

96. compared two held-out runs one after the other and found rows that the graphs cannot have touched slower
or faster by up to 0.14 ms: the host's speed drifted between the runs. Here every round times each problem's
forward and backward with AUTOFLASH_GRAPHS=0 and =1 (the order alternating a round) and plain SDPA, the plans
rebuilt before each timing (the variable is read as a plan is made), so the two settings differ in the replays
alone, on one host in the same minute. One JSON line per problem and direction: the medians over the rounds.
`--switch query_splits` turns another switch off and on the same way: dispatch's split of a backward's query steps
over programs (NOTES 107; off: every chosen backward keeps query_splits 1); `--switch group_splits` its floor on a
borrowed causal GQA backward's group split (NOTES 109; off: a neighbour's split as it was tuned). `--gpu-time` times
each pass within replays of a CUDA graph of many (the GPU's time alone, `median_ms(graph=True)`), not call after call.
"""

import argparse
import math
import os
import statistics
from collections import Counter

import torch

import autoflash
from autoflash import api, graphs
from autoflash.families.gluon import defaults as gluon_defaults
from autoflash.reference import sdpa_attention
from autoflash.shapes import load_problems
from autoflash.bench import pass_ms, timing_sets
from autoflash.tune.trial import variant_kwargs
from results_file import append_row


OCCUPIED, GROUPED = gluon_defaults.occupied, gluon_defaults.grouped


def _graphs(on: bool) -> None:
    os.environ["AUTOFLASH_GRAPHS"] = "1" if on else "0"


def _query_splits(on: bool) -> None:
    gluon_defaults.occupied = OCCUPIED if on else lambda knobs, problem, gpu: knobs
    api.DISPATCHER._choices.clear()  # (choices are memoised with their knobs)


def _group_splits(on: bool) -> None:
    gluon_defaults.grouped = GROUPED if on else lambda knobs, problem, gpu: knobs
    api.DISPATCHER._choices.clear()


SWITCHES = {"graphs": _graphs, "query_splits": _query_splits, "group_splits": _group_splits}


def compare(p, direction: str, rounds: int, device: torch.device, switch=_graphs, gpu_time: bool = False) -> dict:
    """Median ms of autoflash with `switch` off and on, and of plain SDPA, over interleaved rounds."""
    sets = timing_sets(p, device, "bwd")  # (q, k, v, dout: the forward's timing reads q, k, v)
    variants = variant_kwargs(p, device)
    ours = lambda q, k, v: autoflash.attention(q, k, v, causal=p.causal, **variants)  # noqa: E731
    times, plans_did = {"off": [], "on": [], "sdpa": []}, []
    for r in range(rounds):
        for setting in ("off", "on") if r % 2 == 0 else ("on", "off"):
            switch(setting == "on")
            api._plans.clear()  # (a new plan reads the switch)
            before = Counter(graphs.COUNTS)
            times[setting].append(pass_ms(ours, direction, sets, device, rep_ms=50.0, graph=gpu_time))
            if setting == "on":  # (what the calls did: replayed, captured, ran as they are)
                plans_did.append(dict(Counter(graphs.COUNTS) - before))
        times["sdpa"].append(pass_ms(lambda q, k, v: sdpa_attention(q, k, v, p.causal), direction, sets, device,
                                     rep_ms=50.0, graph=gpu_time))
    del sets
    torch.cuda.empty_cache()
    medians = {name: statistics.median(ms) for name, ms in times.items()}
    return medians | dict(rounds_ms=times, graphs_by_round=plans_did)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="examples/holdout.yaml")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--switch", choices=SWITCHES, default="graphs")
    parser.add_argument("--gpu-time", action="store_true", help="the GPU's time alone (within CUDA graph replays)")
    parser.add_argument("--out")
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # (the CPU: TRITON_INTERPRET=1, a smoke run)
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)"
    meta = dict(bench="graphs_ab", switch=args.switch, gpu_time=args.gpu_time, gpu=gpu, autoflash=autoflash.__version__)
    ratios = {"fwd": [], "bwd": []}
    print(f"{'problem':44s} dir   off ms    on ms  SDPA ms  off/SDPA on/SDPA  on/off")
    for p in load_problems(args.shapes):
        for direction in ("fwd", "bwd"):
            row = compare(p, direction, args.rounds, device, SWITCHES[args.switch], args.gpu_time)
            append_row(args.out, dict(meta, problem=p.label(), direction=direction, **row))
            ratios[direction].append((row["sdpa"] / row["off"], row["sdpa"] / row["on"]))
            print(f"{p.label():44s} {direction} {row['off']:8.4f} {row['on']:8.4f} {row['sdpa']:8.4f} "
                  f"{row['sdpa'] / row['off']:8.2f}x {row['sdpa'] / row['on']:6.2f}x {row['off'] / row['on']:6.2f}x")
    for direction, pairs in ratios.items():
        off, on = (math.exp(statistics.fmean(math.log(pair[i]) for pair in pairs)) for i in (0, 1))
        print(f"{direction} vs plain SDPA, geomean over {len(pairs)}: {args.switch} off {off:.3f}x, on {on:.3f}x")


if __name__ == "__main__":
    main()

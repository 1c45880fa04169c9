"""Compile `tl` forward variants for Hopper on the CPU (no GPU) and compare two trees' machine code: a template
refactor that should change nothing must give the same registers, spills and PTX instructions.

    PYTHONPATH=<tree A> python benchmarks/tl_sm90.py compile /tmp/before
    PYTHONPATH=<tree B> python benchmarks/tl_sm90.py compile /tmp/after
    python benchmarks/tl_sm90.py compare /tmp/before /tmp/after

`compile` renders each knob point of POINTS through the family's launcher (so the kernels get the launcher's
constexprs), compiles every kernel it launches for sm_90 and writes its PTX and a summary (ptxas's registers
and spills); `compare` prints per kernel whether the PTX is the same instruction sequence (register numbers and
debug lines aside), the same instructions in another order, or different.
"""

import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

SHAPE = dict(batch=2, heads_q=4, heads_kv=2, seqlen=1000)


def points():
    """(knob changes, head_dim, causal): every load mode x causal/full x two tiles, key splits, no causal split,
    head-dim split, head dim 96; pointer loads also with packed GQA, exp and longest-first scheduling."""
    tiles = [dict(block_m=128, block_n=64, num_warps=4, num_stages=2),
             dict(block_m=64, block_n=128, num_warps=4, num_stages=3)]
    for loads in ("pointer", "tma", "tma_host"):
        first = dict(tiles[0], loads=loads)
        for causal in (False, True):
            for tile in tiles:
                yield dict(tile, loads=loads), 64, causal
            yield dict(first, kv_splits=4), 64, causal
            yield dict(first, causal_split=False), 64, causal
            yield dict(first, head_dim_split=True), 80, causal
            yield dict(first, head_dim_split=True, kv_splits=4, causal_split=False), 80, causal
            yield first, 96, causal
            if loads == "pointer":
                yield dict(first, pack_gqa=True), 64, causal
                yield dict(first, pack_gqa=True, head_dim_split=True, kv_splits=4), 80, causal
                yield dict(first, exp="exp"), 64, causal
                yield dict(first, schedule="longest_first"), 64, causal


def _ptxas(ptx: str) -> dict:
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.ptx"
        path.write_text(ptx)
        run = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(path), "-o", str(Path(tmp) / "k.cubin")],
                             capture_output=True, text=True, check=True)
    text = run.stdout + run.stderr
    return dict(registers=int(re.search(r"Used (\d+) registers", text).group(1)),
                spill_stores=int(re.search(r"(\d+) bytes spill stores", text).group(1)),
                spill_loads=int(re.search(r"(\d+) bytes spill loads", text).group(1)))


def rendered(knobs, gates=frozenset(), mask_mod=None, score_mod=None):
    """The imported module of a variant's kernels, rendered with `gates` (and a MASK_MOD problem's rendered
    `mask_mod`, a SCORE_MOD problem's `score_mod`; Triton reads a kernel's source file)."""
    from autoflash import codegen

    source = codegen.render(knobs, variants=gates, mask_mod=mask_mod, score_mod=score_mod)
    path = Path(tempfile.gettempdir()) / f"tl_{hashlib.sha256(source.encode()).hexdigest()[:12]}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sm90_compiler(compiled: dict):
    """A launcher's `compile` argument that compiles each kernel for sm_90 into `compiled` (name -> Triton's
    compiled kernel) and launches nothing."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)

    def compile(kernel, grid, args, options, tensor_count):
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        packed, signature, constexprs, attrs = kernel._pack_args(backend, options, *binder(*args, **options))
        compiled[kernel.__name__] = triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target,
                                                   options=packed.__dict__)
        return lambda *tensors: None
    return compile


def summary_of(compiled) -> dict:
    """ptxas's registers and spills and Triton's shared memory of a compiled kernel."""
    return dict(_ptxas(compiled.asm["ptx"]), shared=compiled.metadata.shared)


def compile_points(out_dir: Path) -> None:
    import torch

    from autoflash.families.tl.knobs import FwdKnobs
    from autoflash.resources import launcher

    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {}
    for change, head_dim, causal in points():
        knobs = FwdKnobs(**change)
        name = "_".join(f"{k}={v}" for k, v in sorted(change.items())) + f"_d{head_dim}_{'causal' if causal else 'full'}"
        b, hq, hkv, s = SHAPE["batch"], SHAPE["heads_q"], SHAPE["heads_kv"], SHAPE["seqlen"]
        q, k = torch.empty(b, hq, s, head_dim, dtype=torch.float16), torch.empty(b, hkv, s, head_dim, dtype=torch.float16)
        compiled = {}
        launcher("tl").forward_plan(rendered(knobs), knobs.as_point(), q, k, torch.empty_like(k), torch.empty_like(q),
                                    torch.empty(b, hq, s), 0.1, causal, sm90_compiler(compiled))
        for kernel, c in compiled.items():
            (out_dir / f"{name}.{kernel}.ptx").write_text(c.asm["ptx"])
            summary[f"{name}.{kernel}"] = summary_of(c)
            print(name, kernel, summary[f"{name}.{kernel}"], flush=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))


def _instructions(path: Path) -> list[str]:
    """The PTX's instructions, register numbers and debug lines aside."""
    lines = []
    for line in path.read_text().split(".section")[0].splitlines():
        s = line.strip()
        if s and not s.startswith((".loc", ".file", "//")) and not re.match(r"^\$L__\w+:$", s):
            lines.append(re.sub(r"%(r|rd|f|p|rs|hs|h|fd|rl)\d+", r"%\1", s))
    return lines


def compare(before: Path, after: Path) -> int:
    b, a = (json.loads((d / "summary.json").read_text()) for d in (before, after))
    counts = Counter()
    for name in sorted(b):
        x, y = _instructions(before / f"{name}.ptx"), _instructions(after / f"{name}.ptx")
        verdict = "same" if x == y else "reordered" if Counter(x) == Counter(y) else "different"
        counts[verdict] += 1
        if verdict == "different" or b[name] != a.get(name):
            print(f"{name}: {verdict}; before {b[name]}, after {a.get(name)}")
    print(f"{len(b)} kernels: {counts['same']} the same PTX, {counts['reordered']} the same instructions reordered, "
          f"{counts['different']} different")
    return counts["different"]


if __name__ == "__main__":
    if sys.argv[1:2] == ["compile"]:
        compile_points(Path(sys.argv[2]))
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(1 if compare(Path(sys.argv[2]), Path(sys.argv[3])) else 0)
    else:
        sys.exit(__doc__)

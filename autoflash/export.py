"""Export chosen variants as a standalone Python package that needs only torch and triton.

The package holds one rendered kernel file per variant (its header names the knobs, the template
fingerprint, the versions and the measured TFLOP/s), a copy of each family's launcher (per direction) and of the
compile-once launch (autoflash/launch.py) and of the argument checks (autoflash/checks.py), and an `__init__.py`
with a lookup table and a differentiable `attention` for the exported problems, called and checked as
autoflash.attention is (causal, softmax_scale, window_size, softcap, alibi_slopes, return_lse, deterministic, out).
"""

import shutil
from pathlib import Path

from autoflash import checks, codegen, launch
from autoflash.dispatch import Choice
from autoflash.problem import Problem
from autoflash.resources import launcher_path


def export(choices: dict[Problem, dict[str, Choice]], out: Path, gpu_family: str) -> Path:
    """Write the package to `out` (created; files of an earlier export there are replaced).
    `choices` maps each problem to its chosen variant per kind: "fwd", "bwd" and "bwd_deterministic" (the
    backward of deterministic=True)."""
    out.mkdir(parents=True, exist_ok=True)
    rows, used, fixed = [], set(), set()
    for problem, per_kind in choices.items():
        variants = {}
        for kind, choice in per_kind.items():
            module = f"variant_{codegen.kernel_key(choice.knobs, problem.gates())}"
            tflops = round(choice.tuned.tflops, 1) if choice.tuned and choice.tuned.problem == problem else None
            header = (f"gpu family: {gpu_family}",
                      f"chosen for: {problem.key()} {kind} ({choice.reason}; source {choice.source})",
                      f"measured: {'not measured on this exact problem' if tflops is None else f'{tflops} TFLOP/s'}")
            source = codegen.render(choice.knobs, extra_header=header, variants=problem.gates())
            (out / f"{module}.py").write_text(source)
            variants[kind] = (module, choice.knobs.family, choice.knobs.as_point(), tflops)
            used.add((choice.knobs.family, choice.knobs.DIRECTION))
            if problem.window != (-1, -1) or problem.softcap or problem.alibi:
                fixed.add(choice.knobs.family)
        key = (problem.batch, problem.heads_q, problem.heads_kv, problem.seqlen_q, problem.seqlen_k, problem.head_dim,
               problem.causal, problem.dtype, problem.window, problem.softcap, problem.alibi)
        rows.append(dict(key=repr(key), variants=repr(variants)))
    for family, direction in sorted(used):
        shutil.copyfile(launcher_path(family, direction), out / f"launch_{family}_{direction}.py")
    for family in fixed:  # the fixed variants' plans, on top of the family's (package.py.jinja sets their `base`)
        shutil.copyfile(launcher_path(family, codegen.FIXED_VARIANTS), out / f"launch_{family}_variants.py")
    shutil.copyfile(launch.__file__, out / "_launch.py")
    shutil.copyfile(checks.__file__, out / "_checks.py")
    fingerprints = ", ".join(f"{d} {f} {codegen.template_fingerprint(f, d)}" for f, d in sorted(used))
    (out / "__init__.py").write_text(codegen.render_template(
        "export/package.py.jinja", ROWS=rows, GPU=gpu_family, FINGERPRINTS=fingerprints))
    return out

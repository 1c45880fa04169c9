"""Export chosen variants as a standalone Python package that needs only torch and triton.

The package holds one rendered kernel file per variant (its header names the knobs, the template
fingerprint, the versions and the measured TFLOP/s), a copy of each family's launcher (per direction) and of the
compile-once launch (autoflash/launch.py) and of the argument checks (autoflash/checks.py), and an `__init__.py`
with a lookup table and a differentiable `attention` for the exported problems, called and checked as
autoflash.attention is (causal, softmax_scale, window_size, softcap, alibi_slopes, mask_mod, score_mod, return_lse,
deterministic, out).

A problem with a mask_mod or score_mod names the mod by its fingerprint (a database holds no functions): `export`
takes the mods themselves (`mods`), renders them into the kernels and writes MODS, what the package's `MaskMod(name,
*captures)` and `ScoreMod(...)` find them by (their rendered source, what they read). Mod problems are not tuned
yet: `chosen` gives them dispatch's choice, their family's default where no database holds their fingerprint.
"""

import shutil
from pathlib import Path

from autoflash import checks, codegen, launch
from autoflash.dispatch import Choice, Dispatcher
from autoflash.families import DIRECTIONS
from autoflash.gpu import Gpu
from autoflash.mask_mod import Mod
from autoflash.problem import Problem
from autoflash.resources import BORROWED, borrowed, launcher_path


def chosen(problems: list[Problem], gpu: Gpu, dispatcher: Dispatcher) -> dict[Problem, dict[str, Choice]]:
    """`export`'s `choices`: each problem's variants as dispatch chooses them from `dispatcher`'s databases, the
    backward of deterministic=True too (the exported attention takes the flag). tensors=(): an export cannot see
    the calls' tensors, and a backward's choice does not depend on them."""
    return {p: {d: dispatcher.choice(p, gpu, d) for d in DIRECTIONS}
            | {"bwd_deterministic": dispatcher.for_call(p, gpu, "bwd", tensors=(), deterministic=True)}
            for p in problems}


def export(choices: dict[Problem, dict[str, Choice]], out: Path, gpu_family: str, mods: tuple[Mod, ...] = ()) -> Path:
    """Write the package to `out` (created; files of an earlier export there are replaced).
    `choices` maps each problem to its chosen variant per kind: "fwd", "bwd" and "bwd_deterministic" (the
    backward of deterministic=True). `mods`: the autoflash.MaskMod and ScoreMod objects whose fingerprints the
    problems name (their captures' data aside: any tensors of the dtypes and ranks the calls will pass)."""
    exported = _exported_mods(choices, mods)
    out.mkdir(parents=True, exist_ok=True)
    rows, used, fixed, masked = [], set(), set(), set()
    for problem, per_kind in choices.items():
        rendered = tuple(exported[fingerprint].rendered if fingerprint else None
                         for fingerprint in (problem.mask_mod, problem.score_mod))
        variants = {}
        for kind, choice in per_kind.items():
            module = f"variant_{codegen.kernel_key(choice.knobs, problem.gates(), *rendered)}"
            tuned = choice.tuned if choice.tuned and choice.tuned.problem == problem else None
            rate = tuned and problem.tflops(kind.split("_")[0], tuned.median_ms)  # (a mask_mod's: none)
            measured = "not measured on this exact problem" if tuned is None else \
                f"{tuned.median_ms:.4f} ms" + (f", {rate:.1f} TFLOP/s" if rate else "")
            header = (f"gpu family: {gpu_family}",
                      f"chosen for: {problem.key()} {kind} ({choice.reason}; source {choice.source})",
                      f"measured: {measured}")
            source = codegen.render(choice.knobs, extra_header=header, variants=problem.gates(), mask_mod=rendered[0],
                                    score_mod=rendered[1])
            (out / f"{module}.py").write_text(source)
            variants[kind] = (module, choice.knobs.family, choice.knobs.as_point(), rate and round(rate, 1))
            used.add((choice.knobs.family, choice.knobs.DIRECTION))
            if problem.gates() - problem.variants:  # window, softcap, ALiBi, mods
                fixed.add(choice.knobs.family)
            if problem.mask_mod:
                masked.add(choice.knobs.family)
        key = (problem.batch, problem.heads_q, problem.heads_kv, problem.seqlen_q, problem.seqlen_k, problem.head_dim,
               problem.causal, problem.dtype, problem.window, problem.softcap, problem.alibi, problem.mask_mod,
               problem.score_mod)
        rows.append(dict(key=repr(key), variants=repr(variants)))
    for family, direction in sorted(used):  # each direction's launcher, with those it takes from another family
        own = launcher_path(family, direction)
        for other, part in [(family, direction), *borrowed(own.read_text())]:
            shutil.copyfile(launcher_path(other, part), out / f"launch_{other}_{part}.py")
    for family in fixed:  # the fixed variants' plans, on top of the family's (package.py.jinja sets their `base`)
        shutil.copyfile(launcher_path(family, codegen.FIXED_VARIANTS), out / f"launch_{family}_variants.py")
    for family in masked:  # a mask_mod's plans, with the launchers they build on from another family (BORROWED)
        own = launcher_path(family, codegen.MASK_MOD)
        for other, part in [(family, codegen.MASK_MOD), *borrowed(own.read_text())]:
            shutil.copyfile(launcher_path(other, part), out / f"launch_{other}_{part}.py")
    shutil.copyfile(launch.__file__, out / "_launch.py")
    shutil.copyfile(checks.__file__, out / "_checks.py")
    fingerprints = ", ".join(f"{d} {f} {codegen.template_fingerprint(f, d)}" for f, d in sorted(used))
    mod_rows = [dict(key=repr(fingerprint), entry=repr((mod.KIND.label, mod.fn.__name__, mod.rendered.source,
                                                        mod.rendered.per_batch, mod.rendered.per_head,
                                                        mod.rendered.captures)))
                for fingerprint, mod in exported.items()]
    (out / "__init__.py").write_text(codegen.render_template(
        "export/package.py.jinja", ROWS=rows, MODS=mod_rows, GPU=gpu_family, FINGERPRINTS=fingerprints,
        BORROWED=repr(BORROWED)))
    return out


def _exported_mods(choices, mods) -> dict[str, Mod]:
    """The mods the problems of `choices` name, by fingerprint, from `mods`; a clear error for one missing, and for
    two of a kind and name with different sources (the package finds a mod by its name)."""
    given = {mod.fingerprint(): mod for mod in mods}
    exported, sources = {}, {}
    for problem in choices:
        for label, fingerprint in (("mask_mod", problem.mask_mod), ("score_mod", problem.score_mod)):
            if not fingerprint:
                continue
            if fingerprint not in given or given[fingerprint].KIND.label != label:
                raise ValueError(f"problem {problem.key()} has the {label} of fingerprint {fingerprint}, and no such "
                                 f"mod was given ({', '.join(f'{m.title} {f}' for f, m in given.items()) or 'none'}): "
                                 f"a database holds a mod's fingerprint, not its function; pass the mod (autoflash "
                                 f"export --{label.replace('_', '-')} MODULE:NAME, or export(..., mods=[...]))")
            mod = exported[fingerprint] = given[fingerprint]
            if sources.setdefault(mod.title, mod.rendered.source) != mod.rendered.source:
                raise ValueError(f"two mods exported as {mod.title} have different sources: rename one (an exported "
                                 "package finds a mod by its name)")
    return exported

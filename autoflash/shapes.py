"""Problems files: the YAML that names the shapes to tune, bench or export.

    problems:
      - {batch: 4, heads_q: 32, heads_kv: 8, seqlen_q: 2048, head_dim: 128, causal: true, dtype: bfloat16}
      - {batch: 1, heads_q: 16, seqlen_q: [1024, 4096], seqlen_k: 4096, head_dim: 64, causal: [false, true]}

heads_kv defaults to heads_q, seqlen_k to seqlen_q, causal to false, dtype to float16. A field given
as a list expands to a grid: the entry above stands for every combination of its lists.

Attention variants, as autoflash.attention takes them: `window_size: [left, right]` (-1: unbounded; a list of
pairs is a grid of windows), `softcap: 30.0` (any value > 0 tunes the softcapped kernels: the value is each
call's data), `alibi: true`.

Packed problems, tuned for autoflash.attention_varlen and autoflash.attention_with_kvcache:

      - {batch: 16, heads_q: 32, heads_kv: 8, seqlen_q: 8192, head_dim: 128, causal: true, varlen: true}
      - {batch: 32, heads_q: 64, heads_kv: 8, seqlen_q: 1, seqlen_k: 32768, head_dim: 128,
         kvcache: {page_size: [16, 256]}}

`varlen: true`: packed sequences of different lengths (attention_varlen); batch counts the sequences, seqlen_q and
seqlen_k are the longest ones. `kvcache: {page_size: N}`: attention over a KV cache (attention_with_kvcache,
forward only): seqlen_q the queries of each sequence, seqlen_k the cache's capacity per sequence; page_size the
tokens a page of a paged cache, 0 or absent for a dense cache (a list of sizes is a grid). Their lengths are the
longest rounded up to a power of two (dispatch keys calls so: one record serves every batch of the bucket). The
tuner draws the sequences' lengths from the problem alone (Problem.sequence_lengths). Neither takes window_size,
softcap or alibi.
"""

import itertools
import math
import reprlib
from pathlib import Path

import yaml

from autoflash.problem import Problem

REQUIRED = ("batch", "heads_q", "seqlen_q", "head_dim")
OPTIONAL = {"heads_kv": None, "seqlen_k": None, "causal": False, "dtype": "float16", "window_size": [-1, -1],
            "softcap": 0.0, "alibi": False, "varlen": False, "kvcache": None}
MAX_PROBLEMS = 100_000  # in one file, grids expanded: far more than a tuning run can time
MAX_ECHO = 300  # characters of the user's input an error message repeats, at most


class ShapesError(ValueError):
    pass


def load_problems(path: str | Path) -> list[Problem]:
    try:
        document = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ShapesError(f"cannot read problems file {path}: {e}") from e
    if not isinstance(document, dict) or not isinstance(document.get("problems"), list):
        raise ShapesError(f"{path}: expected a mapping with a list under 'problems' (see autoflash.shapes)")
    grids = [(_grid(entry, f"{path}: problems[{index}]"), f"{path}: problems[{index}]")
             for index, entry in enumerate(document["problems"])]
    size = sum(_size(grid) for grid, _ in grids)
    if size > MAX_PROBLEMS:
        raise ShapesError(f"{path}: its grids stand for {size:,} problems, more than {MAX_PROBLEMS:,}; "
                          "split the file or shorten its lists")
    problems = [problem for grid, where in grids for problem in _expand(grid, where)]
    return list(dict.fromkeys(problems))  # grids may overlap: keep the first of each


def _grid(entry, where: str) -> dict[str, list]:
    """The values each field takes in this entry (a field given as one value takes just that one)."""
    if not isinstance(entry, dict):
        raise ShapesError(f"{where}: expected a mapping of fields, got {_echo(entry)}")
    unknown = set(entry) - set(REQUIRED) - set(OPTIONAL)
    if unknown:
        raise ShapesError(f"{where}: unknown field(s) {_echo(sorted(unknown, key=str))}; "
                          f"fields are {list(REQUIRED) + list(OPTIONAL)}")
    missing = [name for name in REQUIRED if name not in entry]
    if missing:
        raise ShapesError(f"{where}: missing field(s) {missing}")
    fields = {name: entry.get(name, OPTIONAL.get(name)) for name in (*REQUIRED, *OPTIONAL)}
    grid = {name: value if isinstance(value, list) else [value] for name, value in fields.items()}
    window = fields["window_size"]  # a pair, or a list of pairs
    grid["window_size"] = [window] if isinstance(window, list) and not any(isinstance(w, list) for w in window) \
        else window if isinstance(window, list) else [window]
    for value in grid["window_size"]:
        if not (isinstance(value, list) and len(value) == 2 and
                all(type(w) is int and w >= -1 for w in value)):
            raise ShapesError(f"{where}: field 'window_size' must be [left, right] (integers, -1: unbounded) or a "
                              f"list of such pairs, got {_echo(window)}")
    grid["window_size"] = [tuple(w) for w in grid["window_size"]]
    grid["kvcache"] = _page_sizes(fields["kvcache"], where)
    for name, values in grid.items():
        if any(isinstance(value, (list, dict, set)) for value in values):
            raise ShapesError(f"{where}: field '{name}' must be a value or a flat list of values, "
                              f"got {_echo(fields[name])}")
    if _size(grid) > MAX_PROBLEMS:
        raise ShapesError(f"{where}: the grid stands for {_size(grid):,} problems, more than {MAX_PROBLEMS:,}; "
                          "shorten its lists")
    return grid


def _page_sizes(kvcache, where: str) -> list[int | None]:
    """The page sizes a `kvcache` field stands for (0: a dense cache); [None] where the field is absent."""
    if kvcache is None:
        return [None]
    sizes = kvcache.get("page_size", 0) if isinstance(kvcache, dict) and set(kvcache) <= {"page_size"} else None
    sizes = sizes if isinstance(sizes, list) else [sizes]
    if not sizes or any(type(size) is not int or size < 0 for size in sizes):
        raise ShapesError(f"{where}: field 'kvcache' must be {{page_size: N}} (N tokens a page of a paged cache, "
                          f"0 for a dense one; a list of sizes is a grid), got {_echo(kvcache)}")
    return sizes


def _size(grid: dict[str, list]) -> int:
    return math.prod(len(values) for values in grid.values())


def _expand(grid: dict[str, list], where: str) -> list[Problem]:
    problems = []
    for values in itertools.product(*grid.values()):
        one = dict(zip(grid, values))
        one["heads_kv"] = one["heads_q"] if one["heads_kv"] is None else one["heads_kv"]
        one["seqlen_k"] = one["seqlen_q"] if one["seqlen_k"] is None else one["seqlen_k"]
        problems.append(_problem(one, where))
    return problems


def _problem(one: dict, where: str) -> Problem:
    window, softcap, alibi = one.pop("window_size"), one.pop("softcap"), one.pop("alibi")
    varlen, page_size = one.pop("varlen"), one.pop("kvcache")
    if type(varlen) is not bool:
        raise ShapesError(f"{where}: field 'varlen' must be true or false, got {_echo(varlen)}")
    if (varlen or page_size is not None) and (window != (-1, -1) or softcap or alibi):
        raise ShapesError(f"{where}: packed problems (varlen, kvcache) take no window_size, softcap or alibi: "
                          "attention_varlen and attention_with_kvcache have none")
    if varlen or page_size is not None:
        one.update(variants=frozenset({"VARLEN", "PAGED"} if page_size else {"VARLEN"}), page_size=page_size or 0)
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or not 0 <= softcap < float("inf"):
        raise ShapesError(f"{where}: field 'softcap' must be a number >= 0 (0: off), got {_echo(softcap)}")
    if type(alibi) is not bool:
        raise ShapesError(f"{where}: field 'alibi' must be true or false, got {_echo(alibi)}")
    try:
        problem = Problem(**one).validate().with_variants(window, softcap > 0, alibi).validate()
    except ValueError as e:
        raise ShapesError(_capped(f"{where}: {e}")) from None
    if not 16 <= problem.head_dim <= 256:
        raise ShapesError(f"{where}: field 'head_dim' must be 16..256, got {problem.head_dim}")
    return problem


_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 3, MAX_ECHO, MAX_ECHO


def _echo(value) -> str:
    """The repr of a piece of the user's input, bounded: a few levels and items deep, MAX_ECHO characters long
    (a YAML alias bomb must not become a gigabyte message)."""
    return _capped(_repr.repr(value))


def _capped(text: str) -> str:
    return text if len(text) <= MAX_ECHO else f"{text[:MAX_ECHO]}... ({len(text):,} characters)"

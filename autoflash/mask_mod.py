"""User-written masks (FlexAttention's mask_mod), checked and rendered into the `tl` kernels as a Triton function.

    def same_document(b, h, q_idx, kv_idx, document_id):
        return document_id[q_idx] == document_id[kv_idx]

    autoflash.attention(q, k, v, mask_mod=autoflash.MaskMod(same_document, document_id))

A mod's first four parameters are the batch entry, the query head, the query position and the key position; the
rest are its captures: 1-D int32/int64 tensors on q's device, given to `MaskMod` in that order (a mod without
captures may be passed as the plain function). Its body is assignments and one return, of expressions that torch
and Triton read alike: arithmetic, comparisons, & | ^ ~, a capture indexed by an expression (the kernel reads 0
past a capture's ends; torch raises there, so index within them) and torch.where/minimum/maximum/abs. Python
control flow (if, for, while, and/or/not, a < b < c) cannot run on a kernel's values and is refused, as are names
from outside the mod (pass tensors as captures, write constants as literals). Integer // and % round as C does
in the kernel: keep their operands >= 0.
"""

import ast
import hashlib
import inspect
import textwrap
from typing import NamedTuple

import torch

INDICES = 4  # (b, h, q_idx, kv_idx)
CAPTURE_DTYPES = (torch.int32, torch.int64)
_CALLS = {"where", "minimum", "maximum", "abs"}  # torch.<name> -> tl.<name>
_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr, ast.BitXor,
              ast.LShift, ast.RShift, ast.Invert, ast.USub, ast.UAdd, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt,
              ast.GtE)
# Names of the generated module a mod's own names would hide.
_RESERVED = {"tl", "triton", "torch", "math", "LOG2E", "LN2"}


class Rendered(NamedTuple):
    """A mod as the kernels take it: `source`, a @triton.jit function `_mask_mod` (captures read through
    `_capture`), and what it reads."""
    source: str
    captures: int  # parameters after the four indices
    per_batch: bool  # whether it reads b (else its block table is shared by the batch entries)
    per_head: bool  # whether it reads h


class MaskMod:
    """`fn(b, h, q_idx, kv_idx, *captures) -> bool`, with the tensors it reads (see the module's doc)."""

    def __init__(self, fn, *captures):
        self.fn, self.captures = fn, captures
        self.rendered = render(fn)
        name = getattr(fn, "__name__", "?")
        if len(captures) != self.rendered.captures:
            raise TypeError(f"mask_mod {name} takes {self.rendered.captures} captured tensor(s) after (b, h, q_idx, "
                            f"kv_idx), and {len(captures)} were given: MaskMod({name}, tensor, ...) in its order")
        for i, t in enumerate(captures):
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in CAPTURE_DTYPES or t.stride(0) != 1:
                shown = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise TypeError(f"mask_mod {name}: capture {i} must be a 1-D contiguous int32 or int64 tensor, got "
                                f"{shown}: pass t.flatten().to(torch.int32) (or index it by an expression instead)")

    def fingerprint(self) -> str:
        """The mod's identity in a problem: its rendered source and its captures' dtypes and ranks (not data)."""
        kinds = ",".join(f"{t.dtype}/{t.dim()}" for t in self.captures)
        return hashlib.sha256(f"{self.rendered.source}\0{kinds}".encode()).hexdigest()[:16]

    def with_captures(self, captures) -> "MaskMod":
        mod = MaskMod.__new__(MaskMod)
        mod.fn, mod.captures, mod.rendered = self.fn, tuple(captures), self.rendered
        return mod

    def mask(self, batch: int, heads: int, seqlen_q: int, seqlen_k: int, device) -> torch.Tensor:
        """The mod over every (b, h, q_idx, kv_idx), evaluated by torch: a bool tensor (batch, heads, seqlen_q,
        seqlen_k) (the fp64 reference's and the tests' ground truth)."""
        b, h, q, k = (torch.arange(n, device=device).view([-1 if d == i else 1 for d in range(4)])
                      for i, n in enumerate((batch, heads, seqlen_q, seqlen_k)))
        result = torch.as_tensor(self.fn(b, h, q, k, *self.captures), device=device)
        return (result != 0).expand(batch, heads, seqlen_q, seqlen_k)


def as_mask_mod(mask_mod) -> MaskMod | None:
    """attention's mask_mod argument as a MaskMod (a plain function: one without captures); None for None."""
    if mask_mod is None or isinstance(mask_mod, MaskMod):
        return mask_mod
    return MaskMod(mask_mod)


_rendered: dict = {}


def render(fn) -> Rendered:
    """`fn` checked and rendered (once per code object: closures of one def share it)."""
    if not inspect.isfunction(fn):
        raise TypeError(f"mask_mod must be a Python function (def) or an autoflash.MaskMod, got {type(fn).__name__}")
    if fn.__code__ not in _rendered:
        _rendered[fn.__code__] = _render(fn)
    return _rendered[fn.__code__]


def _render(fn) -> Rendered:
    name = fn.__name__
    if name == "<lambda>":
        raise TypeError("mask_mod is a lambda: write it as a def (its source is rendered into the kernel)")
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError) as e:
        raise TypeError(f"mask_mod {name}: its source cannot be read ({e}): define it with def in a file") from None
    params = _checked_signature(name, tree.body[0])
    definition = tree.body[0]
    body = [s for s in definition.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                 and isinstance(s.value.value, str))]  # (the docstring goes)
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        raise TypeError(f"mask_mod {name} must end with `return <expression>`")
    known = set(params)
    for statement in body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            _check_expression(name, statement.value, known, params[INDICES:])
            known.add(_checked_name(name, statement.targets[0].id))
        elif isinstance(statement, ast.Return) and statement is body[-1]:
            _check_expression(name, statement.value, known, params[INDICES:])
        else:
            raise TypeError(f"mask_mod {name}: line {statement.lineno} is a {type(statement).__name__}; a mod is "
                            "assignments (x = ...) and one return: Python control flow cannot run on a kernel's "
                            "values (write conditions with & | ~ and torch.where)")
    definition.body = [_Kernel(set(params[INDICES:])).visit(s) for s in body]
    definition.name, definition.decorator_list, definition.returns = "_mask_mod", [], None
    read = {n.id for n in ast.walk(definition) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return Rendered("@triton.jit\n" + ast.unparse(definition) + "\n", len(params) - INDICES, params[0] in read,
                    params[1] in read)


def _checked_signature(name, definition) -> list[str]:
    if not isinstance(definition, ast.FunctionDef) or definition.decorator_list:
        raise TypeError(f"mask_mod {name} must be a plain def without decorators (a function of its own source)")
    args = definition.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.defaults or args.posonlyargs:
        raise TypeError(f"mask_mod {name}: take plain parameters (b, h, q_idx, kv_idx, *captured tensors): no *args, "
                        "**kwargs, defaults, keyword-only or positional-only ones")
    params = [_checked_name(name, a.arg) for a in args.args]
    if len(params) < INDICES:
        raise TypeError(f"mask_mod {name} takes {len(params)} parameters; it takes (b, h, q_idx, kv_idx), then one "
                        "per captured tensor")
    return params


def _checked_name(mod, name: str) -> str:
    if name.startswith("_") or name in _RESERVED:
        raise TypeError(f"mask_mod {mod}: rename '{name}' (names starting with _ and {sorted(_RESERVED)} are the "
                        "kernel module's)")
    return name


def _check_expression(mod, expression, known, captures) -> None:
    for node in ast.walk(expression):
        where = f"mask_mod {mod}, line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Name) and node.id not in known and node.id != "torch":
            raise TypeError(f"{where} reads '{node.id}', which is neither a parameter nor assigned before: pass "
                            "tensors as captures (MaskMod(fn, tensor)) and write constants as literals")
        if isinstance(node, (ast.BoolOp, ast.IfExp)) or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            raise TypeError(f"{where}: and/or/not and `x if c else y` are Python control flow: use & | ~ and "
                            "torch.where")
        if isinstance(node, ast.Compare) and len(node.ops) > 1:
            raise TypeError(f"{where}: a chained comparison (a < b < c) is Python control flow: write "
                            "(a < b) & (b < c)")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Attribute) and node.func.attr in _CALLS
                                               and isinstance(node.func.value, ast.Name)
                                               and node.func.value.id == "torch" and not node.keywords):
            raise TypeError(f"{where}: calls {ast.unparse(node.func)}; a mod calls only torch.where, torch.minimum, "
                            "torch.maximum and torch.abs (positional arguments)")
        if isinstance(node, ast.Subscript) and not (isinstance(node.value, ast.Name) and node.value.id in captures):
            raise TypeError(f"{where}: indexes {ast.unparse(node.value)}; only a capture (a parameter after kv_idx) "
                            "may be indexed, by one expression")
        if isinstance(node, ast.Constant) and type(node.value) not in (bool, int, float):
            raise TypeError(f"{where}: the constant {node.value!r} is not a number")
        if not isinstance(node, (ast.Name, ast.Load, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call,
                                 ast.Attribute, ast.Subscript, *_OPERATORS)):
            raise TypeError(f"{where}: {type(node).__name__} ({ast.unparse(node)[:40]}) is not an elementwise "
                            "expression a kernel can run")
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "torch"
                                                    and node.attr in _CALLS):
            raise TypeError(f"{where}: {ast.unparse(node)} reads an attribute; a mod calls only torch.where, "
                            "torch.minimum, torch.maximum and torch.abs")


class _Kernel(ast.NodeTransformer):
    """torch.f(...) -> tl.f(...); capture[i] -> _capture(capture, i)."""

    def __init__(self, captures):
        self.captures = captures

    def visit_Attribute(self, node):
        return ast.Attribute(ast.Name("tl", ast.Load()), node.attr, ast.Load())

    def visit_Subscript(self, node):
        return ast.Call(ast.Name("_capture", ast.Load()), [node.value, self.visit(node.slice)], [])

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

The checking and rendering (`Kind`, `Mod`, `checked`, `rendered`) serve autoflash/score_mod.py's score_mod too.
"""

import ast
import copy
import inspect
import linecache
import textwrap
from typing import NamedTuple

import torch

from autoflash.checks import mod_fingerprint

_OPERATORS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.BitAnd, ast.BitOr, ast.BitXor,
              ast.LShift, ast.RShift, ast.Invert, ast.USub, ast.UAdd, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt,
              ast.GtE)
# Names of the generated module a mod's own names would hide.
_RESERVED = {"tl", "triton", "torch", "math", "LOG2E", "LN2"}


class Kind(NamedTuple):
    """What a kind of mod is: its name in messages and in the kernels, its parameters before the captures, the
    torch functions it may call and its captures' dtypes."""
    label: str  # "mask_mod"
    leading: tuple[str, ...]  # the parameters before the captures
    calls: tuple[str, ...]  # torch.<name> -> tl.<name>
    capture_dtypes: tuple[torch.dtype, ...]


MASK = Kind("mask_mod", ("b", "h", "q_idx", "kv_idx"), ("where", "minimum", "maximum", "abs"),
            (torch.int32, torch.int64))


class Rendered(NamedTuple):
    """A mod as the kernels take it: `source`, a @triton.jit function named `_<label>` (captures read through
    `_capture`; a score_mod's derivative beside it), and what it reads."""
    source: str
    captures: int  # parameters after the leading ones
    per_batch: bool  # whether it reads b (else a mask's block table is shared by the batch entries)
    per_head: bool  # whether it reads h
    unit_grad: bool = False  # a score_mod whose derivative in the score is 1 (a bias): the backward skips it


class Mod:
    """`fn(*KIND.leading, *captures)`, with the tensors it reads (see the module's doc), checked and rendered."""
    KIND = MASK

    def __init__(self, fn, *captures):
        self.fn, self.captures = fn, captures
        self.first = (0, 0)  # (batch entry, head) of the slice `indices` number from (`at`)
        self.rendered = self.render(fn)
        label, name, count = self.KIND.label, getattr(fn, "__name__", "?"), self.rendered.captures
        if len(captures) != count:
            raise TypeError(f"{label} {name} takes {count} captured tensor(s) after ({', '.join(self.KIND.leading)})"
                            f", and {len(captures)} were given: {type(self).__name__}({name}, tensor, ...) in its "
                            "order")
        dtypes = [str(d).removeprefix("torch.") for d in self.KIND.capture_dtypes]
        kinds = f"{', '.join(dtypes[:-1])} or {dtypes[-1]}"
        for i, t in enumerate(captures):
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in self.KIND.capture_dtypes \
                    or t.stride(0) != 1:
                shown = f"{t.dtype} of shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                floating = isinstance(t, torch.Tensor) and t.is_floating_point() and "float32" in dtypes
                raise TypeError(f"{label} {name}: capture {i} must be a 1-D contiguous {kinds} tensor, got {shown}: "
                                f"pass t.flatten().to(torch.{'float32' if floating else dtypes[0]}) (or index it by "
                                "an expression instead)")

    @staticmethod
    def render(fn) -> Rendered:
        return render(fn)

    def fingerprint(self) -> str:
        """The mod's identity in a problem: its rendered source and its captures' dtypes and ranks (not data)."""
        return mod_fingerprint(self.rendered.source, self.captures)

    @property
    def title(self) -> str:
        """The mod in messages: 'mask_mod same_document'."""
        return f"{self.KIND.label} {getattr(self.fn, '__name__', '?')}"

    def with_captures(self, captures) -> "Mod":
        return self._with(captures=tuple(captures))

    def at(self, batch: int, head: int) -> "Mod":
        """This mod evaluated by torch on a slice of the problem that starts at batch entry `batch` and query head
        `head` (a reference of one head: its b and h are the problem's, not the slice's)."""
        return self._with(first=(batch, head))

    def _with(self, **changes) -> "Mod":
        """A copy with `changes` to its attributes (not copy.copy, which would pickle it: `__reduce__`)."""
        mod = object.__new__(type(self))
        mod.__dict__.update(self.__dict__, **changes)
        return mod

    def indices(self, batch: int, heads: int, seqlen_q: int, seqlen_k: int, device) -> tuple[torch.Tensor, ...]:
        """(b, h, q_idx, kv_idx) as int64 tensors that broadcast to (batch, heads, seqlen_q, seqlen_k), b and h from
        `first`."""
        return tuple(torch.arange(start, start + n, device=device).view([-1 if d == i else 1 for d in range(4)])
                     for i, (start, n) in enumerate(zip((*self.first, 0, 0), (batch, heads, seqlen_q, seqlen_k))))

    def __reduce__(self):
        """Pickled as its source and its captures (copied to the CPU): a tuner's worker process rebuilds it
        (`_rebuilt`) without the user's module, which it could not import (a mod defined in a script)."""
        source = textwrap.dedent(inspect.getsource(self.fn))
        return _rebuilt, (type(self), self.fn.__name__, source, tuple(t.cpu() for t in self.captures))


def _rebuilt(cls, name: str, source: str, captures) -> Mod:
    """A mod of class `cls` from its def's `source` (as `Mod.__reduce__` gives it) and captures. The source is kept
    where `inspect.getsource` finds it (linecache, under a name of its own), so the mod renders and pickles as the
    original does; it names nothing but torch and its parameters (`checked` refuses the rest)."""
    filename = f"<autoflash {cls.KIND.label} {name} {mod_fingerprint(source, captures)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"torch": torch}
    exec(compile(source, filename, "exec"), namespace)
    return cls(namespace[name], *captures)


class MaskMod(Mod):
    """`fn(b, h, q_idx, kv_idx, *captures) -> bool`, with the tensors it reads (see the module's doc)."""

    def mask(self, batch: int, heads: int, seqlen_q: int, seqlen_k: int, device) -> torch.Tensor:
        """The mod over every (b, h, q_idx, kv_idx), evaluated by torch: a bool tensor (batch, heads, seqlen_q,
        seqlen_k) (the fp64 reference's and the tests' ground truth)."""
        indices = self.indices(batch, heads, seqlen_q, seqlen_k, device)
        result = torch.as_tensor(self.fn(*indices, *self.captures), device=device)
        return (result != 0).expand(batch, heads, seqlen_q, seqlen_k)


def as_mask_mod(mask_mod) -> MaskMod | None:
    """attention's mask_mod argument as a MaskMod (a plain function: one without captures); None for None."""
    if mask_mod is None or isinstance(mask_mod, MaskMod):
        return mask_mod
    return MaskMod(mask_mod)


_rendered: dict = {}


def render(fn) -> Rendered:
    """The mask_mod `fn` checked and rendered."""
    return cached(fn, MASK, lambda name, params, definition: rendered(definition, params, MASK))


def cached(fn, kind: Kind, render_checked) -> Rendered:
    """`render_checked(*checked(fn, kind))`, once per code object (closures of one def share it) and kind."""
    key = (getattr(fn, "__code__", None), kind.label)
    if key not in _rendered:
        _rendered[key] = render_checked(*checked(fn, kind))
    return _rendered[key]


def rendered(definition, params, kind: Kind, source: str = "", unit_grad: bool = False) -> Rendered:
    """A checked definition (`checked`) as the kernels take it, `source` (more functions) after it."""
    read = {n.id for n in ast.walk(definition) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    b, h = len(kind.leading) - 4, len(kind.leading) - 3
    return Rendered(kernel_function(definition, f"_{kind.label}", params[len(kind.leading):]) + source,
                    len(params) - len(kind.leading), params[b] in read, params[h] in read, unit_grad)


def kernel_function(definition, name: str, captures) -> str:
    """A checked definition's source as a @triton.jit function `name` (torch's functions tl's, captures read through
    `_capture`)."""
    definition = copy.deepcopy(definition)
    definition.body = [_Kernel(set(captures)).visit(s) for s in definition.body]
    definition.name, definition.decorator_list, definition.returns = name, [], None
    return "@triton.jit\n" + ast.unparse(definition) + "\n"


def checked(fn, kind: Kind) -> tuple[str, list[str], ast.FunctionDef]:
    """(name, parameters, definition) of a mod `fn` of `kind`, checked: its body assignments and one return (the
    docstring gone), of expressions a kernel can run."""
    label = kind.label
    if not inspect.isfunction(fn):
        raise TypeError(f"{label} must be a Python function (def) or an autoflash.{_class_name(kind)}, got "
                        f"{type(fn).__name__}")
    name = fn.__name__
    if name == "<lambda>":
        raise TypeError(f"{label} is a lambda: write it as a def (its source is rendered into the kernel)")
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError) as e:
        raise TypeError(f"{label} {name}: its source cannot be read ({e}): define it with def in a file") from None
    definition = tree.body[0]
    params = _checked_signature(kind, name, definition)
    body = [s for s in definition.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant)
                                                 and isinstance(s.value.value, str))]  # (the docstring goes)
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        raise TypeError(f"{label} {name} must end with `return <expression>`")
    known = set(params)
    captures = params[len(kind.leading):]
    for statement in body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                and isinstance(statement.targets[0], ast.Name):
            _check_expression(kind, name, statement.value, known, captures)
            known.add(_checked_name(kind, name, statement.targets[0].id))
        elif isinstance(statement, ast.Return) and statement is body[-1]:
            _check_expression(kind, name, statement.value, known, captures)
        else:
            raise TypeError(f"{label} {name}: line {statement.lineno} is a {type(statement).__name__}; a mod is "
                            "assignments (x = ...) and one return: Python control flow cannot run on a kernel's "
                            "values (write conditions with & | ~ and torch.where)")
    definition.body = body
    return name, params, definition


def _class_name(kind: Kind) -> str:
    return "".join(part.capitalize() for part in kind.label.split("_"))


def _checked_signature(kind: Kind, name, definition) -> list[str]:
    label, leading = kind.label, ", ".join(kind.leading)
    if not isinstance(definition, ast.FunctionDef) or definition.decorator_list:
        raise TypeError(f"{label} {name} must be a plain def without decorators (a function of its own source)")
    args = definition.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.defaults or args.posonlyargs:
        raise TypeError(f"{label} {name}: take plain parameters ({leading}, *captured tensors): no *args, "
                        "**kwargs, defaults, keyword-only or positional-only ones")
    params = [_checked_name(kind, name, a.arg) for a in args.args]
    if len(params) < len(kind.leading):
        raise TypeError(f"{label} {name} takes {len(params)} parameters; it takes ({leading}), then one "
                        "per captured tensor")
    return params


def _checked_name(kind: Kind, mod, name: str) -> str:
    if name.startswith("_") or name in _RESERVED:
        raise TypeError(f"{kind.label} {mod}: rename '{name}' (names starting with _ and {sorted(_RESERVED)} are the "
                        "kernel module's)")
    return name


def _check_expression(kind: Kind, mod, expression, known, captures) -> None:
    calls = ", ".join(f"torch.{c}" for c in kind.calls)
    for node in ast.walk(expression):
        where = f"{kind.label} {mod}, line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Name) and node.id not in known and node.id != "torch":
            raise TypeError(f"{where} reads '{node.id}', which is neither a parameter nor assigned before: pass "
                            f"tensors as captures ({_class_name(kind)}(fn, tensor)) and write constants as literals")
        if isinstance(node, (ast.BoolOp, ast.IfExp)) or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            raise TypeError(f"{where}: and/or/not and `x if c else y` are Python control flow: use & | ~ and "
                            "torch.where")
        if isinstance(node, ast.Compare) and len(node.ops) > 1:
            raise TypeError(f"{where}: a chained comparison (a < b < c) is Python control flow: write "
                            "(a < b) & (b < c)")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Attribute) and node.func.attr in kind.calls
                                               and isinstance(node.func.value, ast.Name)
                                               and node.func.value.id == "torch" and not node.keywords):
            raise TypeError(f"{where}: calls {ast.unparse(node.func)}; a {kind.label} calls only {calls} "
                            "(positional arguments)")
        if isinstance(node, ast.Subscript) and not (isinstance(node.value, ast.Name) and node.value.id in captures):
            raise TypeError(f"{where}: indexes {ast.unparse(node.value)}; only a capture (a parameter after "
                            f"{kind.leading[-1]}) may be indexed, by one expression")
        if isinstance(node, ast.Constant) and type(node.value) not in (bool, int, float):
            raise TypeError(f"{where}: the constant {node.value!r} is not a number")
        if not isinstance(node, (ast.Name, ast.Load, ast.Constant, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call,
                                 ast.Attribute, ast.Subscript, *_OPERATORS)):
            raise TypeError(f"{where}: {type(node).__name__} ({ast.unparse(node)[:40]}) is not an elementwise "
                            "expression a kernel can run")
        if isinstance(node, ast.Attribute) and not (isinstance(node.value, ast.Name) and node.value.id == "torch"
                                                    and node.attr in kind.calls):
            raise TypeError(f"{where}: {ast.unparse(node)} reads an attribute; a {kind.label} calls only {calls}")


class _Kernel(ast.NodeTransformer):
    """torch.f(...) -> tl.f(...) (torch.tanh(x) -> 2 * tl.sigmoid(2 * x) - 1: tl has no tanh); capture[i] ->
    _capture(capture, i)."""

    def __init__(self, captures):
        self.captures = captures

    def visit_Call(self, node):
        node = self.generic_visit(node)
        if not (isinstance(node.func, ast.Attribute) and node.func.attr == "tanh"):  # (a capture read: _capture(...))
            return node
        sigmoid = ast.Call(ast.Attribute(ast.Name("tl", ast.Load()), "sigmoid", ast.Load()),
                           [ast.BinOp(ast.Constant(2.0), ast.Mult(), node.args[0])], [])
        return ast.BinOp(ast.BinOp(ast.Constant(2.0), ast.Mult(), sigmoid), ast.Sub(), ast.Constant(1.0))

    def visit_Attribute(self, node):
        if isinstance(node.value, ast.Name) and node.value.id == "torch":
            return ast.Attribute(ast.Name("tl", ast.Load()), node.attr, ast.Load())
        return node

    def visit_Subscript(self, node):
        return ast.Call(ast.Name("_capture", ast.Load()), [node.value, self.visit(node.slice)], [])

"""User-written score transforms (FlexAttention's score_mod), checked and rendered into the `tl` kernels as Triton
functions, the mod and its derivative in the score.

    def alibi(score, b, h, q_idx, kv_idx, slope):
        return score - slope[h] * torch.abs(q_idx - kv_idx)

    autoflash.attention(q, k, v, score_mod=autoflash.ScoreMod(alibi, slopes))

A mod's first five parameters are the score (in natural units: softmax_scale already applied, as FlexAttention's),
the batch entry, the query head, the query position and the key position; the rest are its captures: 1-D int32,
int64 or float32 tensors on q's device, given to `ScoreMod` in that order (a mod without captures may be passed as
the plain function). It returns the new score. Its body is what a mask_mod's may be (autoflash/mask_mod.py:
assignments and one return, no Python control flow, captures indexed by an expression, which reads 0 past a
capture's ends in the kernel), with float arithmetic and torch.where/minimum/maximum/abs/exp/log/tanh/sigmoid.

The backward needs d score_mod / d score: `derivative` takes it from the mod's source by the chain rule, as Python
of the same names (torch.where differentiates branch by branch; the indices, captures and comparisons are
constants in the score), and renders it as a second function, `_score_mod_grad`. What it cannot differentiate (//,
%, bit operations or a capture's index that depend on the score) is refused with the mod's name and the operation.
Gradients flow to q, k and v only: none to the captures (FlexAttention computes them; autoflash does not yet).
"""

import ast

import torch

from autoflash.mask_mod import Kind, Mod, Rendered, cached, kernel_function, rendered

SCORE = Kind("score_mod", ("score", "b", "h", "q_idx", "kv_idx"),
             ("where", "minimum", "maximum", "abs", "exp", "log", "tanh", "sigmoid"),
             (torch.int32, torch.int64, torch.float32))


class ScoreMod(Mod):
    """`fn(score, b, h, q_idx, kv_idx, *captures) -> score`, with the tensors it reads (see the module's doc). The
    backward differentiates it in the score only: no gradient flows to the captures."""
    KIND = SCORE

    @staticmethod
    def render(fn) -> Rendered:
        return render(fn)

    def apply(self, scores: torch.Tensor) -> torch.Tensor:
        """The mod over a (batch, heads, seqlen_q, seqlen_k) score matrix, evaluated by torch (the fp64 reference's
        ground truth; differentiable by autograd)."""
        indices = self.indices(*scores.shape, scores.device)
        captures = (t.to(scores.dtype) if t.is_floating_point() else t for t in self.captures)
        result = torch.as_tensor(self.fn(scores, *indices, *captures), device=scores.device)
        return result.to(scores.dtype).expand(scores.shape)


def as_score_mod(score_mod) -> ScoreMod | None:
    """attention's score_mod argument as a ScoreMod (a plain function: one without captures); None for None."""
    if score_mod is None or isinstance(score_mod, ScoreMod):
        return score_mod
    return ScoreMod(score_mod)


def render(fn) -> Rendered:
    """The score_mod `fn` checked and rendered with its derivative (`_score_mod_grad`, none where it is 1)."""
    return cached(fn, SCORE, _with_derivative)


def _with_derivative(name: str, params: list[str], definition: ast.FunctionDef) -> Rendered:
    grad = derivative(name, params, definition)
    unit = isinstance(grad.body[-1].value, ast.Constant) and grad.body[-1].value.value == 1.0
    grad_source = "" if unit else "\n\n" + kernel_function(grad, "_score_mod_grad", params[len(SCORE.leading):])
    return rendered(definition, params, SCORE, grad_source, unit)


def derivative(name: str, params: list[str], definition: ast.FunctionDef) -> ast.FunctionDef:
    """A checked mod's definition turned into its derivative in the score: each assignment x = e kept, after
    _d_x = de (where x depends on the score; before, as de reads the x it replaces), and `return d(returned
    expression)`."""
    grad = _Derivative(name, params[0])
    body = []
    for statement in definition.body[:-1]:
        target = statement.targets[0].id
        d = grad(statement.value)
        grad.assigned[target] = d is not None
        if d is not None:
            body.append(ast.Assign([ast.Name(f"_d_{target}", ast.Store())], d))
        body.append(statement)
    d = grad(definition.body[-1].value)
    returned = ast.Constant(0.0) if d is None else d
    if isinstance(returned, ast.Constant) and returned.value != 1.0:  # (a tensor of the score's shape)
        returned = ast.Call(_tl("full"), [ast.Attribute(ast.Name(params[0], ast.Load()), "shape", ast.Load()),
                                          returned, _tl("float32")], [])
    result = ast.FunctionDef(definition.name, definition.args, [*body, ast.Return(returned)], [], None,
                             type_params=[])
    return ast.fix_missing_locations(result)


def _tl(name):
    return ast.Attribute(ast.Name("tl", ast.Load()), name, ast.Load())


def _torch(name, *args):
    return ast.Call(ast.Attribute(ast.Name("torch", ast.Load()), name, ast.Load()), list(args), [])


def _is(node, value) -> bool:
    return isinstance(node, ast.Constant) and node.value == value


def _add(a, b):
    return b if a is None else a if b is None else ast.BinOp(a, ast.Add(), b)


def _mul(a, b):
    """a * b, either None (0) or 1.0 simplified away."""
    if a is None or b is None:
        return None
    return b if _is(a, 1.0) else a if _is(b, 1.0) else ast.BinOp(a, ast.Mult(), b)


def _neg(a):
    return None if a is None else ast.UnaryOp(ast.USub(), a)


class _Derivative:
    """d(expression)/d(score) as an expression of the mod's names (None: 0), for a checked mod's expressions."""

    def __init__(self, mod: str, score: str):
        self.mod, self.score = mod, score
        self.assigned: dict[str, bool] = {}  # assigned name -> whether it depends on the score (then _d_<name>)

    def refuse(self, node, what: str):
        raise TypeError(f"score_mod {self.mod}, line {node.lineno}: {what} ({ast.unparse(node)[:40]}) depends on the "
                        "score and has no derivative autoflash can take: write it with + - * /, torch.where, "
                        "minimum, maximum, abs, exp, log, tanh or sigmoid")

    def __call__(self, node):
        if isinstance(node, ast.Name):
            if node.id in self.assigned:  # (the score too, once the mod assigns it)
                return ast.Name(f"_d_{node.id}", ast.Load()) if self.assigned[node.id] else None
            return ast.Constant(1.0) if node.id == self.score else None
        if isinstance(node, (ast.Constant, ast.Compare)):
            return None  # (a comparison is constant where it is differentiable)
        if isinstance(node, ast.Subscript):
            if self(node.slice) is not None:
                self.refuse(node, "a capture's index")
            return None
        if isinstance(node, ast.UnaryOp):
            d = self(node.operand)
            if isinstance(node.op, ast.USub):
                return _neg(d)
            if isinstance(node.op, ast.UAdd) or d is None:
                return d
            self.refuse(node, type(node.op).__name__)
        if isinstance(node, ast.BinOp):
            return self.binary(node)
        return self.call(node)

    def binary(self, node):
        a, b = node.left, node.right
        da, db = self(a), self(b)
        if da is None and db is None:
            return None
        if isinstance(node.op, ast.Add):
            return _add(da, db)
        if isinstance(node.op, ast.Sub):
            return _add(da, _neg(db))
        if isinstance(node.op, ast.Mult):
            return _add(_mul(da, b), _mul(a, db))
        if isinstance(node.op, ast.Div):  # (a / b)' = a' / b - a b' / b²
            quotient = None if da is None else ast.BinOp(da, ast.Div(), b)
            return _add(quotient, None if db is None else _neg(
                ast.BinOp(_mul(a, db), ast.Div(), ast.BinOp(b, ast.Mult(), b))))
        self.refuse(node, type(node.op).__name__)

    def call(self, node):
        function, args = node.func.attr, node.args
        if function == "where":
            da, db = self(args[1]), self(args[2])
            if da is None and db is None:
                return None
            return _torch("where", args[0], da or ast.Constant(0.0), db or ast.Constant(0.0))
        d = self(args[0])
        if function in ("minimum", "maximum"):
            db = self(args[1])
            if d is None and db is None:
                return None
            first = ast.Compare(args[0], [ast.LtE() if function == "minimum" else ast.GtE()], [args[1]])
            return _torch("where", first, d or ast.Constant(0.0), db or ast.Constant(0.0))
        if d is None:
            return None
        if function == "abs":
            return _torch("where", ast.Compare(args[0], [ast.GtE()], [ast.Constant(0.0)]), d, _neg(d))
        if function == "log":
            return ast.BinOp(d, ast.Div(), args[0])
        outer = {"exp": node,  # exp(a)' = exp(a) a'; tanh(a)' = 1 - tanh(a)²; sigmoid(a)' = sigmoid(a) (1 - sigmoid(a))
                 "tanh": ast.BinOp(ast.Constant(1.0), ast.Sub(), ast.BinOp(node, ast.Mult(), node)),
                 "sigmoid": ast.BinOp(node, ast.Mult(), ast.BinOp(ast.Constant(1.0), ast.Sub(), node))}[function]
        return _mul(outer, d)

"""autoflash's forward and backward as PyTorch custom ops, so that torch.compile traces `autoflash.attention`
without a graph break: `torch.ops.autoflash.attention_forward(q, k, v, causal, softmax_scale, deterministic,
window_left, window_right, softcap, alibi_slopes) -> (out, lse)` (the variants' arguments checked by attention), its
autograd formula `torch.ops.autoflash.attention_backward(...) -> (dq, dk, dv)`, and fake
implementations of both that give every output's shape, dtype and strides from symbolic shapes alone (so one
graph serves every sequence length).

Why `torch.library.custom_op` and not `triton_op`/`wrap_triton`: the graph keeps one opaque call whose kernel is
autoflash's own launch path (api.py's plan cache, then launch.py's compiled launch), chosen at run time for each
call signature. With `wrap_triton`, Inductor would generate the launch of whatever variant was chosen at trace
time and keep it for every shape the graph is later run with (a tuned variant is per problem, and a dynamic graph
serves many), and it would launch through Triton's per-call argument binding, the 31-62 µs per call that
launch.py avoids. What custom_op costs is its dispatcher, on every call of an op: that is why eager
`autoflash.attention` never goes through it; `attention` calls the op only while torch.compile traces it
(`torch.compiler.is_compiling()`, ~0.1 µs in eager).

Importing autoflash registers the ops (autoflash/__init__.py imports this module): they exist before any trace.
"""

import torch

from autoflash import api


@torch.library.custom_op("autoflash::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, softmax_scale: float | None,
                      deterministic: bool, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                      alibi_slopes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of autoflash.attention(q, k, v, ..., return_lse=True); q, k, v of last stride 1."""
    return api.attention_forward(q, k, v, causal, softmax_scale, deterministic, (window_left, window_right), softcap,
                                 alibi_slopes)


@attention_forward.register_fake
def _(q, k, v, causal, softmax_scale, deterministic, window_left=-1, window_right=-1, softcap=0.0, alibi_slopes=None):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("autoflash::attention_backward", mutates_args=())
def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                       lse: torch.Tensor, dlse: torch.Tensor | None, causal: bool, softmax_scale: float | None,
                       deterministic: bool, window_left: int = -1, window_right: int = -1, softcap: float = 0.0,
                       alibi_slopes: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of the attention_forward call that returned out and lse; dlse None when lse was unused."""
    return api.attention_backward(dout, q, k, v, out, lse, dlse, causal, softmax_scale, deterministic,
                                  (window_left, window_right), softcap, alibi_slopes)


@attention_backward.register_fake
def _(dout, q, k, v, out, lse, dlse, causal, softmax_scale, deterministic, window_left=-1, window_right=-1,
      softcap=0.0, alibi_slopes=None):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(ctx, inputs, output):
    q, k, v, *ctx.flags, alibi_slopes = inputs  # flags: causal ... softcap, as attention_backward takes them
    ctx.save_for_backward(q, k, v, *output, alibi_slopes)
    ctx.set_materialize_grads(False)  # an unused output's gradient arrives as None: no dlse of zeros to read


def _backward(ctx, dout, dlse):
    q, k, v, out, lse, alibi_slopes = ctx.saved_tensors
    dout = torch.zeros_like(out) if dout is None else dout
    grads = attention_backward(dout, q, k, v, out, lse, dlse, *ctx.flags, alibi_slopes)
    return *grads, *(None for _ in ctx.flags), None


attention_forward.register_autograd(_backward, setup_context=_setup_context)

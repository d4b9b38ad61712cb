"""The fused paths as PyTorch custom operators: torch.export, torch.compile and torch.func see one op.

``vitzoo::linear_attention(q, k, v, feature_map, eps, impl, chunk, use_kernel) -> (out, S, z)`` runs
the chunked torch path (``impl="torch"``, torch_linear.py) or the Triton kernels (``impl="triton"``);
S (B*H, F, Dv) and z (B*H, F) are the state, saved for backward, not differentiable. Around it:

- a fake implementation (shapes and dtypes only), so tracers and compilers never run the kernels;
- autograd with the analytic backward, itself the op ``vitzoo::linear_attention_backward``; under
  ``create_graph=True`` (a gradient penalty, ``torch.func.grad``) backward differentiates the naive
  formula instead (``_eager_grads``): same values, the naive formula's memory;
- vmap: the mapped dim is folded into the batch, so one call serves every sample.

``fused_linear`` is the entry the paths call: the op behind an autograd Function sharing that formula,
as torch.func does not take a custom op's registered autograd. Plain eager calls on plain tensors (``_direct``) run
the op's body without its dispatch, about half of a small call's cost; whatever traces, transforms or overrides the
op gets the op.
"""

from __future__ import annotations

import inspect
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .dtypes import sum_dtype
from .feature_maps import FUSED_MAPS
from .naive import naive_linear_attention
from .torch_linear import torch_backward, torch_forward

__all__ = ["fused_linear"]  # the registered ops themselves: torch.ops.vitzoo.linear_attention(_backward)


@torch.library.custom_op("vitzoo::linear_attention", mutates_args=())
def linear_attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature_map: str,
    eps: float,
    impl: str,
    chunk: Optional[int],
    use_kernel: Optional[bool],
) -> Tuple[Tensor, Tensor, Tensor]:
    """(out, S, z) of non-causal kernel attention on (B, H, N, D) tensors by the ``impl`` path (``chunk`` and
    ``use_kernel`` are the torch path's options)."""
    return _path_forward(q, k, v, feature_map, eps, impl, chunk, use_kernel)


def _path_forward(q, k, v, feature_map, eps, impl, chunk, use_kernel):
    """The body of ``linear_attention_op``."""
    if impl == "triton":
        from .triton_linear import triton_forward  # triton is imported only when asked for

        return triton_forward(q, k, v, feature_map, eps)
    return torch_forward(q, k, v, feature_map, eps, chunk, use_kernel)


@linear_attention_op.register_fake
def _(q, k, v, feature_map, eps, impl, chunk, use_kernel):
    width, wide = q.shape[-1] + FUSED_MAPS[feature_map].extra, sum_dtype(q.dtype)
    bh = q.shape[0] * q.shape[1]
    return (
        v.new_empty(q.shape[:3] + v.shape[3:]),
        q.new_empty(bh, width, v.shape[-1], dtype=wide),
        q.new_empty(bh, width, dtype=wide),
    )


@torch.library.custom_op("vitzoo::linear_attention_backward", mutates_args=())
def linear_attention_backward_op(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    S: Tensor,
    z: Tensor,
    feature_map: str,
    eps: float,
    impl: str,
    chunk: Optional[int],
    use_kernel: Optional[bool],
    needs: List[bool],
) -> Tuple[Tensor, Tensor, Tensor]:
    """(dq, dk, dv), contiguous; an empty tensor for each input whose ``needs`` is False."""
    grads = _path_backward(dout, q, k, v, S, z, feature_map, eps, impl, chunk, use_kernel, needs)
    dq, dk, dv = (g if g is not None else x.new_empty(0) for g, x in zip(grads, (q, k, v)))
    return dq, dk, dv


def _path_backward(dout, q, k, v, S, z, feature_map, eps, impl, chunk, use_kernel, needs):
    """The body of ``linear_attention_backward_op``, None for each input whose ``needs`` is False."""
    if impl == "triton":
        from .triton_linear import triton_backward

        return triton_backward(dout, q, k, v, S, z, feature_map, eps, needs)
    return torch_backward(dout, q, k, v, S, z, feature_map, eps, chunk, use_kernel, needs)


@linear_attention_backward_op.register_fake
def _(dout, q, k, v, S, z, feature_map, eps, impl, chunk, use_kernel, needs):
    return tuple(
        torch.empty_like(x, memory_format=torch.contiguous_format) if need else x.new_empty(0)
        for x, need in zip((q, k, v), needs)
    )


def _eager_grads(q, k, v, dout, feature_map: str, eps: float, needs: Sequence[bool]):
    """(dq, dk, dv) of the naive formula at (q, k, v) for ``dout``, recorded for a further backward
    (None where ``needs`` is False). Called from backward with grad mode on."""
    q, k, v = (x.view_as(x) for x in (q, k, v))  # one node per role: q, k, v may be one tensor (self-attention)
    out = naive_linear_attention(q, k, v, feature_map, eps)
    wanted = [x for x, need in zip((q, k, v), needs) if need]
    found = iter(torch.autograd.grad(out, wanted, dout, create_graph=True, allow_unused=True))
    return tuple(next(found) if need else None for need in needs)


_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


def _plain(x: Tensor) -> bool:
    """A dense tensor with its own storage: no subclass (FakeTensor, DTensor, any __torch_dispatch__ wrapper), no meta
    tensor (the op's fake impl serves those), no legacy-vmap batch (autograd.grad(is_grads_batched=True)), no
    functorch or functionalization wrapper."""
    return (
        type(x) in _PLAIN_TYPES
        and not x.is_meta
        and not torch._C._functorch.is_legacy_batchedtensor(x)
        and not torch._C._functorch.is_functorch_wrapped_tensor(x)
        and not torch._is_functional_tensor(x)
    )


def _only_ours(op) -> bool:
    """Whether the op has only vitzoo's own kernel: where a user registered a kernel, an autocast rule or a dispatch
    rule for it (torch.library.register_kernel / register_autocast / register_torch_dispatch) the op runs them."""
    return (
        len(getattr(op, "_backend_fns", ())) <= 1
        and not getattr(op, "_autocast_dtype", None)
        and not getattr(op, "_torch_dispatch_fns", None)
        and not getattr(op, "_disabled_kernel", None)
    )


def _direct(*tensors: Tensor) -> bool:
    """Whether a call may run its path's function itself instead of the op: plain tensors (``_plain``) in eager mode,
    outside every compiler, tracer (jit and ONNX tracing included: a trace would hold the result as a constant),
    functorch transform, forward-AD level, dispatch or function mode and the profiler, with no registration of a
    user's on the op (all of which see or run the op). Not seen by the profiler's execution-trace observer, which
    records the path's own ops instead. The same function runs either way; the op's dispatch costs ~30 us a call on
    warm cores, ~120 us after other work (2-core VM), against ~450 us for a whole 1,024-token forward."""
    return not (
        torch.compiler.is_compiling()
        or torch.jit.is_tracing()
        or torch.autograd.forward_ad._current_level >= 0  # dual tensors: the op refuses forward AD, never drops it
        or torch._C._functorch.peek_interpreter_stack() is not None
        or torch._C._len_torch_dispatch_stack()
        or torch.overrides.has_torch_function(tensors)
        or torch.autograd._profiler_enabled()
        or not all(_plain(x) for x in tensors)
        or not (_only_ours(linear_attention_op) and _only_ours(linear_attention_backward_op))
    )


def _in_graph(x: Tensor) -> bool:
    """Whether x carries a graph a further backward could follow (x.requires_grad alone also holds for the inputs of a
    torch.func transform that has ended: torch.func.vjp's, jacrev's)."""
    return x.view_as(x).requires_grad


def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    _, S, z = output
    ctx.mark_non_differentiable(S, z)
    ctx.save_for_backward(q, k, v, S, z)  # the inputs and the state: features are recomputed
    ctx.options = options  # feature_map, eps, impl, chunk, use_kernel


def _backward(ctx, dout, _dS, _dz):
    q, k, v, S, z = ctx.saved_tensors
    needs = list(ctx.needs_input_grad[:3])
    if torch.is_grad_enabled() and any(_in_graph(x) for x in (q, k, v, dout)):  # create_graph=True: differentiable
        grads = _eager_grads(q, k, v, dout, *ctx.options[:2], needs)
    elif _direct(dout, q, k, v):
        grads = _path_backward(dout, q, k, v, S, z, *ctx.options, needs)
    else:
        found = linear_attention_backward_op(dout, q, k, v, S, z, *ctx.options, needs)
        grads = tuple(g if need else None for g, need in zip(found, needs))
    return (*grads, *[None] * len(ctx.options))


linear_attention_op.register_autograd(_backward, setup_context=_setup_context)


class _LinearAttentionFn(torch.autograd.Function):
    """The op with the same autograd formula as a Function: torch.func (grad, vjp, vmap of them) takes
    Functions with ``setup_context``, not a custom op's registered autograd."""

    generate_vmap_rule = True  # from the ops' vmap rules
    setup_context = staticmethod(_setup_context)
    backward = staticmethod(_backward)

    @staticmethod
    def forward(q, k, v, feature_map, eps, impl, chunk, use_kernel):
        op = _path_forward if _direct(q, k, v) else linear_attention_op
        return op(q, k, v, feature_map, eps, impl, chunk, use_kernel)


# apply() binds a Function's arguments through inspect.signature(forward) on every call when setup_context is defined;
# a signature computed once is read back instead (~35 us less per call, a fifth of a 1,024-token forward on 2 cores)
_LinearAttentionFn.forward.__signature__ = inspect.signature(_LinearAttentionFn.forward)  # type: ignore[attr-defined]


def fused_linear(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    feature_map: str,
    eps: float,
    impl: str,
    chunk: Optional[int] = None,
    use_kernel: Optional[bool] = None,
) -> Tensor:
    """The output of ``vitzoo::linear_attention`` with autograd for every front end (autograd, torch.func,
    torch.compile, torch.export); with no gradient to record, plain eager calls run the path's function alone."""
    if not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)) and _direct(q, k, v):
        return _path_forward(q, k, v, feature_map, eps, impl, chunk, use_kernel)[0]
    return _LinearAttentionFn.apply(q, k, v, feature_map, eps, impl, chunk, use_kernel)[0]


def _folding_vmap(num_tensors: int):
    """A vmap rule: the first ``num_tensors`` arguments, (V, B, ...) or unmapped, run as one (V*B, ...) call;
    outputs come back mapped on dim 0 (the backward's empty placeholders unmapped)."""
    op = linear_attention_op if num_tensors == 3 else linear_attention_backward_op

    def rule(info, in_dims, *args):
        def fold(x, dim):
            x = x.movedim(dim, 0) if dim is not None else x.expand(info.batch_size, *x.shape)
            return x.flatten(0, 1)

        tensors = [fold(x, dim) for x, dim in zip(args[:num_tensors], in_dims)]
        outputs = op(*tensors, *args[num_tensors:])
        mapped = args[-1] if op is linear_attention_backward_op else (True,) * 3
        return (
            tuple(t.unflatten(0, (info.batch_size, -1)) if m else t for t, m in zip(outputs, mapped)),
            tuple(0 if m else None for m in mapped),
        )

    return rule


torch.library.register_vmap(linear_attention_op, _folding_vmap(3))
torch.library.register_vmap(linear_attention_backward_op, _folding_vmap(6))

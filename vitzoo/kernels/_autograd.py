"""The autograd plumbing the fused paths share: ``FusedLinearFunction``, beside their kernels.

- Under ``create_graph=True`` (a gradient penalty, a Hessian-vector product, ``torch.func.grad``)
  backward differentiates the naive formula (``eager_grads``, naive.py): the fused analytic backward is not
  itself differentiable. Same values, the eager formula's memory.
- ``torch.vmap`` folds the mapped dim into the batch, so one call serves every sample (per-sample
  gradients: ``vmap(grad(...))``).
"""
from __future__ import annotations

from typing import Sequence

import torch

from .naive import naive_linear_attention

__all__ = ["FusedLinearFunction", "eager_grads"]


def eager_grads(q, k, v, dout, feature_map: str, eps: float, needs: Sequence[bool]):
    """(dq, dk, dv) of the eager formula at (q, k, v) for ``dout``, recorded for a further backward
    (None where ``needs`` is False). Called from ``backward`` with grad mode on."""
    q, k, v = (x.view_as(x) for x in (q, k, v))  # one node per role: q, k, v may be one tensor (self-attention)
    out = naive_linear_attention(q, k, v, feature_map, eps)
    wanted = [x for x, need in zip((q, k, v), needs) if need]
    found = iter(torch.autograd.grad(out, wanted, dout, create_graph=True, allow_unused=True))
    return tuple(next(found) if need else None for need in needs)


class FusedLinearFunction(torch.autograd.Function):
    """Base of a fused path: ``forward(q, k, v, feature_map, eps, *options) -> (out, S, z)`` on (B, H, N, D)
    tensors (S, z: the state, B*H first, not differentiable) and ``fused_backward(ctx, dout, q, k, v, S, z,
    needs) -> (dq, dk, dv)``; ``ctx.feature_map``, ``ctx.eps`` and ``ctx.options`` hold the other inputs."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, feature_map, eps, *options = inputs
        _, S, z = output
        ctx.mark_non_differentiable(S, z)
        ctx.save_for_backward(q, k, v, S, z)  # the inputs and the state: features are recomputed
        ctx.feature_map, ctx.eps, ctx.options = feature_map, eps, options

    @classmethod
    def vmap(cls, info, in_dims, q, k, v, *options):
        """(V, B, ...) inputs run as one (V*B, ...) call; outputs come back mapped on dim 0."""
        def fold(x, dim):
            x = x.movedim(dim, 0) if dim is not None else x.expand(info.batch_size, *x.shape)
            return x.flatten(0, 1)

        outputs = cls.apply(*(fold(x, dim) for x, dim in zip((q, k, v), in_dims)), *options)
        return tuple(t.unflatten(0, (info.batch_size, -1)) for t in outputs), (0,) * len(outputs)

    @classmethod
    def backward(cls, ctx, dout, _dS, _dz):
        q, k, v, S, z = ctx.saved_tensors
        needs = ctx.needs_input_grad[:3]
        if torch.is_grad_enabled():  # create_graph=True: a differentiable backward
            grads = eager_grads(q, k, v, dout, ctx.feature_map, ctx.eps, needs)
        else:
            grads = cls.fused_backward(ctx, dout, q, k, v, S, z, needs)
        return (*grads, *[None] * (2 + len(ctx.options)))

    @staticmethod
    def fused_backward(ctx, dout, q, k, v, S, z, needs):
        raise NotImplementedError

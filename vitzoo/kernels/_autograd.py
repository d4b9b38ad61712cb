"""What the fused paths' autograd Functions share beyond their kernels.

- ``eager_grads``: the fused paths' analytic backward is not itself differentiable; under
  ``create_graph=True`` (a gradient penalty, a Hessian-vector product, ``torch.func.grad``) their
  backward differentiates the eager formula instead: the same values, the eager formula's memory.
- ``vmap_by_folding``: ``torch.vmap`` over a fused Function folds the mapped dim into the batch, so
  one call serves every sample (per-sample gradients: ``vmap(grad(...))``).
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["eager_grads", "vmap_by_folding"]


def eager_grads(q, k, v, dout, feature_map: str, eps: float, needs: Sequence[bool]):
    """(dq, dk, dv) of the eager formula at (q, k, v) for ``dout``, recorded for a further backward
    (None where ``needs`` is False). Called from ``backward`` with grad mode on."""
    from vitzoo.attention.functional import linear_attention

    q, k, v = (x.view_as(x) for x in (q, k, v))  # one node per role: q, k, v may be one tensor (self-attention)
    out = linear_attention(q, k, v, feature_map, eps, impl="eager")
    wanted = [x for x, need in zip((q, k, v), needs) if need]
    found = iter(torch.autograd.grad(out, wanted, dout, create_graph=True, allow_unused=True))
    return tuple(next(found) if need else None for need in needs)


def vmap_by_folding(function, info, in_dims, q, k, v, *options):
    """The ``vmap`` rule of a Function taking (q, k, v, *options) of shape (B, H, N, D) and returning
    tensors with B*H or B first: (V, B, ...) inputs run as (V*B, ...); outputs come back mapped on dim 0."""
    def fold(x, dim):
        x = x.movedim(dim, 0) if dim is not None else x.expand(info.batch_size, *x.shape)
        return x.flatten(0, 1)

    outputs = function.apply(*(fold(x, dim) for x, dim in zip((q, k, v), in_dims)), *options)
    return tuple(t.unflatten(0, (info.batch_size, -1)) for t in outputs), (0,) * len(outputs)

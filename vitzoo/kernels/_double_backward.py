"""Gradients with a graph for the fused paths' backward under ``create_graph=True``.

The fused paths' analytic backward is not itself differentiable; a second derivative (a gradient
penalty, a Hessian-vector product) differentiates the eager formula instead: the same values, the
eager formula's memory.
"""
from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["eager_grads"]


def eager_grads(q, k, v, dout, feature_map: str, eps: float, needs: Sequence[bool]):
    """(dq, dk, dv) of the eager formula at (q, k, v) for ``dout``, recorded for a further backward
    (None where ``needs`` is False). Called from ``backward`` with grad mode on."""
    from vitzoo.attention.functional import linear_attention

    q, k, v = (x.view_as(x) for x in (q, k, v))  # one node per role: q, k, v may be one tensor (self-attention)
    out = linear_attention(q, k, v, feature_map, eps, impl="eager")
    wanted = [x for x, need in zip((q, k, v), needs) if need]
    found = iter(torch.autograd.grad(out, wanted, dout, create_graph=True, allow_unused=True))
    return tuple(next(found) if need else None for need in needs)

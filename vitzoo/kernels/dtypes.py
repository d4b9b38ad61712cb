"""The dtype every linear-attention path sums in (fused paths, their fake implementations, the naive formula)."""

from __future__ import annotations

import torch

__all__ = ["sum_dtype"]


def sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for fp32 / bf16 / fp16 inputs, fp64 for fp64 ones (gradcheck)."""
    return torch.promote_types(dtype, torch.float32)

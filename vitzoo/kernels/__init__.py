"""Fused non-causal kernel (linear) attention: Triton kernels on CUDA, a chunked torch path elsewhere.

``fused_linear_attention`` is what ``vitzoo.attention.functional.linear_attention`` calls for
``impl`` in auto | torch | triton; the plain formula is ``naive.naive_linear_attention``, the
reference every path is tested against. ``auto`` takes Triton for CUDA tensors when triton imports
and the feature map and head dims are ones the kernels serve (the maps with a kernel number in
``feature_maps.KERNEL_MAPS``), the torch path otherwise (e.g. ``taylor`` on CUDA). The feature maps
by name are the table of ``feature_maps``; this package imports nothing else of vitzoo, and its
modules import one way: this entry -> ops -> the paths -> feature_maps, dtypes, availability.
"""

from __future__ import annotations

from typing import Optional

import torch

from .availability import triton_available, triton_interpreting
from . import feature_maps as _maps
from .dtypes import sum_dtype
from .feature_maps import FUSED_MAPS, KERNEL_MAPS, mask_keys
from .naive import naive_linear_attention
from .ops import fused_linear
from .torch_linear import check_inputs

__all__ = [
    "fused_linear_attention",
    "naive_linear_attention",
    "check_key_mask",
    "mask_keys",
    "triton_available",
    "triton_interpreting",
    "FUSED_IMPLS",
    "FUSED_MAPS",
    "KERNEL_MAPS",
]

FUSED_IMPLS = ("auto", "torch", "triton")


def _triton_refusal(q: torch.Tensor, v: torch.Tensor, feature_map: str) -> Optional[str]:
    """Why the Triton path cannot serve these inputs (None when it can)."""
    if not triton_available():
        return "triton is not installed (pip install triton)"
    if not q.is_cuda and not triton_interpreting():
        return f"the Triton kernels need CUDA tensors, got {q.device.type} ones (move q, k, v to a CUDA device)"
    from .triton_linear import MAX_FEATURE_DIM, MAX_HEAD_DIM

    if feature_map not in KERNEL_MAPS:
        return f"the Triton kernels serve feature_map in {sorted(KERNEL_MAPS)}, not {feature_map!r}"
    if q.shape[-1] > MAX_FEATURE_DIM or v.shape[-1] > MAX_HEAD_DIM:
        return (
            f"the Triton kernels serve q, k up to {MAX_FEATURE_DIM} and v up to {MAX_HEAD_DIM} channels, "
            f"got {q.shape[-1]} and {v.shape[-1]}"
        )
    if q.dtype == torch.float64:
        return "the Triton kernels take fp32, bf16 or fp16 inputs, not fp64"
    return None


def check_key_mask(key_mask: Optional[torch.Tensor], k: torch.Tensor) -> None:
    """A ``key_mask`` is None or a bool tensor broadcasting to k's (B, H, Nk), else a ValueError naming the fix."""
    if key_mask is None:
        return
    B, H, N = k.shape[:3]
    fits = key_mask.dim() == 3 and all(s in (1, t) for s, t in zip(key_mask.shape[:2], (B, H)))
    if key_mask.dtype != torch.bool or not fits or key_mask.shape[-1] != N:
        raise ValueError(
            f"key_mask must be a bool (B or 1, H or 1, Nk) tensor (True = the key counts) for k of shape "
            f"{tuple(k.shape)}, got {key_mask.dtype} {tuple(key_mask.shape)}"
        )


def fused_linear_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    feature_map: str = "elu",
    eps: float = 1e-6,
    impl: str = "auto",
    chunk: Optional[int] = None,
    use_kernel: Optional[bool] = None,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """out = phi(q) S / (phi(q).z + eps), S = sum_j phi(k_j)^T v_j, z = sum_j phi(k_j); non-causal.

    q, k: (B, H, N, D), v: (B, H, N, Dv) -> (B, H, N, Dv) in v's dtype, sums in fp32. ``impl``:
    ``triton`` (CUDA; CPU only under TRITON_INTERPRET=1), ``torch`` (the chunked path) or ``auto``
    (Triton where it serves the inputs). The torch path's options: ``chunk`` tokens per step (None =
    automatic: ~1 MiB buffers of all slices in torch ops, 256 rows of each slice in the CPU kernel) and
    ``use_kernel`` (None: the compiled CPU kernel where it serves the inputs, float32 / float64 CPU
    tensors and a map of ``KERNEL_MAPS``, torch ops otherwise; True insists on the kernel, False on torch
    ops); a call that runs the Triton kernels refuses them rather than ignore them. Empty inputs (no tokens,
    heads or channels) take the torch path whatever ``impl``; with no keys the output is zeros (S = 0, z = 0).
    ``key_mask`` (bool (B or 1, H or 1, Nk), True = the key counts): the other keys are set to the map's
    ``zero_input`` (elu: -inf, relu and identity: 0), whose feature and derivative are 0, so every kernel runs its own
    map unchanged; for a map without one (taylor) the features are computed first (fp32 or wider), those of the other
    keys zeroed (``mask_keys``), and the kernels run them through ``identity``.
    """
    if impl not in FUSED_IMPLS:
        hint = (
            " (the eager formula is vitzoo.attention.functional.linear_attention(impl='eager'))"
            if impl == "eager"
            else ""
        )
        raise ValueError(f"unknown impl {impl!r}; choose one of {list(FUSED_IMPLS)}{hint}")
    phi = _maps.feature_map(feature_map)  # an unknown name: a ValueError listing the valid ones
    check_inputs(q, k, v)
    check_key_mask(key_mask, k)
    if key_mask is not None:
        zero = _maps.FUSED_MAPS[feature_map].zero_input
        if zero is None:
            wide = sum_dtype(q.dtype)
            fq, fk = phi(q.to(wide)), mask_keys(phi(k.to(wide)), key_mask)
            return fused_linear_attention(fq, fk, v.to(wide), "identity", eps, impl, chunk, use_kernel).to(v.dtype)
        k = torch.where(key_mask.unsqueeze(-1), k, k.new_full((), zero))  # a select: a padded key's own value is gone
    if chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1):
        raise ValueError(f"chunk must be a positive int number of tokens (or None for automatic), got {chunk!r}")
    if impl != "torch" and q.numel() and k.numel() and v.numel():  # empty inputs: nothing to launch
        refusal = _triton_refusal(q, v, feature_map)
        if refusal is None and (impl == "triton" or q.is_cuda):
            options = [name for name, value in (("chunk", chunk), ("use_kernel", use_kernel)) if value is not None]
            if options:
                raise ValueError(
                    f"the torch path's {' and '.join(options)} would be ignored: impl={impl!r} runs the "
                    "Triton kernels for these inputs; pass impl='torch' to use them, or leave them None"
                )
            return fused_linear(q, k, v, feature_map, eps, "triton")
        if impl == "triton":
            raise ValueError(f"impl='triton' cannot run here: {refusal}; use impl='torch' or 'auto'")
    return fused_linear(q, k, v, feature_map, eps, "torch", chunk, use_kernel)

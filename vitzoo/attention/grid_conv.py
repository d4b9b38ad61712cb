"""DWC(V): the depthwise convolution over the patch grid that focused linear and agent attention add to V."""

from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.nn as nn

from ..options import is_count
from .functional import mask_keys

__all__ = ["GridDepthwiseConv", "grid_conv"]


class GridDepthwiseConv(nn.Conv2d):
    """A ``kernel_size`` depthwise conv (zero padding, grid size kept) over the grid tokens of (B, H, N, D) values.

    Prefix (class / register) tokens are not on the grid: the conv never sees them and their rows are 0. Tokens whose
    ``key_mask`` (bool (B or 1, H or 1, N)) is False are seen as 0 (padding), as the zero border of an image alone.
    """

    def __init__(self, channels: int, kernel_size: int, device=None, dtype=None):
        super().__init__(
            channels, channels, kernel_size, padding=kernel_size // 2, groups=channels, device=device, dtype=dtype
        )

    def over_grid(
        self, v: torch.Tensor, grid: Tuple[int, int], num_prefix: int, key_mask: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        B, H, N, D = v.shape
        v = mask_keys(v, key_mask)
        # -1 for the batch: a batch of windows (B * windows) stays dynamic in the TorchScript ONNX exporter
        out = self(v[:, :, num_prefix:].transpose(-2, -1).reshape(-1, H * D, *grid))
        out = out.reshape(-1, H, D, N - num_prefix).transpose(-2, -1)
        return torch.cat([v.new_zeros(B, H, num_prefix, D), out], dim=2) if num_prefix else out


def grid_conv(mechanism: str, channels: int, kernel_size: int, **kwargs) -> Optional[GridDepthwiseConv]:
    """The DWC(V) term of ``mechanism``, or None for ``kernel_size`` 0 (a clear error for an even size)."""
    if not is_count(kernel_size, minimum=0) or (kernel_size and kernel_size % 2 == 0):
        raise ValueError(
            f"{mechanism}: kernel_size={kernel_size!r} must be odd (the conv keeps the grid) or 0 for no conv term"
        )
    return (
        GridDepthwiseConv(channels, int(kernel_size), kwargs.get("device"), kwargs.get("dtype"))
        if kernel_size
        else None
    )

"""Class probabilities for an image of any size: overlapping windows of the training size, averaged."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from timm.layers import to_2tuple

from .model import SegmentationNet

__all__ = ["window_starts", "sliding_window_probs"]


def window_starts(length: int, window: int, step: int) -> List[int]:
    """Starts of windows covering ``[0, length)``: every ``step``, the last one flush with the end."""
    if length <= window:
        return [0]
    return list(range(0, length - window, step)) + [length - window]


def _probs(net: SegmentationNet, crops: torch.Tensor, flip: bool) -> torch.Tensor:
    probs = net(crops).float().softmax(1)
    if flip:
        probs = (probs + net(crops.flip(-1)).float().softmax(1).flip(-1)) / 2
    return probs


def sliding_window_probs(
    net: SegmentationNet,
    image: torch.Tensor,
    window: Optional[Union[int, Sequence[int]]],
    overlap: float = 0.25,
    flip: bool = False,
    batch_size: int = 8,
) -> torch.Tensor:
    """(C, H, W) image in [0, 1] -> (num_classes, H, W) float32 probabilities.

    Windows of ``window`` (the training crop; None: the whole image) overlap by ``overlap`` of their size
    and their softmax outputs are averaged where they meet; ``flip`` adds the horizontally flipped view.
    An image smaller than a window (or not a multiple of the network's stride) is edge-padded for the
    forward pass and cropped back.
    """
    if not 0 <= overlap < 1:
        raise ValueError(f"overlap={overlap} must lie in [0, 1)")
    H, W = image.shape[-2:]
    stride = net.stride
    padded = [max(math.ceil(n / stride) * stride, 1) for n in (H, W)]
    size: Tuple[int, int] = tuple(padded) if window is None else to_2tuple(window)
    if size[0] % stride or size[1] % stride:
        raise ValueError(
            f"window {size[0]}x{size[1]} is not a multiple of the backbone stride {stride}; "
            f"use a multiple of {stride} (the training data.img_size is one)"
        )
    wh, ww = (min(w, p) if n < w else w for w, p, n in zip(size, padded, (H, W)))
    pad_h, pad_w = max(0, wh - H), max(0, ww - W)
    x = F.pad(image[None], (0, pad_w, 0, pad_h), mode="replicate") if pad_h or pad_w else image[None]
    Hp, Wp = x.shape[-2:]
    boxes = [
        (y, x0)
        for y in window_starts(Hp, wh, max(1, int(wh * (1 - overlap))))
        for x0 in window_starts(Wp, ww, max(1, int(ww * (1 - overlap))))
    ]
    total, count = None, torch.zeros(1, Hp, Wp, device=image.device)
    for i in range(0, len(boxes), batch_size):
        chunk = boxes[i : i + batch_size]
        probs = _probs(net, torch.cat([x[..., y : y + wh, x0 : x0 + ww] for y, x0 in chunk]), flip)
        if total is None:
            total = torch.zeros(probs.shape[1], Hp, Wp, device=image.device)
        for p, (y, x0) in zip(probs, chunk):
            total[:, y : y + wh, x0 : x0 + ww] += p
            count[:, y : y + wh, x0 : x0 + ww] += 1
    return (total / count)[:, :H, :W]

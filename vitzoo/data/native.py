"""Training at native resolution: each image keeps its own size and aspect, a batch is a list of images.

``native_transform`` scales an image down (never up) so that its longer side is at most ``max_side``, cuts each side
down to a multiple of ``multiple`` (the model's patch size; a centre crop) and normalises it; ``collate_native``
gathers a batch as (list of (C, h, w) images, labels). The ViT runs such a list as one padded, masked batch
(``vitzoo.models.variable_size``).
"""

from __future__ import annotations

from functools import partial
from typing import List, Sequence, Tuple

import albumentations as A
import cv2
import numpy as np
import torch

from .transforms import _finish

__all__ = ["fit_to_multiple", "native_transform", "collate_native"]


def fit_to_multiple(image: np.ndarray, max_side: int, multiple: int, **_) -> np.ndarray:
    """``image`` (HWC) scaled down to a longer side of at most ``max_side``, each side centre-cropped to a multiple
    of ``multiple`` (a side shorter than one multiple is scaled up to it)."""
    h, w = image.shape[:2]
    scale = min(1.0, max_side / max(h, w))
    size = [max(multiple, round(s * scale)) for s in (h, w)]
    if size != [h, w]:
        image = cv2.resize(image, (size[1], size[0]), interpolation=cv2.INTER_AREA)
    top, left = (size[0] % multiple) // 2, (size[1] % multiple) // 2
    return image[top : top + size[0] // multiple * multiple, left : left + size[1] // multiple * multiple]


def native_transform(
    max_side: int, multiple: int, mean: Sequence[float], std: Sequence[float], train: bool
) -> A.Compose:
    """HWC uint8 -> normalised CHW float tensor at the image's own size (``fit_to_multiple``); a horizontal flip with
    probability 1/2 when ``train``."""
    fit = A.Lambda(image=partial(fit_to_multiple, max_side=max_side, multiple=multiple), name="fit_to_multiple")
    flip = [A.HorizontalFlip(p=0.5)] if train else []
    return A.Compose([fit, *flip, *_finish(mean, std)], strict=True)


def collate_native(batch: Sequence[Tuple[torch.Tensor, int]]) -> Tuple[List[torch.Tensor], torch.Tensor]:
    """(list of images of their own sizes, labels (B,)): what ``model(images)`` takes as one padded batch."""
    return [image for image, _ in batch], torch.tensor([label for _, label in batch])

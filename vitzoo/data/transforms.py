"""albumentations pipelines (HWC uint8 -> normalised CHW float tensor) and DataLoader worker seeding.

Traps handled here: ``strict=True`` so a misspelt argument is an error, ``Normalize`` before
``ToTensorV2``, and :func:`seed_worker` re-seeds each worker's augmentation RNG (albumentations
keeps its own generator inside ``Compose``; forked workers would otherwise share one stream).
"""

from __future__ import annotations

import random
from typing import Optional, Sequence

import albumentations as A
import cv2
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2

from vitzoo.options import CifarAugOptions

__all__ = ["POLICIES", "build_train_transform", "build_eval_transform", "seed_worker"]

POLICIES = ("none", "basic", "strong")
CROP_PADDING, HFLIP = CifarAugOptions.crop_padding, CifarAugOptions.hflip  # benchmarks/data_path.py reads them


def _finish(mean: Sequence[float], std: Sequence[float]) -> list:
    return [A.Normalize(mean=tuple(mean), std=tuple(std), max_pixel_value=255.0), ToTensorV2()]


def build_eval_transform(img_size: int, mean: Sequence[float], std: Sequence[float]) -> A.Compose:
    """Resize to ``img_size`` square, normalise, to tensor."""
    return A.Compose([A.Resize(img_size, img_size), *_finish(mean, std)], strict=True)


def build_train_transform(
    img_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    *,
    policy: str = CifarAugOptions.policy,
    crop_padding: int = CROP_PADDING,
    hflip: bool = HFLIP,
    gauss_noise: float = CifarAugOptions.gauss_noise,
    gauss_noise_p: float = CifarAugOptions.gauss_noise_p,
    seed: Optional[int] = None,
) -> A.Compose:
    """Training pipeline.

    ``policy``: ``none`` (resize only), ``basic`` (random crop after zero padding of
    ``crop_padding`` px, optional horizontal flip) or ``strong`` (basic + affine jitter, colour
    jitter, one cut-out hole). ``gauss_noise`` > 0 adds Gaussian noise to a fraction
    ``gauss_noise_p`` of the images, its std drawn uniformly in [0, gauss_noise] (pixel units of
    a [0, 1] image); it runs before normalisation.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown augmentation policy {policy!r}; set data.aug.policy to one of {list(POLICIES)}")
    if not 0.0 <= gauss_noise <= 1.0:
        raise ValueError(f"data.aug.gauss_noise is a std in [0, 1] pixel units, got {gauss_noise}")
    steps = [A.Resize(img_size, img_size)]
    if policy != "none":
        if crop_padding > 0:
            size = img_size + 2 * crop_padding
            steps += [
                A.PadIfNeeded(size, size, border_mode=cv2.BORDER_CONSTANT, fill=0),
                A.RandomCrop(img_size, img_size),
            ]
        if hflip:
            steps.append(A.HorizontalFlip(p=0.5))
    if policy == "strong":
        steps += [
            A.Affine(scale=(0.9, 1.1), translate_percent=(-0.1, 0.1), rotate=(-15, 15), p=0.5),
            A.ColorJitter(brightness=0.3, contrast=0.3, saturation=0.3, hue=0.05, p=0.5),
            A.CoarseDropout(
                num_holes_range=(1, 1), hole_height_range=(0.1, 0.3), hole_width_range=(0.1, 0.3), fill=0, p=0.5
            ),
        ]
    if gauss_noise > 0:
        steps.append(A.GaussNoise(std_range=(0.0, gauss_noise), p=gauss_noise_p))
    return A.Compose([*steps, *_finish(mean, std)], strict=True, seed=seed)


def seed_worker(worker_id: int, rank: int = 0) -> None:
    """``worker_init_fn``: distinct, reproducible RNG streams per (rank, worker, epoch).

    ``torch.initial_seed()`` in a worker is the loader's base seed (drawn from the main
    process's torch RNG each epoch) plus the worker id; the rank is folded in so DDP processes
    seeded alike do not augment alike.
    """
    seed = (torch.initial_seed() + 1_000_003 * rank) % 2**32
    random.seed(seed)
    np.random.seed(seed)
    info = torch.utils.data.get_worker_info()
    transform = getattr(info.dataset, "transform", None) if info is not None else None
    if isinstance(transform, A.BaseCompose):
        transform.set_random_seed(seed)

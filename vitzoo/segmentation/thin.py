"""Thin-structure benchmark data: grayscale Voronoi cell walls of varying width on textured, noisy cells.

``python -m vitzoo.segmentation.thin DST --n 64 --size 512 --seed 0`` writes ``DST/image/<i>.png`` (8-bit
grayscale) and ``DST/label/<i>.png`` in ISBI-2012's convention, **0 = wall (the object), 255 = interior**, so
``--config-name segment`` reads it with ``data.mask_values='{0: 1, 255: 0}'`` (docs/segmentation.md).
Walls are dark and a few pixels wide (2-8 px, varying along each wall; ~10-25% of the pixels); the cells
carry smooth shading, grain, small dark vesicles and dark elongated "mitochondria" (distractors as dark as
the walls, which are faint in places); the image is blurred and noisy. Every image is drawn from
``(seed, index)``: the same arguments write the same files.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import cv2
import numpy as np
from PIL import Image

__all__ = ["thin_sample", "make_thin_dataset", "thin_data_options", "main"]

WALL, INTERIOR = 0, 255  # mask values: ISBI-2012's convention


def thin_data_options() -> Dict[str, Any]:
    """The ``SegmentationDataModule`` options that read a thin folder: two classes, interior (0) and wall (1, the
    object), from the mask values ``INTERIOR`` and ``WALL`` (what ``data.mask_values='{0: 1, 255: 0}'`` says in a
    config)."""
    return {"num_classes": 2, "class_names": ["interior", "wall"], "mask_values": {WALL: 1, INTERIOR: 0}}


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Noise in [-1, 1] varying over about ``size / cells`` pixels."""
    grid = rng.uniform(-1, 1, (cells + 1, cells + 1)).astype(np.float32)
    return cv2.resize(grid, (size, size), interpolation=cv2.INTER_CUBIC).clip(-1, 1)


def _bisector_distance(size: int, seeds: np.ndarray) -> np.ndarray:
    """Per pixel, the distance to the bisector of its two nearest seeds (0 on a Voronoi wall)."""
    yy, xx = np.mgrid[:size, :size].astype(np.float32)
    first = np.full((size, size), np.inf, np.float32)
    second, near, next_near = first.copy(), np.zeros((size, size), np.int64), np.zeros((size, size), np.int64)
    for i, (y, x) in enumerate(seeds.astype(np.float32)):  # squared distances to the nearest two seeds
        d = (yy - y) ** 2 + (xx - x) ** 2
        closer, between = d < first, (d >= first) & (d < second)
        second, next_near = (
            np.where(closer, first, np.where(between, d, second)),
            np.where(closer, near, np.where(between, i, next_near)),
        )
        first, near = np.where(closer, d, first), np.where(closer, i, near)
    gap = np.linalg.norm(seeds[near] - seeds[next_near], axis=-1).clip(min=1e-6)
    return (second - first) / (2 * gap)


def thin_sample(rng: np.random.Generator, size: int = 512) -> Tuple[np.ndarray, np.ndarray]:
    """(image (size, size) uint8, mask (size, size) uint8 with ``WALL`` / ``INTERIOR``)."""
    cells = max(4, round(rng.uniform(80, 200) * (size / 512) ** 2))
    seeds = rng.uniform(0, size, (cells, 2))
    width = rng.uniform(3.0, 6.0) * (1 + 0.35 * _smooth_noise(rng, size, 6))  # full wall width, varying
    wall = _bisector_distance(size, seeds) < width / 2
    interior = 150 + 25 * _smooth_noise(rng, size, 8) + 12 * _smooth_noise(rng, size, size // 8)
    wall_tone = rng.uniform(65, 95) + 35 * _smooth_noise(rng, size, 5)  # faint in places
    image = np.where(wall, wall_tone, interior).astype(np.float32)
    for y, x in rng.uniform(0, size, (int(rng.integers(cells, 3 * cells)), 2)):  # vesicles: small dark discs
        cv2.circle(image, (int(x), int(y)), int(rng.integers(2, 6)), float(rng.uniform(60, 110)), -1)
    for y, x in rng.uniform(0, size, (cells, 2)):  # mitochondria: dark, elongated, not walls
        axes = (int(rng.integers(6, 16)), int(rng.integers(2, 5)))
        cv2.ellipse(image, (int(x), int(y)), axes, float(rng.uniform(0, 180)), 0, 360, float(rng.uniform(55, 100)), -1)
    image = cv2.GaussianBlur(image, (0, 0), rng.uniform(0.6, 1.2))
    image += rng.normal(0, rng.uniform(14, 22), image.shape).astype(np.float32)
    return image.clip(0, 255).astype(np.uint8), np.where(wall, WALL, INTERIOR).astype(np.uint8)


def make_thin_dataset(root: Union[str, Path], n: int = 64, size: int = 512, seed: int = 0) -> Path:
    """Write ``n`` image/mask pairs of ``size`` x ``size`` under ``root`` (``image/``, ``label/``); returns root."""
    if n < 1 or size < 32:
        raise ValueError(f"--n {n} --size {size}: write at least 1 image of at least 32 px")
    root = Path(root)
    for folder in ("image", "label"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for i in range(n):
        image, mask = thin_sample(np.random.default_rng([seed, i]), size)
        Image.fromarray(image).save(root / "image" / f"{i:04d}.png")
        Image.fromarray(mask).save(root / "label" / f"{i:04d}.png")
    return root


def main(argv: Optional[Sequence[str]] = None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m vitzoo.segmentation.thin", description=__doc__.split("\n")[0])
    parser.add_argument("dst", help="output folder (image/ and label/ are written in it)")
    parser.add_argument("--n", type=int, default=64, help="images (default 64)")
    parser.add_argument("--size", type=int, default=512, help="side in pixels (default 512)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed writes the same images (default 0)")
    args = parser.parse_args(argv)
    root = make_thin_dataset(args.dst, args.n, args.size, args.seed)
    print(
        f"{args.n} images of {args.size}x{args.size} -> {root}/image, masks (0 = wall, 255 = interior) -> {root}/label"
    )
    return root


if __name__ == "__main__":
    main()

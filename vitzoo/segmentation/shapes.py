"""A generated shapes dataset (``images/`` + ``masks/``) for tests and demos of the segmentation path."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Optional, Sequence, Tuple, Type, Union

import numpy as np
from PIL import Image, ImageDraw

from vitzoo.options import DEFAULT, SHAPE_CLASSES, ShapesDataOptions

from .data import SegmentationDataModule

__all__ = ["SHAPE_CLASSES", "make_shapes_dataset", "ShapesDataModule"]

# Each shape class has a base colour, jittered per shape, so a few epochs suffice to learn it.
_COLOURS = np.array([(0, 0, 0), (200, 60, 60), (60, 190, 70), (70, 90, 210)])


def make_shapes_dataset(
    root: Union[str, Path], num_images: int = 64, size: Tuple[int, int] = (48, 96), max_shapes: int = 3, seed: int = 0
) -> Path:
    """Write ``num_images`` noisy images of random size in ``size`` (min, max) with up to
    ``max_shapes`` rectangles / ellipses / triangles and their class masks (PNG, values 0..3)."""
    root = Path(root)
    (root / "images").mkdir(parents=True, exist_ok=True)
    (root / "masks").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for i in range(num_images):
        w, h = (int(s) for s in rng.integers(size[0], size[1] + 1, size=2))
        image = Image.fromarray(_background(rng, h, w))
        mask = Image.new("L", (w, h), 0)
        for _ in range(int(rng.integers(1, max_shapes + 1))):
            cls = int(rng.integers(1, len(SHAPE_CLASSES)))
            colour = tuple(int(c) for c in np.clip(_COLOURS[cls] + rng.integers(-40, 41, 3), 0, 255))
            box = _box(rng, w, h)
            _draw(ImageDraw.Draw(image), cls, box, colour)
            _draw(ImageDraw.Draw(mask), cls, box, cls)
        image.save(root / "images" / f"{i:05d}.png")
        mask.save(root / "masks" / f"{i:05d}.png")
    return root


def _background(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    base = rng.integers(90, 170) + rng.integers(-15, 16, 3)
    noise = rng.normal(0, 12, (h, w, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)


def _box(rng: np.random.Generator, w: int, h: int) -> Tuple[int, int, int, int]:
    bw, bh = (int(rng.integers(s // 5, s // 2 + 1)) for s in (w, h))
    x0, y0 = int(rng.integers(0, w - bw)), int(rng.integers(0, h - bh))
    return x0, y0, x0 + bw, y0 + bh


def _draw(draw: ImageDraw.ImageDraw, cls: int, box: Tuple[int, int, int, int], fill) -> None:
    x0, y0, x1, y1 = box
    if cls == 1:
        draw.rectangle(box, fill=fill)
    elif cls == 2:
        draw.ellipse(box, fill=fill)
    else:
        draw.polygon([((x0 + x1) // 2, y0), (x0, y1), (x1, y1)], fill=fill)


class ShapesDataModule(SegmentationDataModule):
    """The shapes dataset under ``root`` as a data module (classes named ``SHAPE_CLASSES`` unless
    ``class_names`` renames them); ``prepare_data`` writes it when missing. An argument left out takes its value in
    :class:`~vitzoo.options.ShapesDataOptions` (``--config-name segment_shapes``'s schema)."""

    options: ClassVar[Type[ShapesDataOptions]] = ShapesDataOptions

    def __init__(
        self,
        root: str,
        num_images: int = DEFAULT,
        num_classes: int = DEFAULT,
        class_names: Optional[Sequence[str]] = DEFAULT,
        img_size: Union[int, Tuple[int, int]] = DEFAULT,
        seed: int = DEFAULT,
        **kwargs,
    ):
        num_images, num_classes, class_names, img_size, seed = self.resolve(
            num_images=num_images, num_classes=num_classes, class_names=class_names, img_size=img_size, seed=seed
        ).values()
        if num_classes != len(SHAPE_CLASSES):
            raise ValueError(
                f"the shapes dataset has {len(SHAPE_CLASSES)} classes {SHAPE_CLASSES}; "
                f"set data.num_classes={len(SHAPE_CLASSES)}"
            )
        super().__init__(root, num_classes=num_classes, class_names=class_names, img_size=img_size, seed=seed, **kwargs)
        self.num_images = num_images

    def prepare_data(self) -> None:
        if not (self.root / "images").is_dir():
            make_shapes_dataset(self.root, self.num_images, seed=self.seed)

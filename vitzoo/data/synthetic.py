"""Random images with random labels, for throughput runs and fast tests (nothing to learn)."""

from __future__ import annotations

import numpy as np

from vitzoo.options import SyntheticDataOptions

from .datamodule import DEFAULT, ImageDataModule

__all__ = ["SyntheticDataModule"]


class SyntheticDataModule(ImageDataModule):
    """``num_train`` / ``num_val`` uniform-noise uint8 images of ``img_size``, seeded by ``seed``."""

    options = SyntheticDataOptions

    def __init__(
        self,
        img_size: int = DEFAULT,
        num_classes: int = DEFAULT,
        num_train: int = DEFAULT,
        num_val: int = DEFAULT,
        seed: int = DEFAULT,
        **kwargs,
    ):
        super().__init__(img_size=img_size, **kwargs)
        num_classes, num_train, num_val, seed = self.resolve(
            num_classes=num_classes, num_train=num_train, num_val=num_val, seed=seed
        ).values()
        self.num_classes, self.num_train, self.num_val, self.seed = int(num_classes), num_train, num_val, seed

    def load_split(self, split: str):
        count = {"train": self.num_train, "val": self.num_val}[split]
        rng = np.random.default_rng([self.seed, split == "val"])
        images = rng.integers(0, 256, size=(count, self.img_size, self.img_size, self.in_chans), dtype=np.uint8)
        return images, rng.integers(0, self.num_classes, size=count)

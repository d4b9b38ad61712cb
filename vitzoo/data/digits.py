"""The embedded default data set: scikit-learn's handwritten digits (1,797 8x8 grey images).

The images ship inside scikit-learn's wheel, so this works offline with nothing to download.
They are scaled to uint8, given three equal channels and resized to ``img_size`` by the
transforms; the train/val split is stratified with a fixed seed.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from vitzoo.options import DigitsDataOptions

from .datamodule import DEFAULT, ImageDataModule

__all__ = ["DigitsDataModule", "digits_arrays"]

# Of the digits resized to 16x16 (bilinear), in [0, 1] units.
DIGITS_MEAN, DIGITS_STD = (0.305,) * 3, (0.319,) * 3


def digits_arrays() -> Tuple[np.ndarray, np.ndarray]:
    """All digits as (1797, 8, 8, 3) uint8 images and (1797,) int64 labels."""
    data = load_digits()
    grey = np.round(data.images * (255.0 / 16.0)).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=-1), data.target.astype(np.int64)


class DigitsDataModule(ImageDataModule):
    """Digits 0-9; ``val_fraction`` of them (stratified, ``split_seed``) form the val split."""

    num_classes = 10
    options = DigitsDataOptions

    def __init__(
        self,
        img_size: int = DEFAULT,
        val_fraction: float = DEFAULT,
        split_seed: int = DEFAULT,
        mean=DIGITS_MEAN,
        std=DIGITS_STD,
        **kwargs,
    ):
        val_fraction, split_seed = self.resolve(val_fraction=val_fraction, split_seed=split_seed).values()
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"data.val_fraction must be in (0, 1), got {val_fraction}")
        super().__init__(img_size=img_size, mean=mean, std=std, **kwargs)
        self.val_fraction, self.split_seed = val_fraction, split_seed
        self._splits = None

    def load_split(self, split: str):
        if self._splits is None:
            images, labels = digits_arrays()
            x_tr, x_va, y_tr, y_va = train_test_split(
                images, labels, test_size=self.val_fraction, stratify=labels, random_state=self.split_seed
            )
            self._splits = {"train": (x_tr, y_tr), "val": (x_va, y_va)}
        return self._splits[split]

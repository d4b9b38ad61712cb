"""Reading images (to float [0, 1], 1 or 3 channels) and masks (raw integer values) of a ``Sample``."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
from PIL import Image

from .files import Sample

__all__ = ["GRAY_MODES", "image_mode", "read_image", "read_mask", "write_mask"]

GRAY_MODES = ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "F")
_MASK_MODES = ("1", "L", "P", "I", "I;16", "I;16B", "I;16L")


def _open(path: Path, frame: Optional[int]) -> Image.Image:
    image = Image.open(path)
    if frame is not None:
        image.seek(frame)
    return image


def image_mode(sample: Sample) -> str:
    """The PIL mode of the sample's image (read from the header only)."""
    with _open(sample.image, sample.frame) as image:
        return image.mode


def _unit(array: np.ndarray, path: Path) -> np.ndarray:
    if array.dtype == np.uint8:
        return array.astype(np.float32) / 255
    if array.dtype.kind in "iu" and array.min() >= 0 and array.max() <= 65535:  # 16-bit (mode I;16 or I)
        return array.astype(np.float32) / 65535
    if array.dtype.kind == "f" and 0 <= array.min() and array.max() <= 1:
        return array.astype(np.float32)
    raise ValueError(
        f"{path} holds {array.dtype} values in [{array.min()}, {array.max()}]; save images as 8- or "
        f"16-bit (or float in [0, 1])"
    )


def read_image(sample: Sample, in_chans: int) -> np.ndarray:
    """(H, W, in_chans) float32 in [0, 1]. Grayscale images are replicated for ``in_chans=3``; colour images
    with ``in_chans=1`` are an error (converting them would discard colour without a word)."""
    with _open(sample.image, sample.frame) as image:
        if image.mode in GRAY_MODES:
            gray = image.convert("L") if image.mode in ("1", "LA") else image
            array = _unit(np.asarray(gray), sample.image)[..., None]
            return np.repeat(array, 3, axis=2) if in_chans == 3 else array
        if in_chans == 1:
            raise ValueError(
                f"{sample.image} is a colour image (mode {image.mode}) but data.in_chans=1; set "
                f"data.in_chans=3, or convert the images to grayscale first"
            )
        return _unit(np.asarray(image.convert("RGB")), sample.image)


def read_mask(sample: Sample) -> np.ndarray:
    """(H, W) int64 raw mask values (map them to classes with a ``LabelMap``)."""
    path = sample.mask
    with _open(path, sample.frame) as mask:
        if mask.mode not in _MASK_MODES:
            raise ValueError(
                f"{path} has mode {mask.mode}; masks must be single-channel images holding one "
                f"value per class (mode L, P or 16-bit), not colours"
            )
        return np.asarray(mask).astype(np.int64)


def write_mask(mask: np.ndarray, path: Path) -> None:
    """A PNG of integer values: 8-bit when they fit, else 16-bit."""
    dtype = np.uint8 if mask.max(initial=0) <= 255 else np.uint16
    Image.fromarray(mask.astype(dtype)).save(path)

"""Image files as arrays: what both data paths read (the albumentations loaders and the device cache)."""

from __future__ import annotations

import os
from typing import Sequence, Union

import cv2
import numpy as np

__all__ = ["Images", "read_rgb", "decode_rgb"]

Images = Union[np.ndarray, Sequence[str]]  # an (N, H, W, C) uint8 array or a list of image file paths


def read_rgb(path: Union[str, os.PathLike]) -> np.ndarray:
    """An image file as an HWC uint8 RGB array (grey images get three equal channels)."""
    image = cv2.imread(os.fspath(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"cannot read image {os.fspath(path)!r}; remove it or convert it to PNG/JPEG")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def decode_rgb(data: bytes) -> np.ndarray:
    """An encoded image (a file's bytes) as an HWC uint8 RGB array, as :func:`read_rgb` reads the file."""
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError("cannot decode an image of the packed data; pack the source again")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)

"""The released corruption benchmarks read as they were published, as map-style datasets.

- CIFAR-10-C / CIFAR-100-C: ``<root>/<corruption>.npy``, uint8 (5 x N, 32, 32, 3) holding severities 1-5
  one after the other (N = 10,000), and ``<root>/labels.npy`` with the 5 x N labels.
- ImageNet-C: ``<root>/<corruption>/<severity>/<class>/*.JPEG``; classes are numbered in sorted order
  (torchvision's ImageFolder, i.e. ImageNet's usual indices) unless ``classes`` gives the order.

Items are (image (3, H, W) float32 in [0, 1], label int), what ``corrupt`` takes and the sweep's
loaders yield. ``released_dataset`` picks the layout a root folder holds.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from .corruptions import CORRUPTIONS, list_corruptions

__all__ = ["CifarC", "ImageNetC", "layout", "released_corruptions", "released_dataset"]

SEVERITIES = (1, 2, 3, 4, 5)
IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


def _check(corruption: str, severity: int) -> None:
    if corruption not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {corruption!r}; choose one of {list_corruptions()}")
    if not isinstance(severity, numbers.Integral) or isinstance(severity, bool) or severity not in SEVERITIES:
        raise ValueError(
            f"severity must be one of {list(SEVERITIES)} (the released files hold no clean level), got {severity!r}"
        )


def layout(root: Path) -> str:
    """ "cifar" (npy files), "imagenet" (folders) or a FileNotFoundError that says what was expected."""
    if not root.is_dir():
        raise FileNotFoundError(
            f"robustness.root {root} is not a folder; pass the folder of CIFAR-10-C / CIFAR-100-C "
            "(<corruption>.npy, labels.npy) or of ImageNet-C (<corruption>/<severity>/)"
        )
    if (root / "labels.npy").is_file():
        return "cifar"
    if any((root / name).is_dir() for name in CORRUPTIONS):
        return "imagenet"
    raise FileNotFoundError(
        f"{root} holds neither labels.npy (CIFAR-10-C / CIFAR-100-C) nor a <corruption>/ "
        f"folder (ImageNet-C) named after one of {list_corruptions()}"
    )


def released_corruptions(root: str | Path) -> list[str]:
    """The corruptions present under ``root`` (either layout), sorted."""
    root = Path(root)
    if layout(root) == "cifar":
        return sorted(n for n in CORRUPTIONS if (root / f"{n}.npy").is_file())
    return sorted(n for n in CORRUPTIONS if (root / n).is_dir())


class CifarC(Dataset):
    """One corruption at one severity of CIFAR-10-C / CIFAR-100-C, memory-mapped from its .npy file."""

    def __init__(self, root: str | Path, corruption: str, severity: int):
        _check(corruption, severity)
        root = Path(root)
        path = root / f"{corruption}.npy"
        if not path.is_file():
            found = released_corruptions(root) if root.is_dir() and (root / "labels.npy").is_file() else []
            raise FileNotFoundError(f"{path} not found; {root} holds {found or 'no <corruption>.npy'}")
        images = np.load(path, mmap_mode="r")
        labels = np.load(root / "labels.npy", mmap_mode="r")
        if images.ndim != 4 or images.shape[-1] != 3 or images.dtype != np.uint8 or len(images) % 5:
            raise ValueError(
                f"{path} holds {images.dtype} {images.shape}; the released files are uint8 "
                "(5 x N, H, W, 3), severities 1-5 one after the other"
            )
        if len(labels) != len(images):
            raise ValueError(f"{root / 'labels.npy'} has {len(labels)} labels for the {len(images)} images of {path}")
        per = len(images) // 5
        rows = slice((severity - 1) * per, severity * per)
        self.images, self.labels = images[rows], labels[rows]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        image = torch.from_numpy(np.array(self.images[i])).permute(2, 0, 1).float() / 255
        return image, int(self.labels[i])


class ImageNetC(Dataset):
    """One corruption at one severity of ImageNet-C: ``<root>/<corruption>/<severity>/<class>/*.JPEG``."""

    def __init__(self, root: str | Path, corruption: str, severity: int, classes: Optional[Sequence[str]] = None):
        _check(corruption, severity)
        folder = Path(root) / corruption / str(severity)
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} not found; ImageNet-C holds <corruption>/<severity>/<class>/*.JPEG")
        present = sorted(p.name for p in folder.iterdir() if p.is_dir())
        self.classes = list(classes) if classes is not None else present
        unknown = sorted(set(present) - set(self.classes))
        if unknown:
            raise ValueError(f"{folder} has class folders not in the given classes: {unknown[:5]}")
        index = {c: i for i, c in enumerate(self.classes)}
        self.samples = [
            (f, index[c]) for c in present for f in sorted((folder / c).iterdir()) if f.suffix.lower() in IMAGE_SUFFIXES
        ]
        if not self.samples:
            raise FileNotFoundError(f"{folder} holds no images (<class>/*.JPEG)")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> tuple[Tensor, int]:
        from PIL import Image  # torchvision depends on Pillow

        path, label = self.samples[i]
        with Image.open(path) as im:
            array = np.asarray(im.convert("RGB"))
        return torch.from_numpy(array.copy()).permute(2, 0, 1).float() / 255, label


def released_dataset(
    root: str | Path, corruption: str, severity: int, classes: Optional[Sequence[str]] = None
) -> Dataset:
    """The released images of ``corruption`` at ``severity`` under ``root``, in whichever layout it holds
    (``classes``: ImageNet-C's class order, default sorted)."""
    if layout(Path(root)) == "cifar":
        if classes is not None:
            raise ValueError("classes applies to ImageNet-C folders; CIFAR-10-C / CIFAR-100-C carry labels.npy")
        return CifarC(root, corruption, severity)
    return ImageNetC(root, corruption, severity, classes)

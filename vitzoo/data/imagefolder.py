"""Any ``root/train/<class>/*`` image tree, with ``root/val/<class>/*`` or a seeded val split."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import List, Tuple

from sklearn.model_selection import train_test_split

from vitzoo.options import ImageFolderDataOptions

from .datamodule import DEFAULT, ImageDataModule

__all__ = ["ImageFolderDataModule", "IMAGE_EXTENSIONS"]

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
IMAGENET_MEAN, IMAGENET_STD = ImageFolderDataOptions.mean, ImageFolderDataOptions.std


def _scan(folder: Path, classes: List[str]) -> Tuple[List[str], List[int]]:
    paths, labels = [], []
    for label, name in enumerate(classes):
        class_dir = folder / name
        if not class_dir.is_dir():
            continue
        files = sorted(f for f in os.listdir(class_dir) if f.lower().endswith(IMAGE_EXTENSIONS))
        paths += [os.fspath(class_dir / f) for f in files]
        labels += [label] * len(files)
    return paths, labels


class ImageFolderDataModule(ImageDataModule):
    """Classes are the sub-folders of ``root/train`` (sorted). Without ``root/val`` the val split
    is ``val_fraction`` of train, stratified with ``split_seed``. Images are resized to
    ``img_size`` square."""

    options = ImageFolderDataOptions

    def __init__(
        self,
        root: str,
        img_size: int = DEFAULT,
        val_fraction: float = DEFAULT,
        split_seed: int = DEFAULT,
        mean=DEFAULT,
        std=DEFAULT,
        **kwargs,
    ):
        super().__init__(img_size=img_size, mean=mean, std=std, **kwargs)
        self.root = Path(os.path.expanduser(os.fspath(root)))
        self.val_fraction, self.split_seed = self.resolve(val_fraction=val_fraction, split_seed=split_seed).values()
        train = self.root / "train"
        if not train.is_dir():
            raise FileNotFoundError(
                f"data.root={os.fspath(self.root)!r} has no train/ folder; point data.root at a folder holding "
                f"train/<class>/*.jpg (and optionally val/<class>/*.jpg)"
            )
        self.classes = sorted(d.name for d in train.iterdir() if d.is_dir())
        if len(self.classes) < 2:
            raise ValueError(
                f"{os.fspath(train)!r} has {len(self.classes)} class folder(s); "
                f"an image classifier needs train/<class>/ folders for 2 or more classes"
            )
        self.num_classes = len(self.classes)
        self._splits = None

    def cache_file(self, split: str) -> Path:
        """``root/.vitzoo-cache/<split>-<size>px[-val<fraction>-seed<seed>].pt`` (the split parameters name the
        file when val/ is carved out of train/)."""
        carved = "" if (self.root / "val").is_dir() else f"-val{self.val_fraction:g}-seed{self.split_seed}"
        return self.root / ".vitzoo-cache" / f"{split}-{self.img_size}px{carved}.pt"

    def load_split(self, split: str):
        if self._splits is None:
            paths, labels = _scan(self.root / "train", self.classes)
            if not paths:
                raise FileNotFoundError(f"no images ({', '.join(IMAGE_EXTENSIONS)}) under {self.root / 'train'}")
            val_dir = self.root / "val"
            if val_dir.is_dir():
                extra = sorted(d.name for d in val_dir.iterdir() if d.is_dir() and d.name not in self.classes)
                if extra:
                    raise ValueError(
                        f"val/ has classes {extra} that train/ lacks; make both trees use the same class folders"
                    )
                self._splits = {"train": (paths, labels), "val": _scan(val_dir, self.classes)}
            else:
                if not 0.0 < self.val_fraction < 1.0:
                    raise ValueError(
                        f"{self.root} has no val/ folder and data.val_fraction={self.val_fraction}; "
                        f"set data.val_fraction in (0, 1) to hold out part of train/"
                    )
                n_val = math.ceil(self.val_fraction * len(paths))
                if n_val < len(self.classes) or len(paths) - n_val < len(self.classes):
                    raise ValueError(
                        f"data.val_fraction={self.val_fraction} of the {len(paths)} images under "
                        f"{self.root / 'train'} leaves {n_val} for val and {len(paths) - n_val} for "
                        f"train, but a stratified split needs at least one image per class "
                        f"({len(self.classes)}) on each side; change data.val_fraction, add images, "
                        f"or give a val/ folder"
                    )
                p_tr, p_va, y_tr, y_va = train_test_split(
                    paths, labels, test_size=self.val_fraction, stratify=labels, random_state=self.split_seed
                )
                self._splits = {"train": (p_tr, y_tr), "val": (p_va, y_va)}
        return self._splits[split]

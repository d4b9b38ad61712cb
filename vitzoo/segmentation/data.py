"""A folder of ``images/`` + ``masks/`` (integer class per pixel, any size) as a LightningDataModule.

Layout: ``root/images/<name>.<jpg|png|...>`` and ``root/masks/<name>.png`` (single channel, value =
class index, ``ignore_index`` for unlabeled pixels). With ``root/train/`` and ``root/val/`` each in
that layout they are used as the splits; otherwise ``val_fraction`` of ``root`` is held out.
Batches are ``(images in [0, 1] (B, 3, S, S), masks (B, S, S) long)``; the model normalises.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import albumentations as A
import lightning as L
import numpy as np
import torch
from PIL import Image
from timm.layers import to_2tuple
from torch.utils.data import DataLoader, Dataset, Subset

__all__ = ["SegmentationFolder", "SegmentationDataModule", "IMAGE_EXTENSIONS"]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp")


class SegmentationFolder(Dataset):
    """(image, mask) pairs of ``root/images`` and ``root/masks`` matched by file stem."""

    def __init__(self, root: Union[str, Path], num_classes: int, transform: Optional[A.Compose] = None,
                 ignore_index: int = 255):
        root = Path(root)
        image_dir, mask_dir = root / "images", root / "masks"
        if not image_dir.is_dir() or not mask_dir.is_dir():
            raise FileNotFoundError(f"{root} needs images/ and masks/ subfolders (masks/<name>.png per image)")
        self.images = sorted(p for p in image_dir.iterdir() if p.suffix.lower() in IMAGE_EXTENSIONS)
        if not self.images:
            raise ValueError(f"{image_dir} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
        self.masks = [mask_dir / f"{p.stem}.png" for p in self.images]
        missing = [m.name for m in self.masks if not m.is_file()]
        if missing:
            raise FileNotFoundError(f"{len(missing)} images have no mask in {mask_dir} (e.g. {missing[0]}); "
                                    f"add one single-channel PNG per image with the same name")
        self.num_classes, self.transform, self.ignore_index = num_classes, transform, ignore_index

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        image = np.asarray(Image.open(self.images[index]).convert("RGB"))
        mask = self._read_mask(index)
        if mask.shape != image.shape[:2]:
            raise ValueError(f"{self.masks[index]} is {mask.shape[1]}x{mask.shape[0]} but its image is "
                             f"{image.shape[1]}x{image.shape[0]}; masks must match their image's size")
        if self.transform is not None:
            out = self.transform(image=image, mask=mask)
            image, mask = out["image"], out["mask"]
        image = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1).float().div_(255)
        return image, torch.from_numpy(np.ascontiguousarray(mask)).long()

    def _read_mask(self, index: int) -> np.ndarray:
        path = self.masks[index]
        with Image.open(path) as m:
            if m.mode not in ("L", "P", "I", "I;16"):
                raise ValueError(f"{path} has mode {m.mode}; masks must be single-channel PNGs holding the class "
                                 f"index per pixel (mode L or P), not colours")
            mask = np.asarray(m).astype(np.int64)
        bad = np.setdiff1d(np.unique(mask), np.r_[np.arange(self.num_classes), self.ignore_index])
        if bad.size:
            raise ValueError(f"{path} holds class values {bad.tolist()[:5]} outside 0..{self.num_classes - 1}; "
                             f"set num_classes to cover them or mark unlabeled pixels {self.ignore_index}")
        return mask


class SegmentationDataModule(L.LightningDataModule):
    """Train: random resized crop (``scale``) + horizontal flip to ``img_size``; val: resize to it."""

    def __init__(self, root: str, num_classes: int, img_size: Union[int, Sequence[int]] = 256, batch_size: int = 8,
                 num_workers: int = 0, val_fraction: float = 0.2, scale: Sequence[float] = (0.5, 1.0),
                 ignore_index: int = 255, seed: int = 0):
        super().__init__()
        if not 0 < val_fraction < 1:
            raise ValueError(f"val_fraction={val_fraction} must lie in (0, 1)")
        self.root, self.num_classes, self.img_size = Path(root), num_classes, to_2tuple(img_size)
        self.batch_size, self.num_workers, self.val_fraction = batch_size, num_workers, val_fraction
        self.scale, self.ignore_index, self.seed = tuple(scale), ignore_index, seed
        self.train_dataset: Optional[Dataset] = None
        self.val_dataset: Optional[Dataset] = None

    def transforms(self, train: bool) -> A.Compose:
        size = tuple(int(s) for s in self.img_size)
        if train:
            return A.Compose([A.RandomResizedCrop(size=size, scale=self.scale), A.HorizontalFlip(p=0.5)])
        return A.Compose([A.Resize(*size)])

    def _folder(self, root: Path, train: bool) -> SegmentationFolder:
        return SegmentationFolder(root, self.num_classes, self.transforms(train), self.ignore_index)

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_dataset is not None:
            return
        if (self.root / "train").is_dir() and (self.root / "val").is_dir():
            self.train_dataset = self._folder(self.root / "train", True)
            self.val_dataset = self._folder(self.root / "val", False)
            return
        train, val = self._folder(self.root, True), self._folder(self.root, False)
        order = torch.randperm(len(train), generator=torch.Generator().manual_seed(self.seed)).tolist()
        num_val = max(1, round(self.val_fraction * len(order)))
        if num_val >= len(order):
            raise ValueError(f"{self.root} has {len(order)} images, too few to hold out val_fraction="
                             f"{self.val_fraction}; add images or provide train/ and val/ folders")
        self.train_dataset, self.val_dataset = Subset(train, order[num_val:]), Subset(val, order[:num_val])

    def _loader(self, dataset: Dataset, shuffle: bool) -> DataLoader:
        return DataLoader(dataset, self.batch_size, shuffle=shuffle, num_workers=self.num_workers,
                          drop_last=shuffle and len(dataset) > self.batch_size,
                          persistent_workers=self.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, False)

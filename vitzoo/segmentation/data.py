"""A folder of images and masks (any size, any of the common layouts) as a LightningDataModule.

Layout: ``root/<images>`` + ``root/<masks>`` (``images/``, ``image/``, ``masks/``, ``label/``, ... found
automatically, or named with ``images`` / ``masks``: folder, file or glob); see ``files.find_samples``.
With ``root/train/`` and ``root/val/`` each in that layout they are the splits; otherwise ``root``'s n
images are split: round(``val_fraction`` * n) of them (at least 1), drawn with ``seed``, are held out for
validation and the rest train (24 images, 0.2: 5 held out, 19 train). Masks go through a ``LabelMap``
(``mask_values``, ``binary_threshold``); ``class_names`` names the class indices (default ``class_<c>``).

Train batches: random rescale (``rescale``) + crop to ``img_size`` + horizontal flip, ``(images in [0, 1]
(B, in_chans, S, S), masks (B, S, S) long)``. Val / test: one image at its native size per batch.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

import albumentations as A
import cv2
import lightning as L
import numpy as np
import torch
from timm.layers import to_2tuple
from torch.utils.data import DataLoader, Dataset, Subset

from vitzoo.data.workers import resolve_num_workers
from vitzoo.options import DEFAULT, SegmentationDataOptions, TakesOptions

from .files import Sample, find_samples
from .io import GRAY_MODES, image_mode, read_image, read_mask
from .labels import LabelMap, check_class_names, check_histogram, class_histogram, format_histogram

__all__ = ["SegmentationFolder", "SegmentationDataModule"]

log = logging.getLogger(__name__)


class SegmentationFolder(Dataset):
    """``samples`` as ``(image (in_chans, H, W) float in [0, 1], mask (H, W) long class indices)``."""

    def __init__(
        self, samples: Sequence[Sample], labels: LabelMap, in_chans: int = 3, transform: Optional[A.Compose] = None
    ):
        if in_chans not in (1, 3):
            raise ValueError(f"data.in_chans={in_chans}; use 3 (RGB, grayscale replicated) or 1 (grayscale)")
        self.samples, self.labels, self.in_chans, self.transform = list(samples), labels, in_chans, transform

    def __len__(self) -> int:
        return len(self.samples)

    def mask(self, index: int) -> np.ndarray:
        """The sample's class-index mask, checked by the ``LabelMap``."""
        sample = self.samples[index]
        return self.labels(read_mask(sample), sample.mask)

    def __getitem__(self, index: int) -> Tuple[torch.Tensor, torch.Tensor]:
        sample = self.samples[index]
        image, mask = read_image(sample, self.in_chans), self.mask(index)
        if mask.shape != image.shape[:2]:
            raise ValueError(
                f"{sample.mask} is {mask.shape[1]}x{mask.shape[0]} but its image {sample.image.name} "
                f"is {image.shape[1]}x{image.shape[0]}; masks must match their image's size"
            )
        if self.transform is not None:
            out = self.transform(image=image, mask=mask)
            image, mask = out["image"], out["mask"]
        image = torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1)
        return image, torch.from_numpy(np.ascontiguousarray(mask)).long()


class SegmentationDataModule(TakesOptions, L.LightningDataModule):
    """Images + masks under ``root``; see the module docstring for layouts, ``LabelMap`` for the label options.

    ``repeats`` passes over the training images per epoch (a short set still gets a sensible epoch);
    ``num_workers='auto'`` sizes the loaders from the usable CPUs. At setup every mask is read once: values
    are checked and the class histogram of the training masks is logged (kept in ``class_pixels``). The meaning
    of its options: :class:`~vitzoo.options.SegmentationDataOptions`; an argument left out takes its value in the
    class's ``options`` (:meth:`~vitzoo.options.TakesOptions.resolve`), the schema of its config, so the module
    built in Python with ``root`` and ``num_classes`` is the one ``--config-name segment`` builds.
    """

    options: ClassVar[Type[SegmentationDataOptions]] = SegmentationDataOptions  # the values of the arguments left out

    def __init__(
        self,
        root: str,
        num_classes: int,
        class_names: Optional[Sequence[str]] = DEFAULT,
        img_size: Union[int, Sequence[int]] = DEFAULT,
        batch_size: int = DEFAULT,
        num_workers: Union[int, str] = DEFAULT,
        val_fraction: float = DEFAULT,
        rescale: Sequence[float] = DEFAULT,
        ignore_index: int = DEFAULT,
        mask_values: Optional[Mapping[int, int]] = DEFAULT,
        binary_threshold: Optional[float] = DEFAULT,
        images: Optional[str] = DEFAULT,
        masks: Optional[str] = DEFAULT,
        mask_suffix: str = DEFAULT,
        unpaired: str = DEFAULT,
        in_chans: int = DEFAULT,
        repeats: int = DEFAULT,
        seed: int = DEFAULT,
    ):
        (
            class_names,
            img_size,
            batch_size,
            num_workers,
            val_fraction,
            rescale,
            ignore_index,
            mask_values,
            binary_threshold,
            images,
            masks,
            mask_suffix,
            unpaired,
            in_chans,
            repeats,
            seed,
        ) = self.resolve(
            class_names=class_names,
            img_size=img_size,
            batch_size=batch_size,
            num_workers=num_workers,
            val_fraction=val_fraction,
            rescale=rescale,
            ignore_index=ignore_index,
            mask_values=mask_values,
            binary_threshold=binary_threshold,
            images=images,
            masks=masks,
            mask_suffix=mask_suffix,
            unpaired=unpaired,
            in_chans=in_chans,
            repeats=repeats,
            seed=seed,
        ).values()
        super().__init__()
        self.save_options()  # the resolved values, a subclass's **kwargs included, as checkpoints keep them
        if not 0 < val_fraction < 1:
            raise ValueError(f"data.val_fraction={val_fraction} must lie in (0, 1)")
        if int(repeats) < 1:
            raise ValueError(f"data.repeats={repeats} must be an integer >= 1 (passes over the images per epoch)")
        if len(rescale) != 2 or not 0 < rescale[0] <= rescale[1]:
            raise ValueError(f"data.rescale={list(rescale)} must be [low, high] with 0 < low <= high")
        self.root, self.num_classes, self.img_size = Path(root).expanduser(), num_classes, to_2tuple(img_size)
        self.labels = LabelMap(num_classes, ignore_index, mask_values, binary_threshold)
        self.class_names = check_class_names(class_names, num_classes)
        self.batch_size, self.num_workers = batch_size, resolve_num_workers(num_workers)
        self.val_fraction, self.rescale, self.ignore_index = val_fraction, tuple(rescale), ignore_index
        self.find = dict(images=images, masks=masks, mask_suffix=mask_suffix, unpaired=unpaired)
        self.in_chans, self.repeats, self.seed = in_chans, int(repeats), seed
        self.class_pixels: Dict[str, np.ndarray] = {}
        self.train_dataset: Optional[Dataset] = None
        self.val_dataset: Optional[Dataset] = None

    def train_transform(self) -> A.Compose:
        h, w = (int(s) for s in self.img_size)
        low, high = self.rescale
        return A.Compose(
            [
                A.RandomScale(scale_limit=(low - 1, high - 1), p=1.0),
                A.PadIfNeeded(h, w, border_mode=cv2.BORDER_CONSTANT, fill=0, fill_mask=self.ignore_index),
                A.RandomCrop(h, w),
                A.HorizontalFlip(p=0.5),
            ]
        )

    def _splits(self) -> Tuple[List[Sample], List[Sample], str]:
        """(training samples, validation samples, how they were split: for the log)."""
        train_dir, val_dir = self.root / "train", self.root / "val"
        if train_dir.is_dir() and val_dir.is_dir():
            train, val = find_samples(train_dir, **self.find), find_samples(val_dir, **self.find)
            return train, val, f"{len(train)} training images in {train_dir}, {len(val)} validation images in {val_dir}"
        samples = find_samples(self.root, **self.find)
        order = torch.randperm(len(samples), generator=torch.Generator().manual_seed(self.seed)).tolist()
        num_val = max(1, round(self.val_fraction * len(order)))
        if num_val >= len(order):
            raise ValueError(
                f"{self.root} has {len(order)} images, too few to hold out data.val_fraction="
                f"{self.val_fraction}; add images or provide train/ and val/ folders"
            )
        split = (
            f"{len(order)} images in {self.root}: {num_val} held out for validation (data.val_fraction="
            f"{self.val_fraction}, seed {self.seed}), {len(order) - num_val} training"
        )
        return [samples[i] for i in order[num_val:]], [samples[i] for i in order[:num_val]], split

    def setup(self, stage: Optional[str] = None) -> None:
        if self.train_dataset is not None:
            return
        train_samples, val_samples, split = self._splits()
        train = SegmentationFolder(train_samples, self.labels, self.in_chans, self.train_transform())
        val = SegmentationFolder(val_samples, self.labels, self.in_chans)
        for part, folder in (("train", train), ("val", val)):
            masks = (folder.mask(i) for i in range(len(folder)))
            self.class_pixels[part] = class_histogram(masks, self.num_classes, self.ignore_index)
        check_histogram(self.class_pixels["train"], self.class_pixels["val"], self.labels)
        log.info("%s; training mask pixels: %s", split, format_histogram(self.class_pixels["train"], self.class_names))
        self._report_grayscale(train_samples + val_samples)
        self.train_dataset = Subset(train, list(range(len(train))) * self.repeats)
        self.val_dataset = val

    def _report_grayscale(self, samples: Sequence[Sample]) -> None:
        gray = sum(image_mode(s) in GRAY_MODES for s in samples)
        if gray and self.in_chans == 3:
            log.info(
                "%d of %d images are grayscale: replicated to 3 channels and normalised with the backbone's "
                "RGB mean/std (data.in_chans=1 sums the patch embedding's channels instead)",
                gray,
                len(samples),
            )

    def _loader(self, dataset: Dataset, train: bool) -> DataLoader:
        return DataLoader(
            dataset,
            self.batch_size if train else 1,
            shuffle=train,
            num_workers=self.num_workers,
            drop_last=train and len(dataset) > self.batch_size,
            persistent_workers=self.num_workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, False)

"""The device-resident data path: a split decoded once into a uint8 tensor (cached in a file next to the
data), moved to the training device once, and augmented there a whole batch at a time.

It mirrors the albumentations path of :mod:`~vitzoo.data.transforms` for the policies it supports: the
same resize (cv2, bilinear) when decoding, then per batch a random crop after zero padding of
``crop_padding`` px and a horizontal flip with probability 1/2, then normalisation. Mixup / cutmix run in
the LightningModule on the batch, as they do for the other path. The strong policy's affine, colour and
cut-out steps and Gaussian-noise augmentation exist only in the albumentations path: asking for them here
is an error, never a silent skip.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, Tuple, Union

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from .images import Images, read_rgb

__all__ = ["decode_split", "load_or_build_cache", "DeviceBatches", "check_device_aug"]


def check_device_aug(aug: Mapping[str, Any]) -> None:
    """A clear error for augmentation options the device path does not implement; ``aug``: every option of the
    cifar recipe (:func:`~vitzoo.data.recipes.recipe_aug`)."""
    if aug["policy"] == "strong":
        raise ValueError(
            "data.aug.policy=strong (affine, colour jitter, cut-out) runs only in the albumentations "
            "path; set data.device_cache=false, or data.aug.policy=basic (mixup/cutmix still apply)"
        )
    if aug["gauss_noise"] > 0:
        raise ValueError(
            "data.aug.gauss_noise runs only in the albumentations path; set data.device_cache=false "
            "or data.aug.gauss_noise=0"
        )


def _decode_one(image, img_size: int) -> np.ndarray:
    image = image if isinstance(image, np.ndarray) else read_rgb(image)
    if image.shape[:2] != (img_size, img_size):
        image = cv2.resize(image, (img_size, img_size), interpolation=cv2.INTER_LINEAR)
    return image


def decode_split(images: Images, img_size: int) -> torch.Tensor:
    """Every image resized to ``img_size`` square, as one (N, 3, H, W) uint8 tensor."""
    out = np.empty((len(images), img_size, img_size, 3), dtype=np.uint8)
    for i, image in enumerate(images):
        out[i] = _decode_one(image, img_size)
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


def _fingerprint(images: Images, labels: Sequence[int], img_size: int) -> str:
    """What the cache was built from: the size, the labels and each file's path, size and mtime."""
    h = hashlib.sha1(f"{img_size}|{len(images)}".encode())
    h.update(np.asarray(labels, dtype=np.int64).tobytes())
    for path in images:
        st = os.stat(path)
        h.update(f"{os.fspath(path)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def load_or_build_cache(cache: Path, images: Images, labels: Sequence[int], img_size: int) -> torch.Tensor:
    """The decoded split from ``cache``, built there on first use. A cache built from other files (added,
    removed or changed images, another size) or one that cannot be read is an error naming the fix."""
    key = _fingerprint(images, labels, img_size)
    if cache.is_file():
        try:
            saved = torch.load(cache, map_location="cpu", weights_only=True)
        except Exception as err:
            raise ValueError(
                f"cannot read the decoded-image cache {cache} ({type(err).__name__}); delete it and it "
                f"is rebuilt on the next run"
            ) from err
        if saved.get("fingerprint") != key:
            raise ValueError(
                f"the decoded-image cache {cache} was built from other images (files added, removed or "
                f"changed since, or another img_size); delete it and it is rebuilt on the next run"
            )
        return saved["images"]
    decoded = decode_split(images, img_size)
    tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"fingerprint": key, "images": decoded}, tmp)
        os.replace(tmp, cache)  # atomic: a concurrent run never reads half a file
    except OSError as err:
        raise ValueError(
            f"cannot write the decoded-image cache {cache} ({err.strerror}); make {cache.parent} "
            f"writable or set data.device_cache=false"
        ) from err
    return decoded


class DeviceBatches:
    """Batches of (normalised float images, labels) drawn from uint8 tensors on ``device``.

    ``train``: a fresh permutation every epoch, last partial batch dropped, crop / flip augmentation; the
    draws come from one generator seeded with ``seed``, so a seed fixes every epoch. Under DDP each rank
    takes every ``world_size``-th image of the permutation (see :meth:`_per_rank`).
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: Sequence[int],
        batch_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        train: bool,
        device: Union[str, torch.device] = "cpu",
        seed: int = 0,
        crop_padding: int = 0,
        hflip: bool = False,
        rank: int = 0,
        world_size: int = 1,
    ):
        self.device = torch.device(device)
        self.images = images.to(self.device)
        self.labels = torch.as_tensor(np.asarray(labels), dtype=torch.long, device=self.device)
        self.batch_size, self.train = int(batch_size), train
        self.crop_padding, self.hflip = int(crop_padding) if train else 0, bool(hflip) and train
        self.mean = torch.tensor(mean, device=self.device).view(1, -1, 1, 1) * 255.0
        self.std = torch.tensor(std, device=self.device).view(1, -1, 1, 1) * 255.0
        self.rank, self.world_size = rank, world_size
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed))

    def _per_rank(self) -> int:
        """Images per rank: an equal share (train drops the remainder, eval repeats the first images to fill
        the last share, as DistributedSampler does), so every rank runs the same number of steps."""
        n, world = len(self.labels), self.world_size
        return n // world if self.train else -(-n // world)

    def _order(self) -> torch.Tensor:
        n = len(self.labels)
        if self.train:
            order = torch.randperm(n, generator=self.generator, device=self.device)
        else:
            order = torch.arange(n, device=self.device)
        need = self._per_rank() * self.world_size
        if need > n:
            order = torch.cat([order, order[: need - n]])
        return order[self.rank : need : self.world_size]

    def __len__(self) -> int:
        per_rank = self._per_rank()
        return per_rank // self.batch_size if self.train else -(-per_rank // self.batch_size)

    def augment(self, x: torch.Tensor) -> torch.Tensor:
        """Random crop after zero padding, then a horizontal flip with probability 1/2 (uint8 in, uint8 out)."""
        B, _, H, W = x.shape
        p = self.crop_padding
        if p > 0:
            padded = F.pad(x, (p, p, p, p))
            offsets = torch.randint(0, 2 * p + 1, (2, B), generator=self.generator, device=self.device)
            rows = offsets[0, :, None] + torch.arange(H, device=self.device)  # (B, H)
            cols = offsets[1, :, None] + torch.arange(W, device=self.device)  # (B, W)
            batch = torch.arange(B, device=self.device)[:, None, None]
            x = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)
        if self.hflip:
            flip = torch.rand(B, generator=self.generator, device=self.device) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return x

    def __iter__(self) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
        order = self._order()
        for start in range(0, min(len(self) * self.batch_size, len(order)), self.batch_size):
            index = order[start : start + self.batch_size]
            x = self.images[index]
            if self.train:
                x = self.augment(x)
            yield (x.float() - self.mean) / self.std, self.labels[index]

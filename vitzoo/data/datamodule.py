"""The shared LightningDataModule: splits of (HWC uint8 image, label) -> a transform recipe (albumentations'
``cifar`` or timm's ``deit``, :mod:`~vitzoo.data.recipes`) -> loaders, or (``device_cache``) the device-resident
path of :mod:`~vitzoo.data.device_data`."""

from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path
from typing import Any, ClassVar, Dict, Mapping, Optional, Sequence, Tuple, Type, Union

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from vitzoo.options import DEFAULT, FolderDataOptions, ImageDataOptions, TakesOptions

from .device_data import DeviceBatches, check_device_aug, decode_split, load_or_build_cache
from .images import Images, read_rgb
from .native import collate_native, native_transform
from .recipes import build_recipe, eval_transform_fields, recipe_aug
from .sampling import EpochSampler, RepeatAugEpochSampler, ResumableLoader, sample_seed
from .transforms import seed_worker
from .workers import resolve_num_workers

__all__ = ["ImageDataset", "ImageDataModule", "read_rgb", "DEVICE_CACHE_MAX_SIZE", "DEFAULT"]

log = logging.getLogger(__name__)

DEVICE_CACHE_MAX_SIZE = 64  # device_cache=null turns the device path on for CUDA runs up to this img_size


# What an option left out takes where the module's options dataclass has no such field (so its config cannot set it
# either): the folder options' values (the cifar recipe, no repeated augmentation, no native resolution), unpinned
# host memory and mid-grey statistics.
_BASE_OPTIONS = FolderDataOptions(pin_memory=False, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))


class ImageDataset(Dataset):
    """(image, label) pairs; ``images`` is an (N, H, W, C) uint8 array or a list of file paths (read with
    ``read``).

    Indexed by ``(epoch, index, ...)`` (what :class:`~vitzoo.data.sampling.EpochSampler` yields), the
    transform's random state is first seeded from ``(seed, epoch, index, ...)``: an image's augmentation is
    the same in any worker, and in a resumed run.
    """

    def __init__(self, images: Images, labels: Sequence[int], transform, seed: int = 0, read=read_rgb):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.labels, self.transform = images, np.asarray(labels, dtype=np.int64), transform
        self.seed, self.read = int(seed), read

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, item: Union[int, Tuple[int, int]]) -> Tuple[torch.Tensor, int]:
        if isinstance(item, tuple):
            epoch, index, *draw = item
            self.transform.set_random_seed(sample_seed(self.seed, epoch, index, *draw))
        else:
            index = item
        image = self.images[index]
        if not isinstance(image, np.ndarray):
            image = self.read(image)
        return self.transform(image=image)["image"], int(self.labels[index])


class ImageDataModule(TakesOptions, L.LightningDataModule):
    """Base class: a subclass sets ``num_classes`` and implements :meth:`load_split`.

    ``batch_size`` is per device (per process under DDP). ``recipe`` picks the transforms
    (:func:`~vitzoo.data.recipes.build_recipe`), and ``aug`` holds the chosen recipe's training options over its
    defaults (``None``: the defaults; :func:`~vitzoo.data.recipes.recipe_aug`): ``cifar`` (the keyword arguments of
    :func:`~vitzoo.data.transforms.build_train_transform`: policy, crop_padding, hflip, gauss_noise, gauss_noise_p,
    defaults :class:`~vitzoo.options.CifarAugOptions`) or ``deit`` (over :data:`~vitzoo.data.recipes.DEIT_AUG`;
    evaluation resizes to ``img_size / crop_pct`` and center-crops, ``crop_pct`` and ``interpolation`` left null
    coming from ``pretrained_cfg``, which train.py sets to the model's). ``repeated_aug`` > 1: each training image
    appears that many times per epoch spread over the DDP ranks, each time augmented afresh (timm's
    ``RepeatAugSampler``, DeiT's repeated augmentation; one process draws plainly).
    ``num_workers``: an int or ``auto`` (sized from the usable CPUs, see
    :func:`~vitzoo.data.workers.resolve_num_workers`). ``test_dataloader`` serves the val split.
    ``device_cache``: decode each split once into a uint8 tensor on the training device and augment whole
    batches there (:mod:`~vitzoo.data.device_data`); ``None`` = on for CUDA runs with ``img_size`` up to
    ``DEVICE_CACHE_MAX_SIZE`` whose augmentation the device path implements. ``native_resolution``: every image keeps
    its own size and aspect (longer side at most ``img_size``, sides cut to multiples of ``native_multiple``, the
    model's patch size; :mod:`~vitzoo.data.native`) and a batch is a list of images, which the ViT runs as one padded,
    masked batch; it replaces the recipe's transforms with a horizontal flip (cifar recipe, no device cache).

    The options' defaults: an argument left out (``DEFAULT``) takes its value in the class's ``options``, the
    dataclass of :mod:`vitzoo.options` that its ``data=`` config is built on (e.g.
    :class:`~vitzoo.options.DigitsDataOptions`), so ``DigitsDataModule()`` is the module ``data=digits`` builds
    (:meth:`~vitzoo.options.TakesOptions.resolve`; an option that dataclass lacks takes the base's value, which the
    config runs with too). ``aug`` left out with a ``recipe`` other than the dataclass's is that recipe's defaults.
    """

    num_classes: int
    in_chans: int = 3
    options: ClassVar[Type[ImageDataOptions]] = ImageDataOptions  # the values of the arguments left out

    @classmethod
    def defaults(cls) -> Dict[str, Any]:
        """:meth:`TakesOptions.defaults` over the base's values of the options ``cls.options`` lacks."""
        return {**vars(_BASE_OPTIONS), **super().defaults()}

    def __init__(
        self,
        img_size: int = DEFAULT,
        batch_size: int = DEFAULT,
        num_workers: Union[int, str] = DEFAULT,
        mean: Sequence[float] = DEFAULT,
        std: Sequence[float] = DEFAULT,
        aug: Optional[Mapping[str, Any]] = DEFAULT,
        eval_batch_size: Optional[int] = DEFAULT,
        pin_memory: bool = DEFAULT,
        device_cache: Optional[bool] = DEFAULT,
        recipe: str = DEFAULT,
        crop_pct: Optional[float] = DEFAULT,
        interpolation: Optional[str] = DEFAULT,
        repeated_aug: int = DEFAULT,
        native_resolution: bool = DEFAULT,
        native_multiple: int = DEFAULT,
    ):
        super().__init__()
        if aug is DEFAULT and recipe not in (DEFAULT, self.defaults()["recipe"]):
            aug = None  # the options' aug belongs to their recipe: another one starts at its own defaults
        (
            img_size,
            batch_size,
            num_workers,
            mean,
            std,
            aug,
            eval_batch_size,
            pin_memory,
            device_cache,
            recipe,
            crop_pct,
            interpolation,
            repeated_aug,
            native_resolution,
            native_multiple,
        ) = self.resolve(
            img_size=img_size,
            batch_size=batch_size,
            num_workers=num_workers,
            mean=mean,
            std=std,
            aug=aug,
            eval_batch_size=eval_batch_size,
            pin_memory=pin_memory,
            device_cache=device_cache,
            recipe=recipe,
            crop_pct=crop_pct,
            interpolation=interpolation,
            repeated_aug=repeated_aug,
            native_resolution=native_resolution,
            native_multiple=native_multiple,
        ).values()
        self.img_size, self.batch_size = int(img_size), int(batch_size)
        self.num_workers = resolve_num_workers(num_workers)
        self.eval_batch_size = int(eval_batch_size or batch_size)
        self.mean, self.std = tuple(float(m) for m in mean), tuple(float(s) for s in std)
        self.aug = dict(aug or {})
        self.pin_memory = pin_memory
        recipe_aug(recipe, self.aug)  # checked now, each in one line: the recipe's name, the keys of data.aug
        self.recipe, self.crop_pct, self.interpolation = recipe, crop_pct, interpolation
        if isinstance(repeated_aug, bool) or not isinstance(repeated_aug, int) or repeated_aug < 1:
            raise ValueError(f"data.repeated_aug={repeated_aug!r}; give an integer >= 1 (1 = off, DeiT uses 3)")
        self.repeated_aug = repeated_aug
        self.pretrained_cfg: Optional[Mapping[str, Any]] = None  # the model's; train.py sets it before setup
        if device_cache not in (None, True, False):
            raise ValueError(f"data.device_cache={device_cache!r}; set it to true, false or null (automatic)")
        if device_cache and recipe != "cifar":
            raise ValueError(
                f"data.device_cache=true implements the cifar recipe's crop and flip only; with "
                f"data.recipe={recipe} set data.device_cache=false"
            )
        if device_cache:
            check_device_aug(recipe_aug(recipe, self.aug))
            if isinstance(num_workers, int) and num_workers > 0:
                log.warning(
                    "data.num_workers=%d is not used: the device path (data.device_cache=true) needs no "
                    "DataLoader workers; drop it or set data.num_workers=0",
                    num_workers,
                )
        self.device_cache = device_cache
        if native_resolution and (recipe != "cifar" or device_cache):
            raise ValueError(
                "data.native_resolution=true keeps each image's size with its own transform (a flip): set "
                "data.recipe=cifar and data.device_cache=false"
            )
        if not isinstance(native_multiple, int) or native_multiple < 1:
            raise ValueError(f"data.native_multiple={native_multiple!r}; give the model's patch size (an integer >= 1)")
        self.native_resolution, self.native_multiple = bool(native_resolution), native_multiple
        self.train_dataset: Optional[ImageDataset] = None
        self.val_dataset: Optional[ImageDataset] = None
        self.device_splits: Optional[dict] = None

    def load_split(self, split: str) -> Tuple[Images, Sequence[int]]:
        """(images, labels) of ``split``: 'train' or 'val'."""
        raise NotImplementedError

    def _load(self, split: str) -> Tuple[Images, Sequence[int]]:
        """``load_split`` with its labels checked against ``num_classes`` (once per split, not per batch)."""
        images, labels = self.load_split(split)
        outside = sorted(
            {int(x) for x in np.unique(np.asarray(labels, dtype=np.int64)) if not 0 <= x < self.num_classes}
        )
        if outside:
            raise ValueError(
                f"the {split} split has labels {outside[:5]} outside 0..{self.num_classes - 1} "
                f"({type(self).__name__}.num_classes={self.num_classes}); fix the labels or the class "
                f"count"
            )
        return images, labels

    def cache_file(self, split: str) -> Optional[Path]:
        """Where the device path keeps ``split`` decoded; None: decode in memory on every run (data sets that
        are arrays already). Image folders override it."""
        return None

    def _device(self) -> torch.device:
        return self.trainer.strategy.root_device if self.trainer is not None else torch.device("cpu")

    def uses_device_cache(self) -> bool:
        """Whether the loaders come from the device path (``device_cache``, or its automatic choice)."""
        if self.device_cache is not None or self.native_resolution:
            return bool(self.device_cache)
        if self.recipe != "cifar" or self._device().type != "cuda" or self.img_size > DEVICE_CACHE_MAX_SIZE:
            return False
        try:
            check_device_aug(recipe_aug(self.recipe, self.aug))
        except ValueError as err:
            log.info("data.device_cache=null: using the albumentations path, as %s", err)
            return False
        return True

    def _decoded(self, split: str) -> Tuple[torch.Tensor, np.ndarray]:
        images, labels = self._load(split)
        cache = self.cache_file(split)
        decoded = (
            decode_split(images, self.img_size)
            if cache is None
            else load_or_build_cache(cache, images, labels, self.img_size)
        )
        return decoded, np.asarray(labels, dtype=np.int64)

    def setup(self, stage: Optional[str] = None) -> None:
        # Training only: a validate / test / eval.py setup reads the val split through val_dataset (the same
        # images, see the tests), without decoding the training split into a cache it would not use.
        if self.device_splits is None and stage in (None, "fit") and self.uses_device_cache():
            self.device_splits = {split: self._decoded(split) for split in ("train", "val")}
            self._check_batch_size(len(self.device_splits["train"][1]))
            log.info(
                "data: device-resident path on %s (%d train / %d val images decoded at %d px)",
                self._device(),
                len(self.device_splits["train"][1]),
                len(self.device_splits["val"][1]),
                self.img_size,
            )
        # val_dataset exists on both paths: callbacks and eval.py read single images from it.
        recipe = self.build_recipe() if self.train_dataset is None or self.val_dataset is None else None
        if self.device_splits is None and stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = ImageDataset(*self._load("train"), self._transform(recipe, True), read=recipe.read)
            self._check_batch_size(len(self.train_dataset))
        if self.val_dataset is None:
            self.val_dataset = ImageDataset(*self._load("val"), self._transform(recipe, False), read=recipe.read)

    def _transform(self, recipe, train: bool):
        """The recipe's training or eval transform, or each image at its own size (``native_resolution``)."""
        if self.native_resolution:
            return native_transform(self.img_size, self.native_multiple, self.mean, self.std, train)
        return recipe.train if train else recipe.eval

    def build_recipe(self):
        """The transforms of ``data.recipe`` at this module's size and statistics."""
        return build_recipe(
            self.recipe,
            self.img_size,
            self.mean,
            self.std,
            self.aug,
            self.crop_pct,
            self.interpolation,
            self.pretrained_cfg,
        )

    def eval_transform(self) -> Dict[str, Any]:
        """What the val split's transform depends on besides size and statistics (the recipe, and the deit recipe's
        crop as resolved against ``pretrained_cfg``): what a classifier trained on this data records for eval.py."""
        return eval_transform_fields(self.recipe, self.img_size, self.crop_pct, self.interpolation, self.pretrained_cfg)

    def _check_batch_size(self, num_train: int) -> None:
        if num_train < self.batch_size:
            raise ValueError(
                f"data.batch_size={self.batch_size} is larger than the training set "
                f"({num_train} images); lower data.batch_size"
            )

    def _device_loader(self, train: bool) -> DeviceBatches:
        images, labels = self.device_splits["train" if train else "val"]
        rank = self.trainer.global_rank if self.trainer is not None else 0
        world = self.trainer.world_size if self.trainer is not None else 1
        aug = recipe_aug(self.recipe, self.aug)  # the cifar recipe's: the device path implements no other
        augment = aug["policy"] != "none"
        crop = aug["crop_padding"] if augment else 0
        hflip = aug["hflip"] and augment
        return DeviceBatches(
            images,
            labels,
            self.batch_size if train else self.eval_batch_size,
            self.mean,
            self.std,
            train=train,
            device=self._device(),
            seed=int(torch.randint(2**31, ()).item()) + rank,
            crop_padding=crop,
            hflip=hflip,
            rank=rank,
            world_size=world,
        )

    def _loader(self, dataset: Optional[ImageDataset], train: bool) -> DataLoader:
        if self.device_splits is not None:
            return self._device_loader(train)
        if dataset is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        rank = self.trainer.global_rank if self.trainer is not None else 0
        # pinned host memory only speeds copies to a GPU (torch warns on a CPU run)
        common = dict(
            num_workers=self.num_workers,
            pin_memory=self.pin_memory and self._device().type == "cuda",
            persistent_workers=self.num_workers > 0,
            worker_init_fn=partial(seed_worker, rank=rank) if self.num_workers > 0 else None,
            collate_fn=collate_native if self.native_resolution else None,
        )
        if not train:
            return DataLoader(dataset, batch_size=self.eval_batch_size, **common)
        # The shuffle and the augmentation follow the run's seed (what seed_everything exported, as
        # Lightning's own DistributedSampler does), never the global RNG: a resumed run draws the same.
        seed = int(os.environ.get("PL_GLOBAL_SEED", 0))
        dataset.seed = seed
        world = self.trainer.world_size if self.trainer is not None else 1
        if self.repeated_aug > 1 and world > 1:
            sampler = RepeatAugEpochSampler(
                dataset, num_replicas=world, rank=rank, seed=seed, num_repeats=self.repeated_aug
            )
        else:
            if self.repeated_aug > 1:
                log.info(
                    "data.repeated_aug=%d applies under DDP (it spreads an image's copies over the ranks); "
                    "one process draws each image once per epoch",
                    self.repeated_aug,
                )
            sampler = EpochSampler(dataset, num_replicas=world, rank=rank, seed=seed)
        return ResumableLoader(
            dataset,
            sampler=sampler,
            batch_size=self.batch_size,
            generator=torch.Generator().manual_seed(seed),
            **common,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_dataset, train=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.val_dataset, train=False)

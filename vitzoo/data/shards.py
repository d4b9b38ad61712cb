"""``data=shards``: training from the litdata shards ``python -m vitzoo.data.pack`` writes, on a local disk or
object storage (``s3://``, ``gs://``, ... as litdata reads them, chunks cached in ``cache_dir``).

litdata splits the chunks among DDP ranks and nodes (disjoint) and among loader workers; the workers decode and
augment. Each training image's augmentation is seeded from (run seed, epoch, image index), as on the folder path;
the loader's position is checkpointed (litdata's ``StreamingDataLoader.state_dict``, which Lightning saves and puts
back), so a run resumed mid-epoch continues with the samples the uninterrupted run would have drawn, given the same
number of processes, workers and batch size (litdata re-stripes otherwise, and the order then differs).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Optional, Set, Tuple

import torch
from lightning.pytorch.utilities import rank_zero_only
from litdata import StreamingDataLoader, StreamingDataset

from vitzoo.options import ShardsDataOptions

from .datamodule import DEFAULT, ImageDataModule
from .native import collate_native
from .pack import META_NAME
from .sampling import sample_seed

__all__ = ["ShardsDataModule", "ShardDataset", "ShardLoader"]

log = logging.getLogger(__name__)
_WARNED: Set[int] = set()  # the data.repeated_aug values this process has warned about


class ShardDataset(StreamingDataset):
    """A packed split as (image tensor, label); ``augment``: seed each image's transform from (seed, epoch, index)."""

    def __init__(
        self, input_dir: str, transform, decode, *, augment: bool, seed: int = 0, cache_dir: Optional[str] = None
    ):
        super().__init__(input_dir, cache_dir=cache_dir, shuffle=augment, seed=seed)
        self.image_transform, self.decode, self.augment = transform, decode, augment  # litdata owns .transform

    def __getitem__(self, index) -> Tuple[torch.Tensor, int]:
        item = super().__getitem__(index)
        if self.augment:  # litdata hands a ChunkedIndex in iteration, an int to dataset[i]
            position = int(getattr(index, "index", index))
            self.image_transform.set_random_seed(sample_seed(self.seed, self.current_epoch, position))
        return self.image_transform(image=self.decode(item["image"]))["image"], int(item["label"])


class ShardLoader(StreamingDataLoader):
    """litdata's resumable loader, telling :class:`~vitzoo.training.resume.ExactResume` when it stopped mid-epoch."""

    def mid_epoch(self) -> bool:
        """Whether the epoch being drawn has begun and has batches left."""
        return 0 < self.state_dict()["num_samples_yielded"] < len(self) * self.batch_size


@rank_zero_only
def _warn_unapplied_repeats(repeated_aug: int) -> None:
    """Once per process, and on the first rank only: ``repeated_aug`` > 1 is not what data=shards runs."""
    if repeated_aug in _WARNED:
        return
    _WARNED.add(repeated_aug)
    log.warning(
        "data.repeated_aug=%d is not applied by data=shards (litdata draws each image once per epoch): set "
        "data.repeated_aug=1 to run without this warning, or use data=imagefolder for repeated augmentation",
        repeated_aug,
    )


class ShardsDataModule(ImageDataModule):
    """``root``: a folder or URL holding ``train/``, ``val/`` and ``vitzoo.json`` (the class names) as packed.
    ``num_classes``: null = from ``vitzoo.json`` (give it for a URL). ``cache_dir``: where litdata keeps chunks of a
    remote ``root`` (null: litdata's default). ``recipe`` defaults to ``deit``. Loader workers start afresh each
    epoch (each worker reads the epoch it augments for). ``native_resolution`` (with ``recipe: cifar``) as in
    :class:`~vitzoo.data.datamodule.ImageDataModule`."""

    options = ShardsDataOptions

    def __init__(
        self,
        root: str,
        img_size: int = DEFAULT,
        num_classes: Optional[int] = DEFAULT,
        cache_dir: Optional[str] = DEFAULT,
        mean=DEFAULT,
        std=DEFAULT,
        recipe: str = DEFAULT,
        **kwargs,
    ):
        super().__init__(img_size=img_size, mean=mean, std=std, recipe=recipe, **kwargs)
        num_classes, cache_dir = self.resolve(num_classes=num_classes, cache_dir=cache_dir).values()
        if self.device_cache:
            raise ValueError(
                "data=shards streams its images; set data.device_cache=false (the device path needs "
                "a decoded folder: data=imagefolder)"
            )
        self.root, self.cache_dir = str(root).rstrip("/"), cache_dir
        self.num_classes = num_classes or self._packed_classes()
        if self.repeated_aug > 1:
            _warn_unapplied_repeats(self.repeated_aug)

    def _packed_classes(self) -> int:
        meta = Path(os.path.expanduser(self.root)) / META_NAME
        if "://" in self.root or not meta.is_file():
            raise ValueError(
                f"data.root={self.root!r} has no {META_NAME}; pack an image folder first (python -m "
                f"vitzoo.data.pack SRC DST, then data.root=DST), or give data.num_classes for a URL"
            )
        return len(json.loads(meta.read_text())["classes"])

    def uses_device_cache(self) -> bool:
        return False

    def _split(self, name: str, recipe, augment: bool) -> ShardDataset:
        root = self.root if "://" in self.root else os.path.expanduser(self.root)
        return ShardDataset(
            f"{root}/{name}",
            self._transform(recipe, augment),
            recipe.decode,
            augment=augment,
            seed=int(os.environ.get("PL_GLOBAL_SEED", 0)),
            cache_dir=self.cache_dir,
        )

    def setup(self, stage: Optional[str] = None) -> None:
        recipe = self.build_recipe()
        if stage in (None, "fit") and self.train_dataset is None:
            self.train_dataset = self._split("train", recipe, augment=True)
            self._check_batch_size(len(self.train_dataset))
        if self.val_dataset is None:
            self.val_dataset = self._split("val", recipe, augment=False)

    def _loader(self, dataset: Optional[ShardDataset], train: bool) -> ShardLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a dataloader")
        return ShardLoader(
            dataset,
            batch_size=self.batch_size if train else self.eval_batch_size,
            drop_last=train,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory and self._device().type == "cuda",
            collate_fn=collate_native if self.native_resolution else None,
        )

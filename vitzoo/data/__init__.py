"""LightningDataModules (digits, CIFAR, image folders, synthetic) with albumentations pipelines."""

from vitzoo.extras import extra_error

try:
    from .cifar import CIFAR10DataModule, CIFAR100DataModule
    from .datamodule import ImageDataModule, ImageDataset, read_rgb
    from .digits import DigitsDataModule, digits_arrays
    from .imagefolder import ImageFolderDataModule
    from .synthetic import SyntheticDataModule
    from .transforms import POLICIES, build_eval_transform, build_train_transform, seed_worker
except ImportError as err:  # the core install: one line naming the extra
    raise extra_error("train", "vitzoo.data", err) from None

__all__ = [
    "ImageDataModule",
    "ImageDataset",
    "read_rgb",
    "DigitsDataModule",
    "digits_arrays",
    "CIFAR10DataModule",
    "CIFAR100DataModule",
    "ImageFolderDataModule",
    "SyntheticDataModule",
    "POLICIES",
    "build_train_transform",
    "build_eval_transform",
    "seed_worker",
]

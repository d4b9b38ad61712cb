"""CIFAR-10 / CIFAR-100 from torchvision's files (downloaded into ``root`` when allowed).

The val split is the official 10,000-image test set.
"""

from __future__ import annotations

import os

from torchvision.datasets import CIFAR10, CIFAR100

from vitzoo.models.default_cfg import CIFAR_MEAN, CIFAR_STD
from vitzoo.options import CIFARDataOptions

from .datamodule import DEFAULT, ImageDataModule

__all__ = ["CIFAR10DataModule", "CIFAR100DataModule"]

CIFAR100_MEAN, CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)


class CIFAR10DataModule(ImageDataModule):
    """CIFAR-10 at ``root`` (torchvision layout: ``root/cifar-10-batches-py``)."""

    num_classes = 10
    dataset_cls = CIFAR10
    folder = "cifar-10-batches-py"
    archive = "cifar-10-python.tar.gz"
    statistics = (CIFAR_MEAN, CIFAR_STD)  # the training split's channel mean and std, the default mean/std
    options = CIFARDataOptions

    def __init__(
        self,
        root: str = "data",
        download: bool = DEFAULT,
        img_size: int = DEFAULT,
        mean=None,
        std=None,
        **kwargs,
    ):
        super().__init__(
            img_size=img_size,
            mean=self.statistics[0] if mean is None else mean,
            std=self.statistics[1] if std is None else std,
            **kwargs,
        )
        self.root, self.download = os.fspath(root), self.resolve(download=download)["download"]

    def _missing(self, reason: str) -> FileNotFoundError:
        name = self.dataset_cls.__name__.replace("CIFAR", "CIFAR-")
        return FileNotFoundError(
            f"{name} is not under data.root={self.root!r} ({reason}). Download it once with data.download=true "
            f"on a machine with internet, or extract {self.archive} so that {self.root}/{self.folder} exists, "
            f"or train on a folder of images: data=imagefolder data.root=<dir with train/<class>/*>"
        )

    def prepare_data(self) -> None:
        if not self.download:
            return
        try:
            for train in (True, False):
                self.dataset_cls(self.root, train=train, download=True)
        except Exception as err:  # offline: URLError, OSError, ...
            raise self._missing(f"download failed: {type(err).__name__}: {err}") from err

    def load_split(self, split: str):
        try:
            data = self.dataset_cls(self.root, train=split == "train", download=False)
        except RuntimeError as err:  # torchvision: "Dataset not found or corrupted"
            raise self._missing("files missing or corrupted") from err
        return data.data, data.targets


class CIFAR100DataModule(CIFAR10DataModule):
    """CIFAR-100 (fine labels) at ``root`` (``root/cifar-100-python``)."""

    num_classes = 100
    dataset_cls = CIFAR100
    folder = "cifar-100-python"
    archive = "cifar-100-python.tar.gz"
    statistics = (CIFAR100_MEAN, CIFAR100_STD)

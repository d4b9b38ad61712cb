"""Where the corruption passes read their images: ``robustness.source=computed`` (the val split through
``corrupt``) or ``files`` (the released CIFAR-10-C / CIFAR-100-C / ImageNet-C files under ``robustness.root``,
as released, only normalised). Clean, logit-noise and resolution passes always read the val split.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence

from torch.utils.data import DataLoader, Subset

from .released import layout, released_corruptions, released_dataset

__all__ = ["SOURCES", "ReleasedFiles", "released_files"]

SOURCES = ("computed", "files")
PROTOCOL_OF_LAYOUT = {"cifar": "cifar", "imagenet": "imagenet"}
ROOT_HINT = (
    "the folder of CIFAR-10-C / CIFAR-100-C (<corruption>.npy, labels.npy) or of ImageNet-C "
    "(<corruption>/<severity>/<class>/*.JPEG)"
)


@dataclass(frozen=True)
class ReleasedFiles:
    """The released files of a sweep: ``loader(corruption, severity)`` yields ([0, 1] images, labels)."""

    root: Path
    layout: str  # "cifar" | "imagenet"
    image_size: tuple  # (H, W) of the files
    classes: Optional[Sequence[str]]
    batch_size: int
    num_workers: int
    max_images: Optional[int]

    @property
    def protocol(self) -> str:
        return PROTOCOL_OF_LAYOUT[self.layout]

    def loader(self, corruption: str, severity: int) -> Iterable:
        data = released_dataset(self.root, corruption, severity, self.classes)
        if self.max_images is not None:
            data = Subset(data, range(min(int(self.max_images), len(data))))
        return DataLoader(data, batch_size=self.batch_size, num_workers=self.num_workers)


def released_files(
    source: str,
    root: Optional[str],
    corruptions: Sequence[str],
    protocol: Optional[str],
    img_sizes: Dict[str, int],
    classes: Optional[Sequence[str]],
    batch_size: int,
    num_workers: int,
    max_images: Optional[int],
) -> Optional[ReleasedFiles]:
    """The files ``robustness.source`` / ``robustness.root`` name (None for ``computed``), checked before any pass:
    every chosen corruption is there, ``robustness.protocol`` (if given) is the files' own, and every checkpoint
    (``img_sizes``: label -> trained size) takes the files' image size. Each mismatch is one line naming the fix."""
    if source not in SOURCES:
        raise ValueError(
            f"robustness.source={source!r}; choose computed (corrupt the val split) or files "
            f"(the released files under robustness.root)"
        )
    if source == "computed":
        if root is not None:
            raise ValueError(
                f"robustness.root={root!r} is read only with robustness.source=files; add "
                f"robustness.source=files, or drop robustness.root to corrupt the val split"
            )
        return None
    if root is None:
        raise ValueError(f"robustness.source=files needs robustness.root=<{ROOT_HINT}>")
    folder = Path(root).expanduser()
    kind = layout(folder)
    present = released_corruptions(folder)
    missing = [c for c in corruptions if c not in present]
    if missing:
        raise ValueError(
            f"robustness.root={root!r} has no files for {missing}; it holds {present}: pass "
            f"robustness.corruptions=[{','.join(c for c in corruptions if c in present)}] or the root "
            f"that holds them"
        )
    if protocol is not None and protocol != PROTOCOL_OF_LAYOUT[kind]:
        raise ValueError(
            f"robustness.protocol={protocol} but robustness.root={root!r} holds the "
            f"{PROTOCOL_OF_LAYOUT[kind]} benchmark's files; drop robustness.protocol (the files fix it)"
        )
    if kind == "cifar" and classes is not None:
        classes = None  # CIFAR-10-C / CIFAR-100-C carry their labels in labels.npy
    size = ()
    if corruptions:
        image, _ = released_dataset(folder, corruptions[0], 1, classes)[0]
        size = tuple(image.shape[-2:])
        other = [f"{label} ({px} px)" for label, px in img_sizes.items() if (px, px) != size]
        if other:
            raise ValueError(
                f"robustness.root={root!r} holds {size[0]}x{size[1]} px images but {', '.join(other)} "
                f"took other sizes in training; evaluate checkpoints trained at {size[0]} px on these "
                f"files, or drop robustness.source=files to corrupt the val split at their own size"
            )
    return ReleasedFiles(folder, kind, size, classes, batch_size, num_workers, max_images)

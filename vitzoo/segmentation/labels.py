"""Raw mask values -> class indices, checked: every value must be a class, ``ignore_index``, or mapped.

``mask_values`` maps raw values to classes (``{0: 0, 255: 1}`` for 0/255 binary masks; a value mapped to
``ignore_index`` is ignored); ``binary_threshold`` makes class 1 of every value >= it (JPEG-compressed masks).
Without either, the raw value is the class. ``class_histogram`` + ``check_histogram`` catch a class count that
does not fit the masks before training starts. ``check_class_names`` checks ``data.class_names``.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

__all__ = ["LabelMap", "check_class_names", "class_histogram", "check_histogram", "format_histogram"]

log = logging.getLogger(__name__)
NAME = re.compile(r"[\w.-]+")


def check_class_names(names: Optional[Sequence[str]], num_classes: int) -> Tuple[str, ...]:
    """One name per class index (``class_0``, ``class_1``, ... when ``names`` is None), checked: as many as
    ``num_classes``, distinct, each of letters, digits, ``_ . -`` (they name metrics: ``iou/<name>``)."""
    if names is None:
        return tuple(f"class_{c}" for c in range(num_classes))
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        raise ValueError(
            f"data.class_names={names!r} is not a list; give one name per class, in class-index "
            f"order: data.class_names=[{','.join(f'name_{c}' for c in range(num_classes))}]"
        )
    names = tuple(str(name) for name in names)
    if len(names) != num_classes:
        raise ValueError(
            f"data.class_names has {len(names)} name(s) {list(names)} but data.num_classes="
            f"{num_classes}; give one name per class index 0..{num_classes - 1} (class 0 first)"
        )
    bad = next((name for name in names if not NAME.fullmatch(name)), None)
    if bad is not None:
        example = re.sub(r"[^\w.-]+", "_", bad).strip("_") or "class_0"
        raise ValueError(f"data.class_names holds {bad!r}; use letters, digits, '_', '.' or '-' only (e.g. {example})")
    if len(set(names)) < len(names):
        twice = next(name for name in names if names.count(name) > 1)
        raise ValueError(f"data.class_names names {twice!r} twice; give every class its own name")
    return names


class LabelMap:
    """Maps raw mask values to class indices in [0, num_classes) or ``ignore_index``; anything else is an error."""

    def __init__(
        self,
        num_classes: int,
        ignore_index: int = 255,
        mask_values: Optional[Mapping[int, int]] = None,
        binary_threshold: Optional[float] = None,
    ):
        if num_classes < 2:
            raise ValueError(
                f"data.num_classes={num_classes}; segmentation needs 2 or more classes, background "
                f"included (2 for foreground vs background)"
            )
        if 0 <= ignore_index < num_classes:
            raise ValueError(
                f"data.ignore_index={ignore_index} is one of the {num_classes} class indices; set it "
                f"outside 0..{num_classes - 1} (e.g. 255)"
            )
        if mask_values and binary_threshold is not None:
            raise ValueError("data.mask_values and data.binary_threshold both set; keep one of them")
        if binary_threshold is not None and num_classes != 2:
            raise ValueError(
                f"data.binary_threshold gives 2 classes but data.num_classes={num_classes}; set "
                f"data.num_classes=2 or use data.mask_values"
            )
        self.mapping = {int(k): int(v) for k, v in (mask_values or {}).items()}
        bad = {k: v for k, v in self.mapping.items() if not (0 <= v < num_classes or v == ignore_index)}
        if bad:
            raise ValueError(
                f"data.mask_values maps {bad} outside the classes 0..{num_classes - 1} and "
                f"ignore_index={ignore_index}; map every value to a class or to {ignore_index}"
            )
        self.num_classes, self.ignore_index, self.binary_threshold = num_classes, ignore_index, binary_threshold

    def __call__(self, raw: np.ndarray, path: Union[str, Path] = "mask") -> np.ndarray:
        """Class indices (int64, same shape) of a raw mask read from ``path`` (named in errors)."""
        if self.binary_threshold is not None:
            return (raw >= self.binary_threshold).astype(np.int64)
        values = np.unique(raw)
        if self.mapping:
            unknown = [int(v) for v in values if int(v) not in self.mapping]
            if unknown:
                raise ValueError(
                    f"{path} holds values {unknown[:5]} that data.mask_values {self.mapping} does not "
                    f"map; add them (value: class, or value: {self.ignore_index} to ignore)"
                )
            keys = np.array(sorted(self.mapping))
            return np.array([self.mapping[int(k)] for k in keys], dtype=np.int64)[np.searchsorted(keys, raw)]
        bad = [int(v) for v in values if not (0 <= v < self.num_classes or v == self.ignore_index)]
        if bad:
            raise ValueError(
                f"{path} holds values {bad[:5]} outside the classes 0..{self.num_classes - 1} and "
                f"ignore_index={self.ignore_index}; {self._hint(values)}"
            )
        return raw.astype(np.int64)

    def _hint(self, values: np.ndarray) -> str:
        if len(values) == 2:
            low, high = (int(v) for v in values)
            return (
                f"for binary masks map them to classes, the object to 1: data.mask_values='{{{low}: 0, "
                f"{high}: 1}}' if {high} marks the object ('{{{low}: 1, {high}: 0}}' if {low} does; or "
                f"data.binary_threshold={(low + high) // 2 + 1}) with data.num_classes=2"
            )
        return (
            "set data.num_classes to cover them, map values to classes with data.mask_values='{value: class}', "
            "or mark unlabeled pixels with data.ignore_index"
        )

    def to_source(self, classes: np.ndarray) -> np.ndarray:
        """Predicted class indices written in the masks' own values (the first raw value of each class;
        255 for class 1 of a thresholded binary mask)."""
        if self.binary_threshold is not None:
            return classes * 255
        if not self.mapping:
            return classes
        first = {}
        for raw, cls in sorted(self.mapping.items()):
            first.setdefault(cls, raw)
        lookup = np.array([first.get(c, c) for c in range(self.num_classes)], dtype=np.int64)
        return lookup[classes]


def class_histogram(masks: Iterable[np.ndarray], num_classes: int, ignore_index: int) -> np.ndarray:
    """Pixels per class, with the ``ignore_index`` pixels last: shape (num_classes + 1,)."""
    counts = np.zeros(num_classes + 1, dtype=np.int64)
    for mask in masks:
        counts[:num_classes] += np.bincount(mask[mask != ignore_index].ravel(), minlength=num_classes)
        counts[num_classes] += int((mask == ignore_index).sum())
    return counts


def format_histogram(counts: np.ndarray, names: Sequence[str]) -> str:
    """``interior 78.1%, membrane 21.9%, ignored 0.0%`` (shares of all pixels; ``names`` one per class)."""
    total = max(1, int(counts.sum()))
    names = list(names) + ["ignored"]
    return ", ".join(f"{name} {100 * n / total:.1f}%" for name, n in zip(names, counts))


def check_histogram(train: np.ndarray, val: np.ndarray, labels: LabelMap) -> None:
    """Error when ``num_classes`` does not fit the masks (its top classes never occur); warn on classes the
    training masks lack."""
    num_classes = labels.num_classes
    present = np.flatnonzero((train + val)[:num_classes])
    if not present.size or present.max() < num_classes - 1:
        top = int(present.max()) if present.size else -1
        ignored = train[num_classes] / max(1, int(train.sum()))
        hint = (
            (
                f"; {100 * ignored:.0f}% of the training pixels equal ignore_index={labels.ignore_index}: if "
                f"{labels.ignore_index} marks a class, map it, e.g. data.mask_values='{{0: 0, "
                f"{labels.ignore_index}: 1}}'"
            )
            if ignored > 0
            else ""
        )
        absent = f"{top + 1}" if top + 2 == num_classes else f"{top + 1}..{num_classes - 1}"
        fix = f"set data.num_classes={top + 1}" if top >= 1 else "check the masks and data.mask_values"
        raise ValueError(f"data.num_classes={num_classes} but the masks hold no pixel of class {absent} ({fix}){hint}")
    missing = [c for c in range(num_classes) if train[c] == 0]
    if missing:
        log.warning("the training masks hold no pixel of class(es) %s; the model cannot learn them", missing)

"""Transform recipes: ``cifar`` (the albumentations pipelines of :mod:`~vitzoo.data.transforms`) and ``deit``
(timm's ImageNet transforms: DeiT's training augmentation, and the evaluation resize-then-center-crop that a
model's ``pretrained_cfg`` describes).

A recipe gives a data module three things: how an image file is read, the training transform and the eval
transform. ``data.aug`` holds the chosen recipe's training options over its defaults (:func:`recipe_aug`, the one
place that rule is applied): ``None`` or a missing key takes the recipe's default (``cifar``:
:class:`~vitzoo.options.CifarAugOptions`; ``deit``: ``DEIT_AUG``), a key the recipe lacks is a one-line error.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, Sequence

import numpy as np
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from timm.data.auto_augment import AugmentOp
from timm.models import get_pretrained_cfg

from vitzoo.options import CifarAugOptions, reject_unknown

from .images import decode_rgb, read_rgb
from .transforms import build_eval_transform, build_train_transform

__all__ = [
    "RECIPES",
    "DEIT_AUG",
    "Recipe",
    "check_recipe",
    "recipe_defaults",
    "recipe_aug",
    "build_recipe",
    "eval_transform_fields",
    "SeededTransform",
    "read_pil",
    "decode_pil",
    "source_pretrained_cfg",
]

RECIPES = ("cifar", "deit")
# DeiT's training augmentation (Touvron et al. 2021, its main.py defaults) as timm.data.create_transform arguments;
# timm applies color_jitter only when auto_augment is off
DEIT_AUG = dict(
    scale=(0.08, 1.0),
    ratio=(3 / 4, 4 / 3),
    hflip=0.5,
    auto_augment="rand-m9-mstd0.5-inc1",
    color_jitter=0.4,
    interpolation="bicubic",
    re_prob=0.25,
    re_mode="pixel",
    re_count=1,
)


def read_pil(path) -> Image.Image:
    """An image file as an RGB PIL image, decoded as timm's and torchvision's datasets decode it."""
    with Image.open(path) as image:
        return image.convert("RGB")


def decode_pil(data: bytes) -> Image.Image:
    """An encoded image (a file's bytes) as :func:`read_pil` reads the file."""
    return read_pil(io.BytesIO(data))


def posterize(image: Image.Image, bits_to_keep: int, **_) -> Image.Image:
    """timm's posterize op keeping 0 bits as it was written for (a black image): Pillow 13 refuses 0 bits, which
    RandAugment's ``PosterizeIncreasing`` asks for whenever a magnitude draw reaches 10 (m9 mstd0.5: 2% of draws)."""
    if bits_to_keep >= 8:
        return image
    mask = ~(2 ** (8 - bits_to_keep) - 1) & 0xFF
    return image.point([value & mask for value in range(256)] * len(image.getbands()))


def _any_bits_posterize(transform) -> None:
    """Every posterize op inside ``transform`` (timm's RandAugment, AutoAugment, AugMix) uses :func:`posterize`."""
    for step in getattr(transform, "transforms", []):
        ops = [*getattr(step, "ops", []), *(op for sub in getattr(step, "policy", []) for op in sub)]
        for op in ops:
            if isinstance(op, AugmentOp) and op.name.startswith("Posterize"):
                op.aug_fn = posterize


class SeededTransform:
    """A torchvision-style transform (PIL image -> tensor) with albumentations' calling convention
    (``transform(image=...)["image"]``, ``set_random_seed``), so :class:`~vitzoo.data.ImageDataset` drives both.

    timm's transforms draw from Python's ``random``, NumPy's and torch's global generators; a seed given with
    :meth:`set_random_seed` seeds all three for the next call only, and the callers' generator states are put back
    afterwards (training's own draws, dropout and mixup, do not see the augmentation's).
    """

    def __init__(self, transform: Callable[[Image.Image], torch.Tensor]):
        self.transform, self.seed = transform, None

    def set_random_seed(self, seed: int) -> None:
        self.seed = int(seed)

    def __call__(self, *, image) -> dict:
        if isinstance(image, np.ndarray):
            image = Image.fromarray(image)
        seed, self.seed = self.seed, None
        if seed is None:
            return {"image": self.transform(image)}
        python, numpy = random.getstate(), np.random.get_state()
        try:
            with torch.random.fork_rng(devices=[]):
                random.seed(seed)
                np.random.seed(seed)
                torch.manual_seed(seed)
                return {"image": self.transform(image)}
        finally:
            random.setstate(python)
            np.random.set_state(numpy)

    def __repr__(self) -> str:
        return f"SeededTransform({self.transform})"


def check_recipe(name: str) -> None:
    """A one-line error unless ``name`` is one of ``RECIPES``."""
    if name not in RECIPES:
        raise ValueError(f"data.recipe={name!r} is not a recipe; set data.recipe to one of {list(RECIPES)}")


def recipe_defaults(name: str) -> Dict[str, Any]:
    """The training options of recipe ``name`` at their defaults (a fresh mapping)."""
    check_recipe(name)
    return asdict(CifarAugOptions()) if name == "cifar" else dict(DEIT_AUG)


def recipe_aug(name: str, aug: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Every training option of recipe ``name``: ``aug`` (``data.aug``) over :func:`recipe_defaults`; ``None`` or
    ``{}`` = the defaults. A key the recipe lacks is a ``ValueError`` naming the recipe's keys."""
    defaults, aug = recipe_defaults(name), dict(aug or {})
    reject_unknown(f"data.aug (data.recipe={name})", aug, defaults)
    return {**defaults, **aug}


@dataclass
class Recipe:
    """What a data module reads and applies: ``read`` (path -> image), ``decode`` (a file's bytes -> image),
    ``train`` and ``eval`` transforms."""

    read: Callable[[Any], Any]
    decode: Callable[[bytes], Any]
    train: Callable
    eval: Callable


def build_recipe(
    name: str,
    img_size: int,
    mean: Sequence[float],
    std: Sequence[float],
    aug: Optional[Mapping[str, Any]] = None,
    crop_pct: Optional[float] = None,
    interpolation: Optional[str] = None,
    pretrained_cfg: Optional[Mapping[str, Any]] = None,
) -> Recipe:
    """The recipe ``name`` at ``img_size`` px.

    ``aug`` holds the recipe's training options over its defaults (:func:`recipe_aug`). ``cifar``: the options of
    :func:`~vitzoo.data.build_train_transform`; evaluation squashes to ``img_size`` square. ``deit``: timm
    ``create_transform`` arguments over ``DEIT_AUG``; evaluation is timm's: resize the short side to
    ``img_size / crop_pct`` and center-crop ``img_size``, with ``crop_pct`` and ``interpolation`` from the
    arguments, else ``pretrained_cfg``, else timm's defaults (``resolve_data_config``).
    """
    options = recipe_aug(name, aug)
    if name == "cifar":
        if crop_pct is not None or interpolation is not None:
            raise ValueError(
                "data.crop_pct and data.interpolation belong to data.recipe=deit (the cifar recipe "
                "squashes to img_size); drop them or set data.recipe=deit"
            )
        return Recipe(
            read_rgb,
            decode_rgb,
            build_train_transform(img_size, mean, std, **options),
            build_eval_transform(img_size, mean, std),
        )
    train = create_transform(img_size, is_training=True, mean=tuple(mean), std=tuple(std), **options)
    _any_bits_posterize(train)
    crop = eval_transform_fields(name, img_size, crop_pct, interpolation, pretrained_cfg)
    del crop["recipe"]
    evaluation = create_transform(img_size, mean=tuple(mean), std=tuple(std), **crop, is_training=False)
    return Recipe(read_pil, decode_pil, SeededTransform(train), SeededTransform(evaluation))


def eval_transform_fields(
    name: str,
    img_size: int,
    crop_pct: Optional[float] = None,
    interpolation: Optional[str] = None,
    pretrained_cfg: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """What recipe ``name``'s eval transform depends on besides the size and statistics, as plain values (what a
    checkpoint records): ``{"recipe": "cifar"}``, or the deit recipe's ``crop_pct``, ``interpolation`` and
    ``crop_mode`` resolved as :func:`build_recipe` resolves them (the arguments, else ``pretrained_cfg``, else
    timm's defaults)."""
    check_recipe(name)
    if name == "cifar":
        return {"recipe": name}
    config = resolve_data_config(
        dict(input_size=(3, img_size, img_size), crop_pct=crop_pct, interpolation=interpolation),
        pretrained_cfg=dict(pretrained_cfg or {}),
    )
    return {
        "recipe": name,
        "crop_pct": float(config["crop_pct"]),
        "interpolation": str(config["interpolation"]),
        "crop_mode": str(config["crop_mode"]),
    }


def source_pretrained_cfg(init_from: Optional[str], model: torch.nn.Module) -> Mapping[str, Any]:
    """The ``pretrained_cfg`` describing a run's inputs: timm's for ``init_from=timm:<name>``, the export's for an
    export folder, else the model's own."""
    timm_cfg = get_pretrained_cfg(str(init_from)[len("timm:") :]) if str(init_from).startswith("timm:") else None
    if timm_cfg is not None:
        return timm_cfg.to_dict()
    config = Path(str(init_from)) / "config.json" if init_from else None
    if config is not None and config.is_file():
        return json.loads(config.read_text()).get("pretrained_cfg") or {}
    return dict(getattr(model, "pretrained_cfg", None) or {})

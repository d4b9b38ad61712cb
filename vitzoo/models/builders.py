"""What the pyramid builders (PVT, PVTv2, Swin, MLLA, RAVLT) share: their ImageNet ``pretrained_cfg`` and one build
through timm's ``build_model_with_cfg`` (the local-dir weights check, the variant's shape, features at strides 4-32)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch.nn as nn
from timm.layers import trunc_normal_

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg

from .default_cfg import ZOO_CFG
from .local_dir import verify_local_dir
from .registry import timm_name

__all__ = ["imagenet_cfg", "build_pyramid", "trunc_normal_init"]


def imagenet_cfg(**kwargs) -> Dict[str, Any]:
    """A pyramid's ``pretrained_cfg``: ImageNet's statistics, bicubic, crop 0.9, any input size; ``kwargs`` its own
    (``first_conv``, ``classifier``, ``pool_size``...)."""
    return {
        **ZOO_CFG,
        "pool_size": None,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "mean": IMAGENET_DEFAULT_MEAN,
        "std": IMAGENET_DEFAULT_STD,
        "fixed_input_size": False,
        **kwargs,
    }


def build_pyramid(
    cls: type,
    short: str,
    pretrained: bool,
    kwargs: Dict[str, Any],
    shapes: Mapping[str, Dict[str, Any]],
    feature_cfg: Dict[str, Any],
    filter_fn: Optional[Callable] = None,
    attention: Any = None,
):
    """``cls`` as the variant ``short`` (its ``shapes`` entry under ``kwargs``), features at ``out_indices``
    (default all four stages); ``attention``: the model's own, checked against a local-dir weights file's."""
    verify_local_dir(
        pretrained,
        kwargs.get("pretrained_cfg"),
        kwargs.get("pretrained_cfg_overlay"),
        kwargs.get("attention", attention),
    )
    kwargs = {**shapes[short], **kwargs}
    out_indices = kwargs.pop("out_indices", (0, 1, 2, 3))
    return build_model_with_cfg(
        cls,
        timm_name(short),
        pretrained,
        pretrained_filter_fn=filter_fn,
        feature_cfg={**feature_cfg, "out_indices": out_indices},
        **kwargs,
    )


def trunc_normal_init(module: nn.Module, kinds: Tuple[type, ...] = (nn.Linear,)) -> None:
    """The official codes' init (``model.apply``): weights of ``kinds`` trunc-normal (std 0.02) with bias 0,
    LayerNorms 1 / 0; every other module as PyTorch makes it."""
    if isinstance(module, kinds):
        layer: Any = module  # a Linear or conv: weight and bias
        trunc_normal_(layer.weight, std=0.02)
        if layer.bias is not None:
            nn.init.zeros_(layer.bias)
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)

"""Backbones assembled from timm blocks, registered with timm's ``register_model``."""
from __future__ import annotations

import timm
import torch.nn as nn

from vitzoo.attention import AttentionSpec
from .nonlocal_resnet import NonLocalBlock, NonLocalResNet
from .vit import VIT_ARCHS, ZooVisionTransformer, default_feature_levels

__all__ = ["create_model", "list_models", "ZooVisionTransformer", "NonLocalResNet", "NonLocalBlock",
           "default_feature_levels"]

_ARCHS = tuple(VIT_ARCHS) + ("nonlocal_resnet18", "nonlocal_resnet50", "nonlocal_resnet18_cifar")


def list_models() -> list:
    """Sorted names of the zoo's architectures (each also reachable via ``timm.create_model``)."""
    return sorted(_ARCHS)


def create_model(arch: str, attention: AttentionSpec = "softmax", **kwargs) -> nn.Module:
    """Build ``arch`` with ``attention`` (a name or ``{"name": ..., options}``); kwargs go to timm."""
    if arch not in _ARCHS:
        raise ValueError(f"unknown architecture {arch!r}; choose one of {list_models()}")
    try:
        return timm.create_model(arch, attention=attention, **kwargs)
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        raise ValueError(f"{arch}: {err}; check the spelling of the model's keyword arguments "
                         f"(train.py: model.kwargs.*), timm's {arch} signature lists them") from None

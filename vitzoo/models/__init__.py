"""Backbones assembled from timm blocks, registered with timm's ``register_model``."""

from __future__ import annotations

import os
from typing import Optional, Union

import timm
import torch.nn as nn

from vitzoo.attention import AttentionSpec
from . import pvt, pvt_v2, releases, swin  # noqa: F401  (register the architectures)
from . import mlla, ravlt  # noqa: F401  (register the architectures)
from .nonlocal_resnet import NonLocalBlock, NonLocalResNet
from .init_from import initialise_from
from .pretrained import LoadReport
from .registry import timm_name, zoo_names
from .vit import VIT_ARCHS, ZooVisionTransformer, default_feature_levels

__all__ = [
    "create_model",
    "list_models",
    "ZooVisionTransformer",
    "NonLocalResNet",
    "NonLocalBlock",
    "default_feature_levels",
    "initialise_from",
    "LoadReport",
]

_ARCHS = tuple(VIT_ARCHS) + ("nonlocal_resnet18", "nonlocal_resnet50", "nonlocal_resnet18_cifar")


def list_models() -> list:
    """Sorted names of the zoo's architectures (each also reachable via ``timm.create_model``; those registered
    through ``vitzoo.models.registry`` under timm's name ``vitzoo_<name>``)."""
    return sorted(set(_ARCHS) | set(zoo_names()))


def create_model(
    arch: str,
    attention: Optional[AttentionSpec] = None,
    init_from: Optional[Union[str, os.PathLike]] = None,
    **kwargs,
) -> nn.Module:
    """Build ``arch`` with ``attention`` (a name, ``{"name": ..., options}``, or a stack); kwargs go to timm.

    ``attention=None`` builds the architecture's own: softmax for the ViTs, ResNets and PVTs, Swin's windowed
    attention for Swin, the release's mix for a published model (``flatten_pvt_tiny``, ...).

    ``init_from``: a pretrained softmax ViT whose weights initialise the model, whatever its mechanism
    (``timm:<model>.<tag>``, a timm ``VisionTransformer`` state dict file, or a vitzoo export folder; see
    ``vitzoo.models.pretrained``). What was loaded is logged in one line.
    """
    if arch not in list_models():
        raise ValueError(f"unknown architecture {arch!r}; choose one of {list_models()}")
    model = _build(arch, attention, kwargs)
    if init_from is not None:
        initialise_from(model, init_from)
    return model


def _build(arch: str, attention: Optional[AttentionSpec], kwargs: dict) -> nn.Module:
    name = timm_name(arch) if arch in zoo_names() else arch
    if attention is not None:
        kwargs = {**kwargs, "attention": attention}
    try:
        return timm.create_model(name, **kwargs)
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        raise ValueError(
            f"{arch}: {err}; check the spelling of the model's keyword arguments (create_model's "
            f"**kwargs): timm's {arch} signature lists them"
        ) from None

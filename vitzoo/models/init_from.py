"""``init_from``: pretrained softmax weights into a model of any mechanism, by the model's kind (one line logged)."""

from __future__ import annotations

import os
from typing import Union

import torch.nn as nn

from .pretrained import LoadReport
from .pretrained import initialise_from as initialise_vit
from .pretrained_pyramid import initialise_pyramid
from .pvt import PyramidVisionTransformer
from .pvt_v2 import ZooPvtV2
from .staged import StagedNet
from .swin import ZooSwinTransformer

__all__ = ["initialise_from"]

PYRAMIDS = (PyramidVisionTransformer, ZooPvtV2, ZooSwinTransformer, StagedNet)


def initialise_from(model: nn.Module, source: Union[str, os.PathLike]) -> LoadReport:
    """A pyramid (PVT, PVTv2, Swin, MLLA, RAVLT) from its family's softmax weights
    (``vitzoo.models.pretrained_pyramid``), a ViT from a softmax ViT's (``vitzoo.models.pretrained``)."""
    if isinstance(model, PYRAMIDS):
        return initialise_pyramid(model, source)
    return initialise_vit(model, source)

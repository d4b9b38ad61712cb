"""ViTDet's simple feature pyramid (Li et al. 2022): four scales from a plain ViT's last, single-stride map."""

from __future__ import annotations

from typing import List, Sequence

import torch
import torch.nn as nn
from timm.layers import LayerNorm2d

__all__ = ["NECKS", "SimpleFeaturePyramid", "check_neck"]

NECKS = ("simple_fpn",)
SCALES = (4.0, 2.0, 1.0, 0.5)  # of the patch-stride map: strides patch/4, patch/2, patch, 2 * patch


def check_neck(neck, reductions: Sequence[float]) -> None:
    """One-line errors for a ``module.neck`` that is unknown or meets a backbone that has a pyramid already."""
    if neck is None:
        return
    if neck not in NECKS:
        raise ValueError(f"module.neck={neck!r}; choose one of {'|'.join(NECKS)} or null")
    if len(set(reductions)) > 1:
        raise ValueError(
            f"module.neck={neck} builds a pyramid from a plain ViT's single-stride map, but this backbone "
            f"has its own (strides {list(reductions)}); drop module.neck (null)"
        )


def _upsample(dim: int, scale: float) -> nn.Module:
    """Transposed 2x2 convs (stride 2) halving the channels each time, LayerNorm + GELU between them;
    identity at scale 1, a 2x2 max-pool at scale 0.5."""
    if scale == 0.5:
        return nn.MaxPool2d(2, ceil_mode=True)
    layers: List[nn.Module] = []
    while scale > 1:
        if layers:
            layers += [LayerNorm2d(dim), nn.GELU()]
        layers.append(nn.ConvTranspose2d(dim, dim // 2, 2, stride=2))
        dim, scale = dim // 2, scale / 2
    return nn.Sequential(*layers)


class SimpleFeaturePyramid(nn.Module):
    """The last feature map (stride p, ``dim`` channels) -> maps at strides p/4, p/2, p, 2p, ``channels`` each.

    Every scale: re-sampled (``_upsample``), then a 1x1 and a 3x3 conv, each followed by LayerNorm2d, as in
    ViTDet. ``reduction()`` and ``channels()`` describe the outputs like timm's ``feature_info``.
    """

    def __init__(self, dim: int, patch_stride: float, channels: int = 128, scales: Sequence[float] = SCALES):
        super().__init__()
        self.scales, self.patch_stride, self.out_channels = tuple(scales), patch_stride, channels
        self.resample = nn.ModuleList(_upsample(dim, s) for s in self.scales)
        dims = [dim // int(s) if s > 1 else dim for s in self.scales]
        self.out = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(d, channels, 1, bias=False),
                LayerNorm2d(channels),
                nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                LayerNorm2d(channels),
            )
            for d in dims
        )

    def reduction(self) -> List[float]:
        return [self.patch_stride / s for s in self.scales]

    def channels(self) -> List[int]:
        return [self.out_channels] * len(self.scales)

    def forward(self, features: List[torch.Tensor]) -> List[torch.Tensor]:
        last = features[-1]
        return [out(resample(last)) for resample, out in zip(self.resample, self.out)]

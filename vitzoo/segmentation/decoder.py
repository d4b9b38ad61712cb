"""A light decoder over multi-level NCHW features: SegFormer's all-MLP head."""

from __future__ import annotations

from typing import List, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MLPDecoder"]


class MLPDecoder(nn.Module):
    """Project every level to ``channels`` (1x1), upsample to the finest level, fuse, classify.

    Serves plain ViTs (all levels at the patch stride, from different depths) and pyramids
    (ResNet strides 4..32) alike. Returns logits at the finest level's resolution.
    """

    def __init__(self, in_channels: Sequence[int], num_classes: int, channels: int = 128, dropout: float = 0.1):
        super().__init__()
        self.proj = nn.ModuleList(nn.Conv2d(c, channels, 1) for c in in_channels)
        self.fuse = nn.Sequential(
            nn.Conv2d(channels * len(in_channels), channels, 1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(inplace=True),
        )
        self.dropout = nn.Dropout2d(dropout)
        self.classifier = nn.Conv2d(channels, num_classes, 1)

    def forward(self, features: List[torch.Tensor]) -> torch.Tensor:
        size = max((f.shape[-2:] for f in features), key=lambda s: s[0] * s[1])
        levels = [proj(f) for proj, f in zip(self.proj, features)]
        levels = [
            x if x.shape[-2:] == size else F.interpolate(x, size=size, mode="bilinear", align_corners=False)
            for x in levels
        ]
        return self.classifier(self.dropout(self.fuse(torch.cat(levels, dim=1))))

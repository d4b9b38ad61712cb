"""Decoders over multi-level NCHW features: SegFormer's all-MLP head, and smp's U-Net decoder with a pixel stem."""

from __future__ import annotations

from typing import List, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["DECODERS", "MLPDecoder", "UNetDecoder", "pixel_stem"]

DECODERS = ("mlp", "unet", "unet+stem")  # module.decoder
UNET_CHANNELS = (256, 128, 64, 32, 16)  # smp's U-Net decoder, strides 16, 8, 4, 2, 1


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


def pixel_stem(in_channels: int, channels: int) -> nn.Module:
    """Two 3x3 convolutions (BatchNorm, ReLU) of the pixels, the first of stride 2: the stride-2 level a pyramid
    lacks (it starts at stride 4), as a ResNet's first conv provides it to a U-Net."""
    from segmentation_models_pytorch.base.modules import Conv2dReLU

    return nn.Sequential(
        Conv2dReLU(in_channels, channels, 3, padding=1, stride=2),
        Conv2dReLU(channels, channels, 3, padding=1),
    )


class UNetDecoder(nn.Module):
    """smp's U-Net decoder over a pyramid's four levels (strides 4-32), decoded to stride 1 (``UNET_CHANNELS``) and
    classified by a 3x3 conv, as ``smp.Unet("tu-<pyramid>")`` builds it: its stride-2 level empty, or with ``stem``
    channels a :func:`pixel_stem` there. ``forward(images, features)`` takes the normalised images and the levels;
    logits at the images' size."""

    def __init__(self, in_channels: Sequence[int], num_classes: int, stem: int = 0, image_channels: int = 3):
        super().__init__()
        from segmentation_models_pytorch.base.heads import SegmentationHead
        from segmentation_models_pytorch.base.initialization import initialize_decoder, initialize_head
        from segmentation_models_pytorch.decoders.unet.decoder import UnetDecoder

        self.stem = pixel_stem(image_channels, stem) if stem else None
        self.decoder = UnetDecoder([image_channels, stem, *in_channels], UNET_CHANNELS, len(UNET_CHANNELS))
        self.head = SegmentationHead(UNET_CHANNELS[-1], num_classes, kernel_size=3)
        initialize_decoder(self.decoder)
        initialize_head(self.head)

    def forward(self, images: torch.Tensor, features: List[torch.Tensor]) -> torch.Tensor:
        B, _, H, W = images.shape
        half = self.stem(images) if self.stem is not None else images.new_empty(B, 0, H // 2, W // 2)
        return self.head(self.decoder([images, half, *features]))

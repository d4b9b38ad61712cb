"""Segmentation network: a ``features_only`` backbone (an export, or a zoo architecture), an optional neck
(``simple_fpn``: ViTDet's pyramid for a plain ViT) and a decoder (``MLPDecoder``, or ``UNetDecoder`` for a pyramid)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F

import vitzoo
from vitzoo.attention import AttentionSpec
from vitzoo.export import load_exported

from .decoder import DECODERS, MLPDecoder, UNetDecoder
from .neck import SimpleFeaturePyramid, check_neck

__all__ = ["SegmentationNet", "create_backbone"]

_LOCAL = "local-dir:"


def create_backbone(
    backbone: str,
    attention: Optional[AttentionSpec] = None,
    out_indices: Optional[Sequence[int]] = None,
    model_kwargs: Optional[Mapping[str, Any]] = None,
    in_chans: int = 3,
) -> nn.Module:
    """A ``features_only`` backbone: an export dir (path or ``local-dir:<path>``, its weights loaded,
    its attention fixed) or a name from ``vitzoo.list_models()`` (random init, ``attention`` applies).
    ``in_chans=1`` on a 3-channel export sums its first conv over the channels (timm's ``adapt_input_conv``)."""
    kwargs = dict(model_kwargs or {}, features_only=True, in_chans=in_chans)
    if out_indices is not None:
        kwargs["out_indices"] = tuple(out_indices)
    path = backbone[len(_LOCAL) :] if backbone.startswith(_LOCAL) else backbone
    if Path(path).is_dir():
        if attention is not None:
            raise ValueError(
                f"backbone {backbone!r} is an export whose attention is fixed by its config.json; "
                f"drop the attention option"
            )
        return load_exported(path, **kwargs)
    if backbone in vitzoo.list_models():
        return vitzoo.create_model(backbone, attention=attention or "softmax", **kwargs)
    raise ValueError(
        f"backbone {backbone!r} is neither an export directory nor an architecture; pass the "
        f"directory written by `python -m vitzoo.export` or one of {vitzoo.list_models()}"
    )


def _first_conv(backbone: nn.Module) -> nn.Conv2d:
    return next(m for m in backbone.modules() if isinstance(m, nn.Conv2d))


def _per_channel(stats: Sequence[float], in_chans: int) -> torch.Tensor:
    """The backbone's mean or std for ``in_chans`` inputs: as is, averaged to one channel (grayscale input
    to an RGB backbone, whose first conv timm sums over channels), or one value repeated."""
    values = torch.tensor(stats, dtype=torch.float32)
    if len(values) != in_chans:
        values = values.mean().expand(in_chans)
    return values.reshape(1, -1, 1, 1).clone()


class SegmentationNet(nn.Module):
    """images in [0, 1] (B, C, H, W) -> class logits (B, num_classes, H, W).

    Normalises with the backbone's ``pretrained_cfg`` mean/std (averaged for a 1-channel input to an RGB
    backbone), so data pipelines stay in [0, 1]. A pyramid's four levels (PVT, PVTv2, Swin, MLLA, RAVLT: strides
    4-32) feed the decoder as they are (Swin's channels-last maps turned to NCHW).
    H and W must be multiples of the backbone's largest feature stride (the patch size for a ViT).
    ``neck="simple_fpn"`` feeds the decoder ViTDet's pyramid (strides p/4 .. 2p) built from a plain ViT's
    last map instead of the backbone's levels; a backbone with a pyramid of its own refuses it.
    ``decoder="unet"`` decodes a pyramid's levels (strides 4, 8, 16, 32) with smp's U-Net decoder up to stride 1,
    ``"unet+stem"`` with a pixel stem at stride 2 too (``UNetDecoder``; ``channels`` and ``dropout`` are the MLP
    decoder's).
    """

    def __init__(
        self,
        backbone: nn.Module,
        num_classes: int,
        channels: int = 128,
        dropout: float = 0.1,
        neck: Optional[str] = None,
        decoder: str = "mlp",
    ):
        super().__init__()
        self.backbone = backbone
        reductions = backbone.feature_info.reduction()
        check_neck(neck, reductions)
        check_decoder(decoder, neck, reductions)
        self.stride = max(reductions)
        self.channels_last = getattr(backbone, "output_fmt", "NCHW") == "NHWC"  # timm's Swin features
        self.neck = SimpleFeaturePyramid(backbone.feature_info.channels()[-1], self.stride, channels) if neck else None
        levels = self.neck.channels() if neck else backbone.feature_info.channels()
        self.in_chans = _first_conv(backbone).in_channels
        self.unet = decoder.startswith("unet")
        if self.unet:
            stem = 32 if decoder == "unet+stem" else 0
            self.decoder: nn.Module = UNetDecoder(levels, num_classes, stem, image_channels=self.in_chans)
        else:
            self.decoder = MLPDecoder(levels, num_classes, channels, dropout)
        cfg = backbone.pretrained_cfg
        self.register_buffer("mean", _per_channel(cfg["mean"], self.in_chans), persistent=False)
        self.register_buffer("std", _per_channel(cfg["std"], self.in_chans), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        H, W = images.shape[-2:]
        if H % self.stride or W % self.stride:
            raise ValueError(
                f"input {H}x{W} is not divisible by the backbone stride {self.stride}; "
                f"resize or crop to a multiple of {self.stride} (data.img_size)"
            )
        images = (images - self.mean) / self.std
        features = self.backbone(images)
        if self.channels_last:
            features = [f.permute(0, 3, 1, 2) for f in features]
        if self.unet:
            return self.decoder(images, features)
        logits = self.decoder(self.neck(features) if self.neck is not None else features)
        return F.interpolate(logits, size=(H, W), mode="bilinear", align_corners=False)


def check_decoder(decoder: str, neck: Optional[str], reductions: Sequence[float]) -> None:
    """One-line errors for a ``module.decoder`` that is unknown, or a U-Net on levels that are not strides 4-32."""
    if decoder not in DECODERS:
        raise ValueError(f"module.decoder={decoder!r}; choose one of {'|'.join(DECODERS)}")
    if decoder.startswith("unet") and (neck is not None or list(reductions) != [4, 8, 16, 32]):
        raise ValueError(
            f"module.decoder={decoder} decodes a pyramid's levels at strides 4, 8, 16, 32, not {list(reductions)}"
            f"{' through module.neck' if neck else ''}; use a pyramid export (docs/pyramids.md) and no module.neck, "
            f"or module.decoder=mlp"
        )

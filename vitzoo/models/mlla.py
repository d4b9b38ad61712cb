"""MLLA-T / MLLA-S (Han et al., NeurIPS 2024, "Demystify Mamba in Vision"; LeapLabTHU/MLLA ``models/mlla.py``) as the
official code builds them: a convolutional stem to stride 4, MLLA's Mamba-like blocks (``vitzoo.models.blocks``)
around MLLA's own linear attention or any other mechanism per stage, convolutional patch merging at the end of
stages 1-3, then LN, the mean over tokens and a Linear head. The state-dict names are the official ones (the layer's
``qk`` loads as its ``in_proj.proj``; the stored RoPE tables are recomputed for each input's grid, so any input size
runs, where the official code asserts 224). docs/pyramids-2024.md.
"""

from __future__ import annotations

from collections import OrderedDict
from functools import partial
from typing import Any, Mapping, Optional, Sequence

import torch
import torch.nn as nn

from vitzoo.attention import AttentionSpec, attention_layer
from vitzoo.attention.stack import stage_specs
from .blocks import MllaBlock
from .builders import build_pyramid, imagenet_cfg, trunc_normal_init
from .registry import zoo_cfgs, zoo_model
from .staged import STAGED_FEATURES, Stage, StagedNet, drop_path_rates, stage_grids

__all__ = ["Mlla", "MLLA_ARCHS", "MLLA_OWN"]

MLLA_OWN = {"name": "mlla", "bare": True}  # MLLA's LinearAttention: qk Linear, v = its input, no output projection
MLLA_ARCHS = {
    "mlla_tiny": dict(embed_dim=64, depths=(2, 4, 8, 4), num_heads=(2, 4, 8, 16), drop_path_rate=0.2),
    "mlla_small": dict(embed_dim=64, depths=(3, 6, 21, 6), num_heads=(2, 4, 8, 16), drop_path_rate=0.3),
}


def conv_layer(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, bias=True, norm=True, act=True):
    """MLLA's ConvLayer: a conv (padding kernel // 2), then BN and ReLU where asked, named conv / norm / act."""
    parts: "OrderedDict[str, nn.Module]" = OrderedDict(
        conv=nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=bias)
    )
    if norm:
        parts["norm"] = nn.BatchNorm2d(cout)
    if act:
        parts["act"] = nn.ReLU()
    return nn.Sequential(parts)


class MllaStem(nn.Module):
    """Stride 4, bias-free convs each with BN: conv1 3x3/2 + ReLU; conv2 (two 3x3) added to conv1's output; conv3
    3x3/2 to 4D + ReLU, 1x1 to D. NCHW out."""

    def __init__(self, in_chans: int, dim: int):
        super().__init__()
        half = dim // 2
        self.conv1 = conv_layer(in_chans, half, 3, 2, bias=False)
        self.conv2 = nn.Sequential(
            conv_layer(half, half, 3, bias=False), conv_layer(half, half, 3, bias=False, act=False)
        )
        self.conv3 = nn.Sequential(
            conv_layer(half, 4 * dim, 3, 2, bias=False), conv_layer(4 * dim, dim, 1, bias=False, act=False)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv1(x)
        return self.conv3(self.conv2(x) + x)


class MllaMerging(nn.Module):
    """Patch merging C -> 2C: 1x1 to 8C + ReLU, depthwise 3x3/2 + ReLU, 1x1 to 2C + BN (convs with bias)."""

    def __init__(self, dim: int, ratio: float = 4.0):
        super().__init__()
        hidden = int(2 * dim * ratio)
        self.conv = nn.Sequential(
            conv_layer(dim, hidden, 1, norm=False),
            conv_layer(hidden, hidden, 3, 2, groups=hidden, norm=False),
            conv_layer(hidden, 2 * dim, 1, act=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


class MllaStage(Stage):
    """MLLA blocks on the tokens (B, h*w, C) of an NCHW map."""

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        x = self.with_grid(x.flatten(2).transpose(1, 2), (H, W))
        for block in self.blocks:
            x = block(x)
        return x.transpose(1, 2).reshape(B, C, H, W)


def mlla_spec(spec: AttentionSpec) -> AttentionSpec:
    """In MLLA's block, ``mlla`` is MLLA's own layer (``bare``) unless the spec sets ``bare``."""
    if spec == "mlla":
        return dict(MLLA_OWN)
    if isinstance(spec, Mapping) and spec.get("name") == "mlla" and "bare" not in spec:
        return {**spec, "bare": True}
    return spec


class Mlla(StagedNet):
    """MLLA with ``attention`` (default MLLA's own) as one spec, one per stage, or per block (``stage_specs``).
    ``drop_rate`` is timm's ``proj_drop`` of each block (after the MLP's layers and the attention)."""

    def __init__(
        self,
        attention: Optional[Any] = None,
        img_size: Any = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dim: int = 64,
        depths: Sequence[int] = (2, 4, 8, 4),
        num_heads: Sequence[int] = (2, 4, 8, 16),
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        drop_path_rate: float = 0.2,
    ):
        super().__init__()
        if len(num_heads) != len(depths):
            raise ValueError(f"num_heads {list(num_heads)} needs one entry per stage of depths {list(depths)}")
        specs = stage_specs(MLLA_OWN if attention is None else attention, depths)
        dims = [embed_dim * 2**i for i in range(len(depths))]
        rates = drop_path_rates(depths, drop_path_rate)
        norm = partial(nn.LayerNorm, eps=1e-5)
        self.num_classes = num_classes
        self.patch_embed = MllaStem(in_chans, embed_dim)
        self.layers = nn.ModuleList()
        for i, grid in enumerate(stage_grids(img_size, len(depths))):
            context = dict(num_tokens=grid[0] * grid[1], grid_size=grid)
            blocks = nn.ModuleList(
                MllaBlock(
                    dims[i],
                    num_heads[i],
                    mlp_ratio,
                    qkv_bias=qkv_bias,
                    proj_drop=drop_rate,
                    drop_path=rates[i][j],
                    norm_layer=norm,
                    attn_layer=attention_layer(mlla_spec(specs[i][j]), **context),
                )
                for j in range(depths[i])
            )
            self.layers.append(MllaStage(blocks, MllaMerging(dims[i]) if i < len(depths) - 1 else None))
        self.set_stage_features(dims)
        self.num_features = self.head_hidden_size = dims[-1]
        self.norm: nn.Module = norm(dims[-1])
        self.reset_classifier(num_classes)
        self.apply(
            trunc_normal_init
        )  # the official init: Linear layers and LayerNorms (convs, BN as PyTorch makes them)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.norm(x.flatten(2).transpose(1, 2)).mean(dim=1)
        return x if pre_logits else self.head(x)

    def new_head(self, num_classes: int) -> nn.Module:
        return nn.Linear(self.num_features, num_classes)

    def drop_head(self) -> None:
        self.norm = nn.Identity()
        self.reset_classifier(0)


MLLA_CFG = imagenet_cfg(pool_size=(7, 7), crop_pct=0.875, first_conv="patch_embed.conv1.conv", classifier="head")
default_cfgs = zoo_cfgs({name: MLLA_CFG for name in MLLA_ARCHS})


@zoo_model
def mlla_tiny(pretrained: bool = False, **kwargs) -> Mlla:
    """MLLA-T: 64 wide, depths 2-4-8-4, heads 2-4-8-16 (d = 32), drop-path 0.2 (24.4 M parameters)."""
    return build_pyramid(Mlla, "mlla_tiny", pretrained, kwargs, MLLA_ARCHS, STAGED_FEATURES)


@zoo_model
def mlla_small(pretrained: bool = False, **kwargs) -> Mlla:
    """MLLA-S: 64 wide, depths 3-6-21-6, heads 2-4-8-16, drop-path 0.3 (43.0 M parameters)."""
    return build_pyramid(Mlla, "mlla_small", pretrained, kwargs, MLLA_ARCHS, STAGED_FEATURES)

"""RAVLT-T / RAVLT-S (Fan et al., CVPR 2025, "Breaking the Low-Rank Dilemma of Linear Attention"; qhfan/RALA
``classfication/RALA.py``) as the official code builds them: NCHW throughout, a four-conv stem to stride 4, blocks of
CPE (3x3 depthwise), LayerNorm2d, attention and an FFN with an inner depthwise conv, each branch with a layer scale;
stride-2 3x3 conv + BN at the end of stages 1-3; a 1x1 conv to 1024, BN, Swish, the average pool and a 1x1 conv head.
Stages 1-2 use RALA (``rala``), 3-4 RAVLT's softmax (``ravlt_softmax``); any mechanism per stage replaces them. An
official state dict loads as it is (its ``qkvo`` and 1x1-conv ``proj`` as the layer's Linears; the stages' stored
RoPE frequencies are the mechanisms' own). docs/pyramids-2024.md.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import DropPath

from vitzoo.attention import build_attention
from vitzoo.attention.stack import stage_specs
from .builders import build_pyramid, imagenet_cfg, trunc_normal_init
from .registry import zoo_cfgs, zoo_model
from .staged import STAGED_FEATURES, Stage, StagedNet, drop_path_rates, stage_grids

__all__ = ["Ravlt", "RAVLT_ARCHS", "RAVLT_OWN"]

_RALA = {"name": "rala", "kernel_size": 5}
_SOFTMAX = {"name": "ravlt_softmax", "kernel_size": 5}
RAVLT_OWN = [_RALA, _RALA, _SOFTMAX, _SOFTMAX]  # the official flags: 'l' in stages 1-2, 'v' in 3-4
RAVLT_ARCHS = {
    "ravlt_tiny": dict(embed_dims=(64, 128, 256, 512), depths=(2, 2, 6, 2), num_heads=(1, 2, 4, 8), drop_path_rate=0.1),
    "ravlt_small": dict(
        embed_dims=(64, 128, 320, 512), depths=(3, 5, 9, 3), num_heads=(1, 2, 5, 8), drop_path_rate=0.15
    ),
}


class LayerNorm2d(nn.Module):
    """LayerNorm over the channels of an NCHW map (eps 1e-6), its nn.LayerNorm named ``norm`` as RAVLT's."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class ConvFfn(nn.Module):
    """1x1 conv C -> rC, GELU, u + DW3x3(u), 1x1 conv rC -> C."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(dim, hidden, 1), nn.Conv2d(hidden, dim, 1)
        self.dwconv = nn.Conv2d(hidden, hidden, 3, 1, 1, groups=hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.fc1(x))
        return self.fc2(x + self.dwconv(x))


class RavltBlock(nn.Module):
    """x + DW3x3(x); x + DropPath(gamma_1 * Attn(LN(x))); x + DropPath(gamma_2 * FFN(LN(x))), on NCHW maps (the
    attention on the (B, h*w, C) tokens)."""

    def __init__(self, dim: int, attn: nn.Module, hidden: int, drop_path: float, init_value: float):
        super().__init__()
        self.pos = nn.Conv2d(dim, dim, 3, 1, 1, groups=dim)
        self.norm1, self.attn, self.norm2 = LayerNorm2d(dim), attn, LayerNorm2d(dim)
        self.ffn = ConvFfn(dim, hidden)
        self.drop_path = DropPath(drop_path) if drop_path > 0 else nn.Identity()
        self.gamma_1 = nn.Parameter(torch.full((1, dim, 1, 1), float(init_value)))
        self.gamma_2 = nn.Parameter(torch.full((1, dim, 1, 1), float(init_value)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.pos(x)
        B, C, H, W = x.shape
        attn = self.attn(self.norm1(x).flatten(2).transpose(1, 2)).transpose(1, 2).reshape(B, C, H, W)
        x = x + self.drop_path(self.gamma_1 * attn)
        return x + self.drop_path(self.gamma_2 * self.ffn(self.norm2(x)))


class RavltStage(Stage):
    """RAVLT blocks on an NCHW map, their attention layers told its grid."""

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        x = self.with_grid(x, (x.shape[2], x.shape[3]))
        for block in self.blocks:
            x = block(x)
        return x


class PatchMerging(nn.Module):
    """Conv 3x3/2 (bias) C_s -> C_{s+1}, then BN, named reduction / norm as RAVLT's."""

    def __init__(self, dim: int, out_dim: int):
        super().__init__()
        self.reduction, self.norm = nn.Conv2d(dim, out_dim, 3, 2, 1), nn.BatchNorm2d(out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.reduction(x))


def ravlt_stem(in_chans: int, dim: int) -> nn.Sequential:
    """Stride 4: 3x3/2 to C/2, two 3x3 at C/2, 3x3/2 to C, each with bias and BN, GELU after all but the last."""
    half = dim // 2
    return nn.Sequential(
        nn.Conv2d(in_chans, half, 3, 2, 1),
        nn.BatchNorm2d(half),
        nn.GELU(),
        nn.Conv2d(half, half, 3, 1, 1),
        nn.BatchNorm2d(half),
        nn.GELU(),
        nn.Conv2d(half, half, 3, 1, 1),
        nn.BatchNorm2d(half),
        nn.GELU(),
        nn.Conv2d(half, dim, 3, 2, 1),
        nn.BatchNorm2d(dim),
    )


class PatchEmbed(nn.Module):
    """The stem under RAVLT's name (``patch_embed.proj``)."""

    def __init__(self, in_chans: int, dim: int):
        super().__init__()
        self.proj = ravlt_stem(in_chans, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


class Ravlt(StagedNet):
    """RAVLT with ``attention`` (default RAVLT's own: ``RAVLT_OWN``) as one spec, one per stage, or per block."""

    def __init__(
        self,
        attention: Optional[Any] = None,
        img_size: Any = 224,
        in_chans: int = 3,
        num_classes: int = 1000,
        embed_dims: Sequence[int] = (64, 128, 256, 512),
        depths: Sequence[int] = (2, 2, 6, 2),
        num_heads: Sequence[int] = (1, 2, 4, 8),
        mlp_ratio: float = 3.5,
        layer_scale_init: float = 1.0,
        projection: int = 1024,
        drop_path_rate: float = 0.1,
    ):
        super().__init__()
        if not len(embed_dims) == len(num_heads) == len(depths):
            raise ValueError(
                f"embed_dims {list(embed_dims)} and num_heads {list(num_heads)} need one entry per stage of depths "
                f"{list(depths)}"
            )
        specs = stage_specs(RAVLT_OWN if attention is None else attention, depths)
        rates = drop_path_rates(depths, drop_path_rate)
        self.num_classes = num_classes
        self.patch_embed = PatchEmbed(in_chans, embed_dims[0])
        self.layers = nn.ModuleList()
        for i, grid in enumerate(stage_grids(img_size, len(depths))):
            dim, context = embed_dims[i], dict(num_tokens=grid[0] * grid[1], grid_size=grid)
            blocks = nn.ModuleList(
                RavltBlock(
                    dim,
                    build_attention(specs[i][j], dim, num_heads=num_heads[i], qkv_bias=True, **context),
                    int(mlp_ratio * dim),
                    rates[i][j],
                    layer_scale_init,
                )
                for j in range(depths[i])
            )
            last = i == len(depths) - 1
            self.layers.append(RavltStage(blocks, None if last else PatchMerging(dim, embed_dims[i + 1])))
        self.set_stage_features(embed_dims)
        self.num_features = self.head_hidden_size = projection
        self.proj: nn.Module = nn.Conv2d(embed_dims[-1], projection, 1)
        self.norm: nn.Module = nn.BatchNorm2d(projection)
        self.swish = nn.SiLU()
        self.reset_classifier(num_classes)
        self.apply(partial(trunc_normal_init, kinds=(nn.Conv2d, nn.Linear)))  # the official init: projections are convs
        self.register_load_state_dict_pre_hook(Ravlt._official_names)

    def _official_names(self, state_dict: dict, prefix: str, *args) -> None:
        """RAVLT's layout: each attention's 1x1-conv ``qkvo`` is its ``in_proj.proj`` (q, k, v) and ``gate`` (o),
        its 1x1-conv ``proj`` the Linear ``proj``; each stage's ``RoPE.angle`` is the mechanisms' own table."""
        for key in [k for k in state_dict if k.startswith(prefix)]:
            name = key[len(prefix) :]
            if name.endswith(".RoPE.angle"):
                del state_dict[key]
            elif name.endswith("attn.proj.weight") and state_dict[key].dim() == 4:
                state_dict[key] = state_dict[key].flatten(1)
            elif ".attn.qkvo." in name:
                value = state_dict.pop(key)
                value = value.flatten(1) if value.dim() == 4 else value
                head, kind = key.rsplit("qkvo.", 1)
                split = value.shape[0] * 3 // 4
                state_dict[f"{head}in_proj.proj.{kind}"], state_dict[f"{head}gate.{kind}"] = (
                    value[:split],
                    value[split:],
                )

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.swish(self.norm(self.proj(x))).mean(dim=(2, 3), keepdim=True)
        return x.flatten(1) if pre_logits else self.head(x).flatten(1)

    def new_head(self, num_classes: int) -> nn.Module:
        return nn.Conv2d(self.num_features, num_classes, 1)

    def drop_head(self) -> None:
        self.proj, self.norm = nn.Identity(), nn.Identity()
        self.reset_classifier(0)


default_cfgs = zoo_cfgs(
    {name: imagenet_cfg(pool_size=(7, 7), first_conv="patch_embed.proj.0", classifier="head") for name in RAVLT_ARCHS}
)


@zoo_model
def ravlt_tiny(pretrained: bool = False, **kwargs) -> Ravlt:
    """RAVLT-T: widths 64-128-256-512, depths 2-2-6-2, heads 1-2-4-8 (d = 64), drop-path 0.1 (14.9 M parameters)."""
    return build_pyramid(Ravlt, "ravlt_tiny", pretrained, kwargs, RAVLT_ARCHS, STAGED_FEATURES)


@zoo_model
def ravlt_small(pretrained: bool = False, **kwargs) -> Ravlt:
    """RAVLT-S: widths 64-128-320-512, depths 3-5-9-3, heads 1-2-5-8, drop-path 0.15 (25.6 M parameters)."""
    return build_pyramid(Ravlt, "ravlt_small", pretrained, kwargs, RAVLT_ARCHS, STAGED_FEATURES)

"""Non-local ResNets: timm's ResNet with non-local blocks whose attention comes from the registry."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

import torch
import torch.fx
import torch.nn as nn
from timm.layers import to_2tuple
from timm.models import build_model_with_cfg
from timm.models.resnet import BasicBlock, Bottleneck, ResNet

from vitzoo.attention import AttentionSpec, resolve_attention
from vitzoo.attention.stack import block_specs
from vitzoo.attention.base import share_grid
from .default_cfg import CIFAR_MEAN, CIFAR_STD, ZOO_CFG
from .inputs import check_images
from .local_dir import verify_local_dir
from .registry import legacy_names, timm_name, zoo_cfgs, zoo_model

__all__ = ["NonLocalBlock", "NonLocalResNet"]

torch.fx.wrap(share_grid)  # a leaf when torch.fx traces this module's code too


class NonLocalBlock(nn.Module):
    """y = x + BN(W_z Attention(theta(x), phi(x), g(x))) over all H*W positions (Wang et al.).

    theta, phi, g and W_z are 1x1 convolutions, i.e. the attention module's linear projections
    applied per position; the BN after W_z starts with zero scale, so the block starts as the
    identity. Any registered mechanism can attend (softmax = embedded Gaussian, linear, ...).
    """

    def __init__(
        self,
        channels: int,
        attention: AttentionSpec = "softmax",
        reduction: int = 2,
        num_heads: int = 1,
        grid_size: Optional[Tuple[int, int]] = None,
    ):
        super().__init__()
        cls, options = resolve_attention(attention)
        options.setdefault("head_dim", max(1, channels // reduction // num_heads))
        grid = tuple(grid_size) if grid_size is not None else None
        self.attn = cls(
            channels,
            num_heads=num_heads,
            qkv_bias=True,
            num_tokens=grid[0] * grid[1] if grid else None,
            grid_size=grid,
            **options,
        )
        self.norm = nn.BatchNorm2d(channels)
        nn.init.zeros_(self.norm.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, C, H, W = x.shape
        y = self.attn(share_grid(x, [self.attn], (H, W)).flatten(2).transpose(1, 2))
        return x + self.norm(y.transpose(1, 2).reshape(B, C, H, W))


class NonLocalResNet(ResNet):
    """timm ResNet with ``NonLocalBlock``s after residual blocks of the chosen stages.

    ``nonlocal_stages`` are 1-based stage numbers (``layer1``..``layer4``); each gets
    ``nonlocal_per_stage`` blocks spread over its residual blocks (the last always included).
    ``cifar_stem`` swaps the 7x7/2 stem and max-pool for one 3x3/1 conv (32x32 inputs). ``attention`` is one spec
    or a stack (``vitzoo.attention.stack``) over the non-local blocks in order.
    """

    def __init__(
        self,
        *args,
        attention: AttentionSpec = "softmax",
        nonlocal_stages: Sequence[int] = (2, 3),
        nonlocal_per_stage: int = 1,
        nonlocal_reduction: int = 2,
        nonlocal_heads: int = 1,
        cifar_stem: bool = False,
        img_size=224,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        feature_info = cast(List[Dict[str, Any]], self.feature_info)  # timm's dicts of num_chs, reduction, module
        if cifar_stem:
            stem = cast(nn.Conv2d, self.conv1)  # the plain 7x7 stem (timm types conv1 as its deep stem too)
            conv1 = nn.Conv2d(stem.in_channels, stem.out_channels, 3, 1, 1, bias=False)
            self.conv1 = conv1  # type: ignore[assignment]  # timm declares conv1 as the deep stem's Sequential
            nn.init.kaiming_normal_(conv1.weight, mode="fan_out", nonlinearity="relu")
            self.maxpool = nn.Identity()  # type: ignore[assignment]  # timm declares maxpool as a Sequential
            for info in feature_info:
                info["reduction"] //= 4 if info["module"] != "act1" else 2
        bad = [s for s in nonlocal_stages if s not in (1, 2, 3, 4)]
        if bad:
            raise ValueError(f"nonlocal_stages {bad} out of range; stages are 1..4 (layer1..layer4)")
        img = to_2tuple(img_size)
        specs = iter(block_specs(attention, len(nonlocal_stages) * nonlocal_per_stage))
        for stage in nonlocal_stages:
            layer = getattr(self, f"layer{stage}")
            info = feature_info[stage]
            grid = (_feature_side(img[0], info["reduction"]), _feature_side(img[1], info["reduction"]))
            after = _spread(len(layer), nonlocal_per_stage)
            blocks = []
            for i, block in enumerate(layer):
                blocks.append(block)
                if i in after:
                    blocks.append(NonLocalBlock(info["num_chs"], next(specs), nonlocal_reduction, nonlocal_heads, grid))
            setattr(self, f"layer{stage}", nn.Sequential(*blocks))

    def __call__(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """nn.Module's call, after a one-line error for an input that is not a float (B, C, H, W) tensor."""
        check_images(x, cast(nn.Conv2d, self.conv1).in_channels)
        return super().__call__(x, *args, **kwargs)


def _feature_side(side: int, reduction: int) -> int:
    """A feature map's side after ``log2(reduction)`` stride-2 layers (each rounds up, like timm's padded convs)."""
    while reduction > 1:
        side, reduction = -(-side // 2), reduction // 2
    return side


def _spread(num_blocks: int, count: int) -> set:
    """Indices of ``count`` residual blocks, evenly spread, ending at the last one."""
    if not 1 <= count <= num_blocks:
        raise ValueError(f"nonlocal_per_stage={count} must be between 1 and the stage's {num_blocks} blocks")
    return {num_blocks - 1 - round(i * num_blocks / count) for i in range(count)}


def _create(variant: str, pretrained: bool, block, layers, **kwargs):
    overlay = kwargs.get("pretrained_cfg_overlay")
    verify_local_dir(pretrained, kwargs.get("pretrained_cfg"), overlay, kwargs.get("attention", "softmax"))
    return build_model_with_cfg(NonLocalResNet, timm_name(variant), pretrained, block=block, layers=layers, **kwargs)


def _cfg(**kwargs):
    return {
        **ZOO_CFG,
        "pool_size": (7, 7),
        "crop_pct": 0.875,
        "interpolation": "bilinear",
        "mean": (0.485, 0.456, 0.406),
        "std": (0.229, 0.224, 0.225),
        "first_conv": "conv1",
        "classifier": "fc",
        **kwargs,
    }


default_cfgs = zoo_cfgs(
    {
        "nonlocal_resnet18": _cfg(),
        "nonlocal_resnet50": _cfg(),
        "nonlocal_resnet18_cifar": _cfg(
            num_classes=10, input_size=(3, 32, 32), pool_size=(4, 4), crop_pct=1.0, mean=CIFAR_MEAN, std=CIFAR_STD
        ),
    }
)


@zoo_model
def nonlocal_resnet18(pretrained: bool = False, **kwargs) -> NonLocalResNet:
    """ResNet-18 with a non-local block closing stages 2 and 3 (res3, res4)."""
    return _create("nonlocal_resnet18", pretrained, BasicBlock, [2, 2, 2, 2], **kwargs)


@zoo_model
def nonlocal_resnet50(pretrained: bool = False, **kwargs) -> NonLocalResNet:
    """ResNet-50 with non-local blocks in stages 2 and 3 (Wang et al. place 5 there: set nonlocal_per_stage)."""
    return _create("nonlocal_resnet50", pretrained, Bottleneck, [3, 4, 6, 3], **kwargs)


@zoo_model
def nonlocal_resnet18_cifar(pretrained: bool = False, **kwargs) -> NonLocalResNet:
    """ResNet-18 with a 3x3 stride-1 stem (no max-pool) for 32x32 inputs, non-local in stages 2 and 3."""
    kwargs = {"num_classes": 10, "img_size": 32, "cifar_stem": True, **kwargs}
    return _create("nonlocal_resnet18_cifar", pretrained, BasicBlock, [2, 2, 2, 2], **kwargs)


legacy_names("nonlocal_resnet18", "nonlocal_resnet50", "nonlocal_resnet18_cifar")  # exports written before the prefix

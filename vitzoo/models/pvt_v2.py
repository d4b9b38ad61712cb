"""PVTv2 (Wang et al. 2022) on timm's ``pvt_v2`` classes, with any mechanism per stage.

timm's model as it is (overlapping patch embeds, the MLP with its depthwise conv, the stage norms, the head,
``forward_intermediates``, ``features_only``), each block's attention a zoo layer. With ``attention="softmax"`` the
model is timm's, and timm's state dicts load strictly (docs/pyramids.md).
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, cast

import torch
import torch.fx
from timm.layers import to_2tuple, to_ntuple
from timm.models.pvt_v2 import Block, PyramidVisionTransformerV2, checkpoint_filter_fn

from vitzoo.attention import ZooAttention
from vitzoo.attention.base import share_grid
from .pyramid import stage_attention, stage_layer, with_defaults
from .builders import build_pyramid, imagenet_cfg
from .registry import zoo_cfgs, zoo_model

__all__ = ["ZooPvtV2", "PVT_V2_ARCHS"]

torch.fx.wrap(share_grid)


class ZooPvtV2Block(Block):
    """timm's PVTv2 block whose attention is a zoo layer: it learns the block's (h, w) grid on each forward."""

    def forward(self, x: torch.Tensor, feat_size: Sequence[int]) -> torch.Tensor:
        x = share_grid(x, [cast(ZooAttention, self.attn)], (feat_size[0], feat_size[1]))
        x = x + self.drop_path1(self.attn(self.norm1(x)))
        return x + self.drop_path2(self.mlp(self.norm2(x), feat_size))


class ZooPvtV2(PyramidVisionTransformerV2):
    """timm's ``PyramidVisionTransformerV2`` with ``attention`` per stage (``vitzoo.models.pyramid``).

    Each mechanism that reduces keys gets the stage's ``sr_ratios`` entry (or, with ``linear=True``, PVTv2's linear
    SR: ``sr_pool`` 7) unless its spec sets one; the others attend over every token of the stage.
    """

    def __init__(self, *args, attention: Any = "softmax", img_size: Any = 224, **kwargs):
        super().__init__(*args, **kwargs)
        stages: Any = self.stages
        depths = [len(stage.blocks) for stage in stages]
        sr_ratios = to_ntuple(len(depths))(kwargs.get("sr_ratios", (8, 4, 2, 1)))
        defaults = [{"sr_pool": 7} if kwargs.get("linear") else {"sr_ratio": sr} for sr in sr_ratios]
        size = to_2tuple(img_size)
        for s, (stage, specs) in enumerate(zip(stages, stage_attention(attention, depths))):
            grid = (_stage_side(size[0], s), _stage_side(size[1], s))
            for index, (block, spec) in enumerate(zip(stage.blocks, specs)):
                old = block.attn
                block.attn = stage_layer(
                    with_defaults(spec, defaults[s]),
                    s,
                    old.dim,
                    old.num_heads,
                    qkv_bias=old.q.bias is not None,
                    attn_drop=old.attn_drop.p,
                    proj_drop=old.proj_drop.p,
                    num_tokens=grid[0] * grid[1],
                    grid_size=grid,
                )
                block.attn.block_index = index
                block.attn.apply(self._init_weights)
                block.__class__ = ZooPvtV2Block


def _stage_side(side: int, stage: int) -> int:
    """Tokens per side of ``stage`` for ``side`` pixels (the 7x7 stride-4 stem, then 3x3 stride-2 embeds)."""
    g = (side - 1) // 4 + 1
    for _ in range(stage):
        g = (g - 1) // 2 + 1
    return g


PVT_V2_ARCHS: Dict[str, Dict[str, Any]] = {
    "pvt_v2_b0": dict(depths=(2, 2, 2, 2), embed_dims=(32, 64, 160, 256), num_heads=(1, 2, 5, 8)),
    "pvt_v2_b1": dict(depths=(2, 2, 2, 2), embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8)),
    "pvt_v2_b2": dict(depths=(3, 4, 6, 3), embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8)),
    "pvt_v2_b2_li": dict(depths=(3, 4, 6, 3), embed_dims=(64, 128, 320, 512), num_heads=(1, 2, 5, 8), linear=True),
}

default_cfgs = zoo_cfgs({name: imagenet_cfg(first_conv="patch_embed.proj", classifier="head") for name in PVT_V2_ARCHS})


def _build(name: str, pretrained: bool, kwargs: dict) -> ZooPvtV2:
    features = dict(flatten_sequential=True)
    return build_pyramid(ZooPvtV2, name, pretrained, kwargs, PVT_V2_ARCHS, features, checkpoint_filter_fn, "softmax")


@zoo_model
def pvt_v2_b0(pretrained: bool = False, **kwargs) -> ZooPvtV2:
    """PVTv2-b0 (3.7M parameters with softmax): 32-256 wide, 2 blocks per stage."""
    return _build("pvt_v2_b0", pretrained, kwargs)


@zoo_model
def pvt_v2_b1(pretrained: bool = False, **kwargs) -> ZooPvtV2:
    """PVTv2-b1 (14.0M with softmax): 64-512 wide, 2 blocks per stage."""
    return _build("pvt_v2_b1", pretrained, kwargs)


@zoo_model
def pvt_v2_b2(pretrained: bool = False, **kwargs) -> ZooPvtV2:
    """PVTv2-b2 (25.4M with softmax): 64-512 wide, 3-4-6-3 blocks."""
    return _build("pvt_v2_b2", pretrained, kwargs)


@zoo_model
def pvt_v2_b2_li(pretrained: bool = False, **kwargs) -> ZooPvtV2:
    """PVTv2-b2-li (22.6M with softmax): b2 with PVTv2's linear SR (keys pooled to 7x7) and the MLP's extra ReLU."""
    return _build("pvt_v2_b2_li", pretrained, kwargs)

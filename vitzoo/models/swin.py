"""Swin (Liu et al. 2021) on timm's ``swin_transformer`` classes, with any mechanism per stage in (shifted) windows.

timm's model as it is (patch embed, patch merging, MLPs, norms, head, ``forward_intermediates``, ``features_only``),
each block's attention a zoo layer that cuts the grid into the stage's windows itself. ``softmax`` in a Swin stage
is Swin's attention, ``window`` with the relative position bias (``SWIN_ATTENTION``; the spec's other options kept):
timm's state dicts load strictly. Any other
mechanism runs inside the stage's windows (``window`` option, docs/mechanisms.md section 25); a window as large as
the stage is global attention over the stage, as the FLatten, Agent, InLine and Pola Swin releases use it.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Set, Tuple, cast

import torch
import torch.fx
from timm.layers import to_2tuple
from timm.models.swin_transformer import (
    SwinTransformer,
    SwinTransformerBlock,
    checkpoint_filter_fn,
    resolve_stage_window_sizes,
)
from timm.models.vision_transformer import init_weights_vit_timm

from vitzoo.attention import AttentionSpec, ZooAttention, resolve_attention
from vitzoo.attention.base import share_grid
from .pyramid import stage_attention, stage_layer, with_defaults
from .builders import build_pyramid, imagenet_cfg
from .registry import zoo_cfgs, zoo_model

__all__ = ["ZooSwinTransformer", "SWIN_ARCHS", "SWIN_ATTENTION"]

torch.fx.wrap(share_grid)

SWIN_ATTENTION = {"name": "window", "rel_pos": True}  # Swin's own: softmax in windows, relative position bias


class ZooSwinBlock(SwinTransformerBlock):
    """timm's Swin block whose attention is a zoo layer over the whole (B, H, W, C) map (it windows it itself)."""

    def _attn(self, x: torch.Tensor) -> torch.Tensor:
        B, H, W, C = x.shape
        tokens = share_grid(x.reshape(B, H * W, C), [cast(ZooAttention, self.attn)], (H, W))
        return self.attn(tokens).reshape(B, H, W, C)

    def _init_buffers(self) -> None:
        """No attention mask: the zoo layer builds its windows per input."""

    def set_input_size(self, feat_size: Tuple[int, int], window_size: Any, always_partition: Optional[bool] = None):
        """The layer cuts each input's grid itself: only the block's recorded resolution changes."""
        self.input_resolution = feat_size


def swin_softmax(spec: AttentionSpec) -> AttentionSpec:
    """``softmax`` as Swin has it: ``SWIN_ATTENTION`` with the spec's other options (its ``window`` as the window
    size); other specs as they are."""
    if spec == "softmax":
        return dict(SWIN_ATTENTION)
    if isinstance(spec, dict) and spec.get("name") == "softmax":
        options = {("window_size" if k == "window" else k): v for k, v in spec.items() if k != "name"}
        return {**SWIN_ATTENTION, **options}
    return spec


class ZooSwinTransformer(SwinTransformer):
    """timm's ``SwinTransformer`` with ``attention`` per stage (``vitzoo.models.pyramid``), each mechanism in the
    stage's ``window_size`` windows (odd blocks shifted) unless its spec sets ``window``.

    Any input whose sides are multiples of 32 runs (``strict_img_size=False``): border windows are padded and the
    padding left out of the keys.
    """

    def __init__(self, *args, attention: Any = SWIN_ATTENTION, **kwargs):
        kwargs.setdefault("strict_img_size", False)
        super().__init__(*args, **kwargs)
        stages: Any = self.layers
        depths = [len(stage.blocks) for stage in stages]
        windows = resolve_stage_window_sizes(kwargs.get("window_size", 7), len(depths))
        size = to_2tuple(kwargs.get("img_size", 224))
        patch = kwargs.get("patch_size", 4)
        for s, (stage, specs) in enumerate(zip(stages, stage_attention(attention, depths))):
            grid = tuple(-(-side // patch // 2**s) for side in size)  # merging pads odd sides: ceil
            window = min(windows[s][0], *grid)  # timm's clamp: a stage no larger than its window is one window
            for index, (block, spec) in enumerate(zip(stage.blocks, specs)):
                old = block.attn
                spec = with_defaults(swin_softmax(spec), {"window": window})
                own = resolve_attention(spec)[1].get("window")  # None: windowed itself (``window``), on the grid
                side = (min(own, grid[0]), min(own, grid[1])) if own else grid
                block.attn = stage_layer(
                    spec,
                    s,
                    block.dim,
                    old.num_heads,
                    qkv_bias=old.qkv.bias is not None,
                    attn_drop=old.attn_drop.p,
                    proj_drop=old.proj_drop.p,
                    num_tokens=side[0] * side[1],
                    grid_size=side,
                )
                block.attn.block_index = index
                block.attn.apply(init_weights_vit_timm)
                block.__class__ = ZooSwinBlock
                block.attn_mask = None

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """Swin's relative position bias tables (``rel_table`` of each window layer)."""
        return {name for name, _ in self.named_parameters() if name.endswith("rel_table")}


SWIN_ARCHS: Dict[str, Dict[str, Any]] = {
    "swin_tiny": dict(embed_dim=96, depths=(2, 2, 6, 2), num_heads=(3, 6, 12, 24), drop_path_rate=0.2),
    "swin_small": dict(embed_dim=96, depths=(2, 2, 18, 2), num_heads=(3, 6, 12, 24), drop_path_rate=0.3),
}

default_cfgs = zoo_cfgs(
    {name: imagenet_cfg(pool_size=(7, 7), first_conv="patch_embed.proj", classifier="head.fc") for name in SWIN_ARCHS}
)


def _build(name: str, pretrained: bool, kwargs: dict) -> ZooSwinTransformer:
    features = dict(flatten_sequential=True)
    return build_pyramid(
        ZooSwinTransformer, name, pretrained, kwargs, SWIN_ARCHS, features, checkpoint_filter_fn, SWIN_ATTENTION
    )


@zoo_model
def swin_tiny(pretrained: bool = False, **kwargs) -> ZooSwinTransformer:
    """Swin-T (28.3M parameters with Swin's attention): 96 wide, 2-2-6-2 blocks, windows of 7."""
    return _build("swin_tiny", pretrained, kwargs)


@zoo_model
def swin_small(pretrained: bool = False, **kwargs) -> ZooSwinTransformer:
    """Swin-S (49.6M with Swin's attention): 96 wide, 2-2-18-2 blocks, windows of 7."""
    return _build("swin_small", pretrained, kwargs)

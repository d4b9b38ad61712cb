"""What the convolutional-stem pyramids (MLLA, RAVLT) share: stages that end in their own downsampling, each stage's
output map as a feature at strides 4-32 (timm's ``forward_intermediates``, so ``features_only`` and smp ``tu-``
encoders work), the drop-path schedule and the patch grid each attention layer is told per input."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple, Union, cast

import torch
import torch.fx
import torch.nn as nn
from timm.models._features import feature_take_indices

from vitzoo.attention import ZooAttention
from vitzoo.attention.base import share_grid
from .stage_maps import StageMaps

__all__ = ["STAGED_FEATURES", "Stage", "StagedNet", "drop_path_rates", "stage_grids"]

STAGED_FEATURES = dict(feature_cls="getter")  # timm's features_only through forward_intermediates

torch.fx.wrap(share_grid)  # a leaf when torch.fx traces this module's code too


def drop_path_rates(depths: Sequence[int], rate: float) -> List[List[float]]:
    """torch.linspace(0, rate) over all blocks, cut into stages (as both official codes do)."""
    rates = torch.linspace(0, rate, sum(depths)).tolist()
    return [rates[sum(depths[:i]) : sum(depths[: i + 1])] for i in range(len(depths))]


def stage_grids(img_size: Union[int, Sequence[int]], stages: int) -> List[Tuple[int, int]]:
    """The (h, w) grid of each stage for an input of ``img_size``: a stride-4 stem, then 3x3 stride-2 convs."""
    size = (img_size, img_size) if isinstance(img_size, int) else tuple(img_size)
    grid = (math.ceil(size[0] / 4), math.ceil(size[1] / 4))
    grids = [grid]
    for _ in range(stages - 1):
        grid = (math.ceil(grid[0] / 2), math.ceil(grid[1] / 2))
        grids.append(grid)
    return grids


class Stage(nn.Module):
    """``blocks`` on an NCHW map, then ``downsample`` (None in the last stage): forward gives (the stage's output map,
    the next stage's input). A subclass says how its blocks run (``run_blocks``)."""

    def __init__(self, blocks: nn.ModuleList, downsample: Optional[nn.Module]):
        super().__init__()
        self.blocks, self.downsample = blocks, downsample
        for index, block in enumerate(blocks):
            if isinstance(block.attn, ZooAttention):
                block.attn.block_index = index

    def attention_layers(self) -> List[ZooAttention]:
        return [block.attn for block in self.blocks if isinstance(block.attn, ZooAttention)]

    def with_grid(self, x: torch.Tensor, grid: Tuple[int, int]) -> torch.Tensor:
        """x, after telling every attention layer of the stage the (h, w) grid of this input."""
        return share_grid(x, self.attention_layers(), grid)

    def run_blocks(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        out = self.run_blocks(x)
        return out, out if self.downsample is None else self.downsample(out)


class StagedNet(StageMaps, nn.Module):
    """A stem (``patch_embed``), ``layers`` of ``Stage``s and a head (``forward_head``, ``reset_classifier``,
    ``drop_head``); ``feature_info`` lists each stage's output map."""

    patch_embed: nn.Module
    layers: nn.ModuleList
    feature_info: List[dict]
    head: nn.Module
    num_features: int
    num_classes: int

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def new_head(self, num_classes: int) -> nn.Module:
        """The classifier over ``num_features`` channels for ``num_classes`` > 0."""
        raise NotImplementedError

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        if global_pool not in (None, "avg"):
            raise ValueError(
                f"global_pool={global_pool!r}: {type(self).__name__} pools by the mean only; give 'avg' or None"
            )
        self.num_classes = num_classes
        self.head = self.new_head(num_classes) if num_classes > 0 else nn.Identity()

    def drop_head(self) -> None:
        """Replace the head's layers by Identity (features only)."""
        raise NotImplementedError

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x)
        for layer in self.layers:
            _, x = layer(x)
        return x

    def set_stage_features(self, dims: Sequence[int]) -> None:
        """``feature_info`` and ``num_stages`` for stages of ``dims`` channels at strides 4, 8, 16, ..."""
        self.num_stages = len(dims)
        self.feature_info = [dict(num_chs=d, reduction=4 * 2**i, module=f"layers.{i}") for i, d in enumerate(dims)]

    def stage_maps(
        self, x: torch.Tensor, take: List[int], stages: int, norm: bool
    ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Each stage's output map before its downsampling (``norm`` has no use: no norm follows a stage); the last
        stage run's output after it."""
        x = self.patch_embed(x)
        maps = []
        for index, layer in enumerate(self.layers[:stages]):
            out, x = layer(x)
            if index in take:
                maps.append(out)
        return x, maps

    def prune_intermediate_layers(
        self, indices: Union[int, List[int]] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> List[int]:
        """timm's: keep the stages up to the last one ``indices`` takes (its downsampling goes too) and, with
        ``prune_head`` or a shorter model, drop the head."""
        take, max_index = feature_take_indices(len(self.layers), indices)
        if max_index < len(self.layers) - 1:
            self.layers = self.layers[: max_index + 1]
            self.num_stages = max_index + 1
            cast(Stage, self.layers[-1]).downsample = None
            self.num_features = self.head_hidden_size = self.feature_info[max_index]["num_chs"]
            prune_head = True
        if prune_head:
            self.drop_head()
        return take

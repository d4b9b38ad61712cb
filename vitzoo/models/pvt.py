"""PVT v1 (Wang et al. 2021) from timm blocks in the official layout, with any mechanism per stage.

Four stages, each a stride-4 (then 2) patch embed with LayerNorm, a learned position table and pre-norm timm
``Block``s; a class token joins in stage 4. The state-dict names are the official ``pvt.py``'s (``patch_embed1``,
``pos_embed1``, ``block1.0.attn.q`` ...), so its checkpoints load. ``class_token=False, global_pool="avg"`` is the
layout of the FLatten, Agent, InLine and Pola PVT releases (mean head, no class token, no final norm).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple, Union, cast

import torch
import torch.fx
import torch.nn as nn
import torch.utils.checkpoint
from timm.layers import LayerNorm, to_2tuple, trunc_normal_
from timm.models.vision_transformer import Block

from vitzoo.attention import ZooAttention, attention_layer
from vitzoo.attention.base import share_grid
from vitzoo.attention.grid import Layout, resample_tokens
from .pyramid import stage_attention, with_defaults, zoo_layers
from .builders import build_pyramid, imagenet_cfg, trunc_normal_init
from .registry import zoo_cfgs, zoo_model
from .stage_maps import StageMaps

__all__ = ["PyramidVisionTransformer", "PVT_ARCHS"]

torch.fx.wrap(share_grid)


class PatchEmbed(nn.Module):
    """Conv with kernel = stride = ``patch_size``, then LayerNorm: (B, C, H, W) -> (B, h*w, C'), (h, w)."""

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int):
        super().__init__()
        self.proj = nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)
        self.norm = nn.LayerNorm(embed_dim)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, Tuple[int, int]]:
        x = self.proj(x)
        grid = (x.shape[2], x.shape[3])
        return self.norm(x.flatten(2).transpose(1, 2)), grid


class PyramidVisionTransformer(StageMaps, nn.Module):
    """PVT v1; ``attention``: one spec, one per stage, or per block (``vitzoo.models.pyramid``).

    Mechanisms that reduce keys get the stage's ``sr_ratios`` entry unless their spec sets one. The position tables
    are resampled bilinearly at another input size (the class row kept), as the official code does.
    """

    def __init__(
        self,
        img_size: Union[int, Tuple[int, int]] = 224,
        patch_size: int = 4,
        in_chans: int = 3,
        num_classes: int = 1000,
        global_pool: str = "token",
        embed_dims: Sequence[int] = (64, 128, 320, 512),
        num_heads: Sequence[int] = (1, 2, 5, 8),
        mlp_ratios: Sequence[float] = (8, 8, 4, 4),
        qkv_bias: bool = True,
        drop_rate: float = 0.0,
        proj_drop_rate: float = 0.0,
        attn_drop_rate: float = 0.0,
        drop_path_rate: float = 0.0,
        depths: Sequence[int] = (2, 2, 2, 2),
        sr_ratios: Sequence[int] = (8, 4, 2, 1),
        class_token: bool = True,
        final_norm: bool = True,
        attention: Any = "softmax",
    ):
        super().__init__()
        if global_pool not in ("token", "avg"):
            raise ValueError(f"global_pool={global_pool!r}; choose 'token' (the class token) or 'avg' (token mean)")
        if global_pool == "token" and not class_token:
            raise ValueError("global_pool='token' needs the class token; set class_token=True or global_pool='avg'")
        self.num_classes, self.global_pool, self.num_stages = num_classes, global_pool, len(depths)
        self.num_features = self.head_hidden_size = embed_dims[-1]
        self.num_prefix_tokens = 1 if class_token else 0
        self.grad_checkpointing = False
        size = to_2tuple(img_size)
        self.feature_info: List[dict] = []
        specs = stage_attention(attention, depths)
        rates = torch.linspace(0, drop_path_rate, sum(depths), device="cpu").tolist()
        dims = [in_chans, *embed_dims]
        for s, depth in enumerate(depths):
            stride = patch_size * 2**s
            grid = (size[0] // stride, size[1] // stride)
            prefix = self.num_prefix_tokens if s == self.num_stages - 1 else 0
            tokens = prefix + grid[0] * grid[1]
            setattr(self, f"patch_embed{s + 1}", PatchEmbed(patch_size if s == 0 else 2, dims[s], dims[s + 1]))
            setattr(self, f"pos_embed{s + 1}", nn.Parameter(torch.zeros(1, tokens, dims[s + 1])))
            setattr(self, f"pos_drop{s + 1}", nn.Dropout(drop_rate))
            context = dict(num_tokens=tokens, num_prefix_tokens=prefix, grid_size=grid)
            blocks = []
            for j, spec in enumerate(specs[s]):
                spec = with_defaults(spec, {"sr_ratio": sr_ratios[s]})
                blocks.append(
                    _stage_block(
                        spec,
                        s,
                        dims[s + 1],
                        num_heads[s],
                        mlp_ratios[s],
                        qkv_bias,
                        proj_drop_rate,
                        attn_drop_rate,
                        rates[sum(depths[:s]) + j],
                        context,
                    )
                )
                cast(ZooAttention, blocks[-1].attn).block_index = j
            setattr(self, f"block{s + 1}", nn.ModuleList(blocks))
            self.feature_info.append(dict(num_chs=dims[s + 1], reduction=stride, module=f"block{s + 1}"))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims[-1])) if class_token else None
        self.norm = nn.LayerNorm(embed_dims[-1], eps=1e-6) if final_norm else nn.Identity()
        self.head_drop = nn.Dropout(drop_rate)
        self.head = nn.Linear(embed_dims[-1], num_classes) if num_classes > 0 else nn.Identity()
        for s in range(self.num_stages):
            trunc_normal_(getattr(self, f"pos_embed{s + 1}"), std=0.02)
        if self.cls_token is not None:
            trunc_normal_(self.cls_token, std=0.02)
        self.apply(trunc_normal_init)  # PVT's: Linear layers and LayerNorms

    def _built(self, stage: int) -> Layout:
        layer = next(iter(zoo_layers(getattr(self, f"block{stage + 1}"))))
        assert layer.grid_size is not None
        return Layout(layer.num_prefix_tokens, *layer.grid_size)

    def _pos_embed(self, stage: int, grid: Tuple[int, int]) -> torch.Tensor:
        return position_table(getattr(self, f"pos_embed{stage + 1}"), self._built(stage), grid)

    def _stage(self, x: torch.Tensor, s: int) -> Tuple[torch.Tensor, Tuple[int, int]]:
        """Stage ``s`` on an NCHW map (or the image): its tokens (B, P + h*w, C) and grid."""
        x, grid = getattr(self, f"patch_embed{s + 1}")(x)
        blocks = getattr(self, f"block{s + 1}")
        if s == self.num_stages - 1 and self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = getattr(self, f"pos_drop{s + 1}")(x + self._pos_embed(s, grid))
        x = share_grid(x, [block.attn for block in blocks], grid)
        for block in blocks:
            x = (
                torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                if self.grad_checkpointing
                else block(x)
            )
        return x, grid

    def _to_map(self, x: torch.Tensor, grid: Tuple[int, int], prefix: int) -> torch.Tensor:
        return x[:, prefix:].transpose(1, 2).reshape(x.shape[0], -1, grid[0], grid[1])

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """Stage 4's normed tokens (B, P + h*w, C)."""
        for s in range(self.num_stages):
            x, grid = self._stage(x, s)
            if s < self.num_stages - 1:
                x = self._to_map(x, grid, 0)
        return self.norm(x)

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = x[:, 0] if self.global_pool == "token" else x[:, self.num_prefix_tokens :].mean(1)
        x = self.head_drop(x)
        return x if pre_logits else self.head(x)

    def stage_maps(
        self, x: torch.Tensor, take: List[int], stages: int, norm: bool
    ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Stage 4's map without its class token (normed with ``norm``); the last output normed if it is stage 4's."""
        maps = []
        for s in range(stages):
            x, grid = self._stage(x, s)
            final = s == self.num_stages - 1
            if s in take:
                feature = self.norm(x) if final and norm else x
                maps.append(self._to_map(feature, grid, self.num_prefix_tokens if final else 0))
            if not final:
                x = self._to_map(x, grid, 0)
        return (self.norm(x) if stages == self.num_stages else x), maps

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: Optional[str] = None) -> None:
        self.num_classes = num_classes
        if global_pool is not None:
            self.global_pool = global_pool
        self.head = nn.Linear(self.num_features, num_classes) if num_classes > 0 else nn.Identity()

    @torch.jit.ignore
    def no_weight_decay(self) -> set:
        return {f"pos_embed{s + 1}" for s in range(self.num_stages)} | {"cls_token"}


@torch.fx.wrap
def position_table(table: torch.Tensor, built: Layout, grid: Tuple[int, int]) -> torch.Tensor:
    """A stage's position table (1, P + h*w, C) at ``grid``: resampled bilinearly off the built grid, prefix rows kept.
    A leaf under torch.fx, so each input's grid reaches it."""
    return resample_tokens(table, 1, built, Layout(built.prefix, grid[0], grid[1]))


def _stage_block(spec, stage, dim, heads, mlp_ratio, qkv_bias, proj_drop, attn_drop, drop_path, context) -> Block:
    try:
        return Block(
            dim,
            heads,
            mlp_ratio=mlp_ratio,
            qkv_bias=qkv_bias,
            proj_drop=proj_drop,
            attn_drop=attn_drop,
            drop_path=drop_path,
            norm_layer=LayerNorm,  # timm's: eps 1e-6
            attn_layer=attention_layer(spec, **context),
        )
    except ValueError as err:
        raise ValueError(f"stage {stage + 1} ({dim} channels, {heads} heads): {err}") from None


def _checkpoint_filter(state_dict: dict, model: PyramidVisionTransformer) -> dict:
    """An official checkpoint as it is, less the final norm of a release that builds one but never applies it."""
    state_dict = state_dict.get("model", state_dict)
    if isinstance(model.norm, nn.Identity):
        state_dict = {k: v for k, v in state_dict.items() if not k.startswith("norm.")}
    return state_dict


PVT_ARCHS = {
    "pvt_tiny": dict(depths=(2, 2, 2, 2), drop_path_rate=0.1),
    "pvt_small": dict(depths=(3, 4, 6, 3), drop_path_rate=0.1),
    "pvt_medium": dict(depths=(3, 4, 18, 3), drop_path_rate=0.3),
    "pvt_large": dict(depths=(3, 8, 27, 3), drop_path_rate=0.3),
}

default_cfgs = zoo_cfgs({name: imagenet_cfg(first_conv="patch_embed1.proj", classifier="head") for name in PVT_ARCHS})


def _build(name: str, pretrained: bool, kwargs: dict) -> PyramidVisionTransformer:
    features = dict(feature_cls="getter")
    return build_pyramid(PyramidVisionTransformer, name, pretrained, kwargs, PVT_ARCHS, features, _checkpoint_filter)


@zoo_model
def pvt_tiny(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Tiny (13.2M parameters with softmax): 2 blocks per stage."""
    return _build("pvt_tiny", pretrained, kwargs)


@zoo_model
def pvt_small(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Small (24.5M with softmax): 3-4-6-3 blocks."""
    return _build("pvt_small", pretrained, kwargs)


@zoo_model
def pvt_medium(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Medium (44.2M with softmax): 3-4-18-3 blocks."""
    return _build("pvt_medium", pretrained, kwargs)


@zoo_model
def pvt_large(pretrained: bool = False, **kwargs) -> PyramidVisionTransformer:
    """PVT-Large (61.4M with softmax): 3-8-27-3 blocks."""
    return _build("pvt_large", pretrained, kwargs)

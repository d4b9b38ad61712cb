"""ViT backbones: timm's ``VisionTransformer`` with the zoo's attention as ``attn_layer``."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Set, Tuple, Union

import torch
import torch.fx
from timm.layers import to_2tuple
from timm.models import build_model_with_cfg
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn

from vitzoo.attention import AttentionSpec, ZooAttention, attention_layer
from vitzoo.attention.base import share_grid
from vitzoo.attention.stack import block_specs, is_stack, per_block
from . import legacy_onnx  # noqa: F401  (registers an op the TorchScript ONNX exporter lacks)
from .blocks import BLOCKS
from .default_cfg import CIFAR_MEAN, CIFAR_STD, ZOO_CFG
from .inputs import check_images
from .local_dir import verify_local_dir
from .registry import legacy_names, timm_name, zoo_cfgs, zoo_model
from .variable_size import forward_padded, pool_padded

__all__ = ["ZooVisionTransformer", "VIT_ARCHS", "default_feature_levels"]

torch.fx.wrap(share_grid)  # a leaf when torch.fx traces this module's code too


class ZooVisionTransformer(VisionTransformer):
    """timm's VisionTransformer that tells its attention layers the patch grid of each input.

    Synthesizer grids and the log-n scale need the (h, w) grid when the input size changes
    (``dynamic_img_size``); everything else is timm's, including ``forward_intermediates`` (``forward_features`` and
    it refuse a list of images in one line, naming ``model(images)`` and ``forward_padded``).
    Each attention layer learns its block's index (window attention shifts every second block). The builders take
    ``attention`` (one spec or a hybrid stack, ``vitzoo.attention.stack``) and ``block`` (``timm`` or ``mlla``,
    ``vitzoo.models.blocks``). ``model(images)`` with a list of (C, h, w) images of different sizes runs them as one
    padded, masked batch (``forward_images``, ``vitzoo.models.variable_size``); a tensor takes timm's forward, which
    is not overridden.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for index, block in enumerate(self.blocks):
            if isinstance(block.attn, ZooAttention):
                block.attn.block_index = index

    def __call__(self, x: Union[torch.Tensor, Sequence[torch.Tensor]], *args, **kwargs) -> torch.Tensor:
        """``model(images)``: a list of (C, h, w) images of different sizes goes to ``forward_images``; a tensor to
        nn.Module's call of timm's forward (hooks, compile), which stays as it is (tracers trace timm's forward)."""
        if isinstance(x, (list, tuple)):
            return self.forward_images(x, *args, **kwargs)
        check_images(x, self.patch_embed.proj.in_channels)
        return super().__call__(x, *args, **kwargs)

    def forward_images(
        self, images: Sequence[torch.Tensor], attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        """Logits (B, classes) of a list of images of different sizes run as one padded, masked batch."""
        if attn_mask is not None or is_causal:
            raise ValueError("a list of images builds its own padding mask; pass no attn_mask or is_causal")
        tokens, valid = forward_padded(self, images)
        return self.head(self.head_drop(self.fc_norm(pool_padded(self, tokens, valid))))

    def forward_padded(self, images: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        """(tokens (B, N, C), key mask (B, N)) of a list of images of different sizes on one padded canvas."""
        return forward_padded(self, images)

    def forward_features(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """timm's, for a (B, C, H, W) tensor; a list of images is a one-line error naming ``forward_padded``."""
        _tensor_only(x, "forward_features")
        return super().forward_features(x, *args, **kwargs)

    def forward_intermediates(self, x: torch.Tensor, *args, **kwargs):
        """timm's, for a (B, C, H, W) tensor; a list of images is a one-line error naming ``forward_padded``."""
        _tensor_only(x, "forward_intermediates")
        return super().forward_intermediates(x, *args, **kwargs)

    def _pos_embed(self, x):
        grid = x.shape[1:3] if self.dynamic_img_size else self.patch_embed.grid_size
        x = share_grid(x, [block.attn for block in self.blocks if isinstance(block.attn, ZooAttention)], grid)
        return super()._pos_embed(x)

    @torch.jit.ignore
    def no_weight_decay(self) -> Set[str]:
        """timm's, and RoPE-Mixed's learned frequencies (as timm's ``RotaryEmbeddingMixed`` excludes them)."""
        return super().no_weight_decay() | {"blocks.*.attn.rope.freqs"}


def _tensor_only(x: Any, method: str) -> None:
    """timm's tensor methods refuse a list of images in one line that names the calls that take one."""
    if isinstance(x, (list, tuple)):
        raise TypeError(
            f"{method} takes one (B, C, H, W) tensor, not a list of images: for images of different sizes call "
            "model(images) for the logits, or model.forward_padded(images) for the tokens and their key mask"
        )


def default_feature_levels(depth: int, levels: int = 4) -> Tuple[int, ...]:
    """Block indices spread over the depth, e.g. (2, 5, 8, 11) for 12 blocks."""
    return tuple(sorted({max(0, round((i + 1) * depth / levels) - 1) for i in range(levels)}))


def _create_vit(
    variant: str, pretrained: bool = False, attention: AttentionSpec = "softmax", block: str = "timm", **kwargs
):
    verify_local_dir(pretrained, kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay"), attention)
    img_size = to_2tuple(kwargs.get("img_size", 224))
    patch_size = to_2tuple(kwargs.get("patch_size", 16))
    grid = (img_size[0] // patch_size[0], img_size[1] // patch_size[1])
    if grid[0] * patch_size[0] != img_size[0] or grid[1] * patch_size[1] != img_size[1]:
        raise ValueError(
            f"img_size {tuple(img_size)} is not divisible by patch_size {tuple(patch_size)}; "
            f"choose an img_size that is a multiple of the patch size"
        )
    prefix = (1 if kwargs.get("class_token", True) else 0) + kwargs.get("reg_tokens", 0)
    context = dict(num_tokens=prefix + grid[0] * grid[1], num_prefix_tokens=prefix, grid_size=grid)
    kwargs.setdefault("dynamic_img_size", True)
    depth = kwargs.get("depth", 12)
    out_indices = kwargs.pop("out_indices", default_feature_levels(depth))
    if block not in BLOCKS:
        raise ValueError(f"unknown block={block!r}; choose one of {list(BLOCKS)} (train.py: +model.kwargs.block=...)")
    block_fn: Callable[..., Any] = BLOCKS[block]
    attn_layer = None
    if is_stack(attention):  # a mechanism per block: block i gets its own attn_layer
        layers = [attention_layer(spec, **context) for spec in block_specs(attention, depth)]
        block_fn, attn_layer = per_block(block_fn, layers), layers[0]
    return build_model_with_cfg(
        ZooVisionTransformer,
        timm_name(variant),
        pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        attn_layer=attn_layer or attention_layer(attention, **context),
        block_fn=block_fn,
        **kwargs,
    )


def _cfg(**kwargs):
    return {
        **ZOO_CFG,
        "pool_size": None,
        "crop_pct": 0.9,
        "interpolation": "bicubic",
        "fixed_input_size": False,
        "mean": (0.5, 0.5, 0.5),
        "std": (0.5, 0.5, 0.5),
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        **kwargs,
    }


default_cfgs = zoo_cfgs(
    {
        "vit_cifar": _cfg(num_classes=10, input_size=(3, 32, 32), crop_pct=1.0, mean=CIFAR_MEAN, std=CIFAR_STD),
        "vit_tiny": _cfg(),
        "vit_small": _cfg(),
        "vit_base": _cfg(),
    }
)

# Architecture shapes; anything passed to create_model overrides them.
VIT_ARCHS: Dict[str, Dict[str, Any]] = {
    "vit_cifar": dict(img_size=32, patch_size=4, embed_dim=192, depth=9, num_heads=3, mlp_ratio=2.0, num_classes=10),
    "vit_tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),
    "vit_small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "vit_base": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
}


@zoo_model
def vit_cifar(pretrained: bool = False, **kwargs) -> ZooVisionTransformer:
    """CIFAR-size ViT (Lee et al. 2021 shape, 3 heads): 32x32 input, patch 4, 192 wide, 9 deep."""
    return _create_vit("vit_cifar", pretrained, **{**VIT_ARCHS["vit_cifar"], **kwargs})


@zoo_model
def vit_tiny(pretrained: bool = False, **kwargs) -> ZooVisionTransformer:
    """ViT-Ti/16 shape (192 wide, 12 deep, 3 heads)."""
    return _create_vit("vit_tiny", pretrained, **{**VIT_ARCHS["vit_tiny"], **kwargs})


@zoo_model
def vit_small(pretrained: bool = False, **kwargs) -> ZooVisionTransformer:
    """ViT-S/16 shape (384 wide, 12 deep, 6 heads)."""
    return _create_vit("vit_small", pretrained, **{**VIT_ARCHS["vit_small"], **kwargs})


@zoo_model
def vit_base(pretrained: bool = False, **kwargs) -> ZooVisionTransformer:
    """ViT-B/16 shape (768 wide, 12 deep, 12 heads)."""
    return _create_vit("vit_base", pretrained, **{**VIT_ARCHS["vit_base"], **kwargs})


legacy_names(*VIT_ARCHS)  # exports written before the prefix

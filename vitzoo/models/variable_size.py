"""Variable-size batches for the ViT: a list of images of different sizes as one padded, masked batch.

The images are padded at the bottom and right to the largest height and width (a canvas); each image's patch
tokens sit at the top-left of the canvas grid, in the canvas's raster order, after the prefix tokens. Its absolute
position embedding is resampled to its own grid (as for the image alone), the attention layers learn each image's
grid (``share_grid``: RoPE and per-image tables) and get timm's boolean key-padding mask (B, 1, 1, N), the
classifier pools each image's own tokens. So every image gives, up to rounding, what it gives alone.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn as nn
from timm.layers import resample_abs_pos_embed

from vitzoo.attention import ZooAttention
from vitzoo.attention.base import share_grid
from vitzoo.attention.canvas import canvas_valid, on_canvas

__all__ = ["pad_images", "forward_padded", "pool_padded"]

Grid = Tuple[int, int]


def pad_images(
    images: Sequence[torch.Tensor], patch_size: Sequence[int], channels: Optional[int] = None
) -> Tuple[torch.Tensor, List[Grid]]:
    """(pixels (B, C, H, W) zero-padded at the bottom and right, each image's patch grid) for float images
    (C, h_b, w_b) whose sides are multiples of the patch size; ``channels``: the C the model takes (else the first
    image's). A bad image is a one-line error naming its index, its shape and what is expected."""
    if not images:
        raise ValueError("a variable-size batch needs at least one image")
    for i, img in enumerate(images):
        if not isinstance(img, torch.Tensor):
            kind = f"{type(img).__module__}.{type(img).__qualname__}"
            raise TypeError(f"image {i} is a {kind}, not a torch.Tensor; give (C, H, W) tensors, channels first")
    if channels is None:
        channels = images[0].shape[0] if images[0].dim() == 3 else None
    grids = []
    for i, img in enumerate(images):
        shape = tuple(img.shape)
        if img.dim() != 3 or img.shape[0] != channels:
            expected = "C" if channels is None else channels
            raise ValueError(
                f"image {i} has shape {shape}, not ({expected}, H, W): give channels-first images with the model's "
                f"{expected} channels (one channel count for the whole list), or one (B, C, H, W) tensor for a batch "
                "of one size"
            )
        if not img.is_floating_point():
            raise ValueError(
                f"image {i} of shape {shape} has dtype {img.dtype}, not a float dtype: convert it as the model's "
                "training images were (e.g. img.float() / 255, then normalised)"
            )
        h, w = shape[-2:]
        if h % patch_size[0] or w % patch_size[1] or not h or not w:
            small = ", smaller than one patch" if h < patch_size[0] or w < patch_size[1] else ""
            raise ValueError(
                f"image {i} has shape {shape}: {h}x{w}, not a positive multiple of the patch size "
                f"{tuple(patch_size)}{small}; resize or crop it to a multiple (a partial patch would mix the image "
                "with padding)"
            )
        grids.append((h // patch_size[0], w // patch_size[1]))
    height, width = max(img.shape[-2] for img in images), max(img.shape[-1] for img in images)
    pixels = images[0].new_zeros(len(images), images[0].shape[0], height, width)
    for b, img in enumerate(images):
        pixels[b, :, : img.shape[-2], : img.shape[-1]] = img
    return pixels, grids


def _embed(model, pixels: torch.Tensor, grids: List[Grid]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Tokens (B, prefix + H W, C) with each image's own position embedding, and their key mask (B, prefix + H W)."""
    x = model.patch_embed(pixels)  # (B, H, W, C): dynamic_img_size keeps the grid
    B, H, W, C = x.shape
    layers = [block.attn for block in model.blocks if isinstance(block.attn, ZooAttention)]
    x = share_grid(x, layers, (H, W), grids).reshape(B, H * W, C)
    prefix = [t.expand(B, -1, -1) for t in (model.cls_token, model.reg_token) if t is not None]
    if model.pos_embed is not None:
        embedded = 0 if model.no_embed_class else model.num_prefix_tokens
        tables = {
            g: resample_abs_pos_embed(
                model.pos_embed, new_size=g, old_size=model.patch_embed.grid_size, num_prefix_tokens=embedded
            )[0, embedded:]
            for g in set(grids)
        }
        x = x + on_canvas([tables[g] for g in grids], grids, (H, W))
        if embedded:
            prefix = [torch.cat(prefix, dim=1) + model.pos_embed[:, :embedded]]
    valid = canvas_valid(grids, (H, W), model.num_prefix_tokens, x.device)
    x = torch.cat([*prefix, x], dim=1)
    return torch.where(valid[..., None], x, x.new_zeros(())), valid


def forward_padded(model, images: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(tokens (B, N, C) after the final norm, key mask (B, N)) of a list of images (C, h_b, w_b)."""
    if not model.dynamic_img_size:
        raise ValueError("a list of images of different sizes needs dynamic_img_size=True (vitzoo's default)")
    if not isinstance(model.patch_drop, nn.Identity):
        raise ValueError("patch_drop_rate > 0 drops tokens of the padded canvas; set it to 0 for a list of images")
    channels = getattr(getattr(model.patch_embed, "proj", None), "in_channels", None)
    pixels, grids = pad_images(images, model.patch_embed.patch_size, channels)
    x, valid = _embed(model, pixels, grids)
    x = model.norm_pre(model.pos_drop(x))
    mask = valid[:, None, None, :]
    for block in model.blocks:
        x = block(x, attn_mask=mask)
    return model.norm(x), valid


def pool_padded(model, x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The classifier's pooled features of each image's own tokens: the class token or the mean of its tokens."""
    if model.attn_pool is not None or model.global_pool not in ("token", "avg"):
        raise ValueError(
            f"global_pool={model.global_pool!r}: a list of images pools with 'token' or 'avg'; build the model with "
            "one of them"
        )
    if model.global_pool == "token":
        return x[:, 0]
    keep = (
        valid
        if model.pool_include_prefix
        else valid & (torch.arange(x.shape[1], device=x.device) >= model.num_prefix_tokens)
    )
    weights = keep.to(x.dtype)[..., None]
    return (x * weights).sum(1) / weights.sum(1)

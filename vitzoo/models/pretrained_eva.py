"""timm's RoPE ViT checkpoints (``Eva`` models: the naver ROPE-ViTs ``vit_*_patch16_rope_224``,
``*_rope_mixed_224``, their ``_ape`` twins, the ``vit_*_patch16_rope_reg*_gap_256`` ones, DINOv3's ViTs with a
plain MLP) in the layout of timm's ``VisionTransformer``, with the RoPE they were trained with.

An Eva pre-norm block with a plain MLP is timm's ``Block``: ``gamma_1`` / ``gamma_2`` are its layer scales
``ls1.gamma`` / ``ls2.gamma``; EVA's separate ``q_bias`` / ``v_bias`` are the fused ``qkv`` bias with a zero k
part; RoPE-Mixed's frequencies ``rope.freqs`` (2, depth, H, d/2) become each block's ``attn.rope.freqs``; a gated
attention's ``attn.gate`` is vitzoo's ``attn.out_gate`` (``gate: channel``, after the scale-norm as in timm). Axial
RoPE has no tensors: its settings come from the model (``eva_rope``). A model that pairs channel c with c + d/2
(rotate-half: DINOv3's) has the q and k rows of each head reordered to vitzoo's adjacent pairs
(``interleave_qk``): the same function. EVA-02's SwiGLU MLPs, separate q, k, v projections and pixel-frequency
or period-schedule RoPE do not map (``eva_differences`` names them).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
import torch.nn as nn
from timm.layers import PatchEmbed
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed

__all__ = ["is_eva", "eva_differences", "eva_rope", "eva_layout", "rotates_halves", "interleave_qk", "EVA_HINT"]

EVA_HINT = (
    "RoPE ViT checkpoints map (vit_*_patch16_rope_224, vit_*_patch16_rope_mixed_224, their _ape twins, "
    "vit_*_patch16_rope_reg*_gap_256, vit_*_patch16_dinov3 with a plain MLP)"
)
ROPES = (RotaryEmbeddingCat, RotaryEmbeddingMixed, RotaryEmbeddingDinoV3)


def is_eva(model: nn.Module) -> bool:
    return type(model).__name__ == "Eva" and hasattr(model, "rope")


def eva_differences(model: Any) -> List[str]:
    """The parts of a timm Eva that do not map onto vitzoo's ViT (empty: the whole model maps)."""
    block: Any = model.blocks[0]
    attn, rope = block.attn, getattr(model, "rope", None)
    out = []
    if type(model.patch_embed) is not PatchEmbed:
        out.append(f"patch embedding {type(model.patch_embed).__name__}")
    if type(block).__name__ != "EvaBlock":
        out.append(f"block {type(block).__name__}")
    if getattr(attn, "qkv", None) is None:
        out.append("separate q, k, v projections")
    if type(block.mlp).__name__ != "Mlp":
        out.append(f"MLP {type(block.mlp).__name__}")
    if rope is not None and type(rope) not in ROPES:
        out.append(f"RoPE {type(rope).__name__}")
    elif isinstance(rope, RotaryEmbeddingCat) and (rope.in_pixels or rope.grid_type != "index"):
        out.append("pixel-frequency RoPE")
    elif isinstance(rope, RotaryEmbeddingDinoV3) and rope.temperature is None:
        out.append("RoPE periods from a min/max schedule")
    return out


def rotates_halves(model: Any) -> bool:
    """Whether the Eva's attention pairs channel c with c + d/2 (rotate-half) instead of adjacent channels."""
    return bool(getattr(model.blocks[0].attn, "rotate_half", False))


def eva_rope(model: nn.Module) -> Optional[Dict[str, Any]]:
    """The Eva's RoPE as a vitzoo ``rope`` spec (None: none); mixed without base (its frequencies are loaded)."""
    rope = getattr(model, "rope", None)
    if rope is None:
        return None
    if isinstance(rope, RotaryEmbeddingMixed):
        return {"name": "mixed", "indexing": rope.grid_indexing}
    if isinstance(rope, RotaryEmbeddingDinoV3):
        return {
            "name": "dinov3",
            "base": rope.temperature,  # a float: eva_differences refuses the min/max period schedule (None)
            "indexing": rope.grid_indexing,
            "offset": float(rope.grid_offset),
            "normalize": rope.normalize_coords,
        }
    if not isinstance(rope, RotaryEmbeddingCat):
        return {"name": type(rope).__name__}  # not a vitzoo variant (eva_differences refuses it)
    ref = tuple(int(s) for s in rope.ref_feat_shape) if rope.ref_feat_shape is not None else None
    return {
        "name": "axial",
        "base": float(rope.temperature),
        "indexing": rope.grid_indexing,
        "offset": float(rope.grid_offset),
        "ref_grid": ref,
    }


def eva_layout(state: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """An Eva state dict renamed to timm's ``VisionTransformer`` (and vitzoo's RoPE / gate) names."""
    out = {}
    for name, tensor in state.items():
        if name.endswith(".attn.q_bias"):
            block = name[: -len("q_bias")]
            out[block + "qkv.bias"] = torch.cat([tensor, torch.zeros_like(tensor), state[block + "v_bias"]])
        elif name.endswith((".attn.v_bias", ".attn.k_bias")):
            continue
        elif name == "rope.freqs":
            out.update({f"blocks.{i}.attn.rope.freqs": tensor[:, i] for i in range(tensor.shape[1])})
        elif not name.startswith("rope."):  # axial tables are buffers built from the settings
            name = name.replace(".gamma_1", ".ls1.gamma").replace(".gamma_2", ".ls2.gamma")
            out[name.replace(".attn.gate.", ".attn.out_gate.")] = tensor
    return out


def interleave_qk(state: Dict[str, torch.Tensor], num_heads: int) -> Dict[str, torch.Tensor]:
    """``state`` (timm's ViT layout) with each head's q and k channels reordered from rotate-half pairs (c, c + d/2)
    to adjacent ones (2m, 2m + 1): the rows of q and k in ``qkv`` and the channels of ``q_norm`` / ``k_norm``."""
    out = dict(state)
    for name, tensor in state.items():
        if name.endswith((".attn.qkv.weight", ".attn.qkv.bias")):
            q, k, v = tensor.chunk(3)
            out[name] = torch.cat([_interleave(q, num_heads), _interleave(k, num_heads), v])
        elif ".attn.q_norm." in name or ".attn.k_norm." in name:
            out[name] = _interleave(tensor, 1)
    return out


def _interleave(rows: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Rows (H*d, ...) of H heads, each [c_0 .. c_(d/2-1), c_(d/2) .. c_(d-1)] -> [c_0, c_(d/2), c_1, ...]."""
    heads = rows.unflatten(0, (num_heads, 2, -1))  # (H, 2, d/2, ...): the two halves
    return heads.transpose(1, 2).flatten(0, 2)

"""ViT blocks other than timm's: MLLA's Mamba-like block (``block="mlla"``), around any zoo attention."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F
from timm.models.vision_transformer import Block

from vitzoo.attention import ZooAttention
from vitzoo.attention import functional as AF

__all__ = ["MllaBlock", "BLOCKS", "grid_conv_tokens"]


@torch.fx.wrap
def grid_conv_tokens(
    attn: ZooAttention, conv: nn.Conv2d, x: torch.Tensor, key_mask: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """``conv`` over the grid tokens of x (B, N, C), on the grid ``attn`` holds for this input; prefix tokens get 0,
    tokens ``key_mask`` ((B or 1, 1, N) bool) leaves out are seen as 0. A leaf under torch.fx, so each input's grid
    reaches it."""
    B, N, C = x.shape
    x = x if key_mask is None else AF.mask_keys(x, key_mask[:, 0])
    prefix = attn.num_prefix_tokens
    grid = conv(x[:, prefix:].transpose(1, 2).reshape(B, C, *attn.current_grid(N))).flatten(2).transpose(1, 2)
    return torch.cat([x.new_zeros(B, prefix, C), grid], dim=1)


def _depthwise(dim: int, dd: Dict[str, Any]) -> nn.Conv2d:
    return nn.Conv2d(dim, dim, 3, padding=1, groups=dim, **dd)


class MllaBlock(Block):
    """MLLA's block (Han et al. 2024): timm's ``Block`` (same arguments, norms, MLP, layer scales, drop paths) with
    MLLA's token mixer::

        x = x + CPE1(x)
        x = x + DropPath(W_out(Attn(SiLU(DWConv(W_in LN(x)))) * SiLU(W_act LN(x))))
        x = x + CPE2(x)
        x = x + DropPath(MLP(LN(x)))

    CPE1, CPE2 and DWConv are 3x3 depthwise convs over the patch grid; prefix (class / register) tokens get no CPE
    term and skip DWConv; under a key-padding ``attn_mask`` the convs see padded tokens as 0. ``Attn`` is the block's
    zoo attention (MLLA's own when the spec is ``mlla``); it keeps its
    output projection, so the attention branch has one C x C map more than MLLA's (W_out follows the gate).
    """

    attn: ZooAttention  # checked in __init__

    def __init__(self, dim: int, num_heads: int, *args, device=None, dtype=None, **kwargs):
        # *args are Block's positional options before device / dtype, which come only as keywords here
        super().__init__(dim, num_heads, *args, device=device, dtype=dtype, **kwargs)  # type: ignore[misc]
        if not isinstance(self.attn, ZooAttention):
            raise ValueError("block='mlla' needs a zoo attention layer; build the ViT through vitzoo.create_model")
        dd: Dict[str, Any] = {"device": device, "dtype": dtype}
        self.cpe1, self.cpe2, self.dwc = _depthwise(dim, dd), _depthwise(dim, dd), _depthwise(dim, dd)
        self.in_proj, self.act_proj, self.out_proj = (nn.Linear(dim, dim, **dd) for _ in range(3))

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        keys = AF.key_padding(attn_mask)
        x = x + grid_conv_tokens(self.attn, self.cpe1, x, keys)
        u = self.norm1(x)
        a = self.in_proj(u)
        prefix = self.attn.num_prefix_tokens
        a = F.silu(torch.cat([a[:, :prefix], grid_conv_tokens(self.attn, self.dwc, a, keys)[:, prefix:]], dim=1))
        a = self.attn(a, attn_mask=attn_mask, is_causal=is_causal) * F.silu(self.act_proj(u))
        x = x + self.drop_path1(self.ls1(self.out_proj(a)))
        x = x + grid_conv_tokens(self.attn, self.cpe2, x, keys)
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


BLOCKS = {"timm": Block, "mlla": MllaBlock}  # the ViT's block= option

"""The contract every mechanism follows: a timm-compatible ``attn_layer`` on (B, N, C) tokens.

``ZooAttention`` owns what all mechanisms share -- the input projections and their head layout
(``heads: split | projected``), qk-norm, logit noise, 2-D RoPE (``rope``), the sigmoid output gate (``gate``), the
output projection, PVT's spatial reduction of the keys (``sr_ratio``, ``sr_pool``), Swin's (shifted) windows around
the mixing (``window``) -- and asks its subclass only how tokens mix (``mix``) and what the (implied) attention
matrix is (``probs``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..options import is_count
from .canvas import canvas_rope
from .reduction import spatial_reduction
from .rope import RopeSpec, build_rope, rotate_all
from .windowed import windowed_mix, windowed_probs

__all__ = ["ZooAttention", "HeadProjection", "HEAD_MODES", "GATES", "ROPE_FORMS", "share_grid", "gate_heads"]

HEAD_MODES = ("split", "projected")
GATES = ("channel", "head")  # the sigmoid output gate: one value per head channel, or one per head
ROPE_FORMS = ("rotate", "decoupled")  # how a mechanism takes RoPE (ZooAttention.rope_form)


class HeadProjection(nn.Module):
    """Tokens (B, N, C) -> ``num_outputs`` tensors (B, H, N, D), one per projection (q, k, v...).

    ``split`` (timm's way, docs/mechanisms.md section 2): one linear map to ``H*D`` channels, cut into ``H`` heads.
    ``projected``: one ``C -> C`` map per output (``q_i = x_i W_q``), then each head applies its
    own ``C -> D`` matrix to the full ``q_i`` (``q^{i,m} = q_i W^{q,m}``), so ``D`` is free. The
    per-head matrices start variance-preserving (std 1/sqrt(C)), so at init both layouts give
    q, k, v of the same scale.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        head_dim: int,
        num_outputs: int,
        mode: str = "split",
        bias: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if mode not in HEAD_MODES:
            raise ValueError(f"unknown heads={mode!r}; choose one of {list(HEAD_MODES)}")
        dd: Dict[str, Any] = {"device": device, "dtype": dtype}
        self.mode, self.num_heads, self.head_dim, self.num_outputs = mode, num_heads, head_dim, num_outputs
        if mode == "split":
            self.proj = nn.Linear(dim, num_outputs * num_heads * head_dim, bias=bias, **dd)
            self.head_weight = None
        else:
            self.proj = nn.Linear(dim, num_outputs * dim, bias=bias, **dd)
            self.head_weight = nn.Parameter(torch.empty(num_outputs, dim, num_heads * head_dim, **dd))
            nn.init.normal_(self.head_weight, std=dim**-0.5)

    def forward(self, x: torch.Tensor, kv_input: Optional[torch.Tensor] = None) -> Tuple[torch.Tensor, ...]:
        """All outputs of x; with ``kv_input`` (spatial reduction), the first output (q) of x, the rest of it."""
        if kv_input is None:
            return self._outputs(x, 0, self.num_outputs)
        return self._outputs(x, 0, 1) + self._outputs(kv_input, 1, self.num_outputs)

    def _outputs(self, x: torch.Tensor, start: int, stop: int) -> Tuple[torch.Tensor, ...]:
        B, N, _ = x.shape
        count = stop - start
        if count == self.num_outputs:
            out = self.proj(x)
        else:  # the rows of outputs start..stop-1 of the one weight
            width = self.proj.out_features // self.num_outputs
            rows = slice(start * width, stop * width)
            out = F.linear(x, self.proj.weight[rows], None if self.proj.bias is None else self.proj.bias[rows])
        out = out.reshape(B * N, count, -1)
        if self.head_weight is not None:
            out = torch.bmm(out.transpose(0, 1), self.head_weight[start:stop]).transpose(0, 1)
        out = out.reshape(B, N, count, self.num_heads, self.head_dim)
        return out.permute(2, 0, 3, 1, 4).unbind(0)


class ZooAttention(nn.Module):
    """Base of every mechanism; the constructor takes timm's ``attn_layer`` arguments.

    Subclasses set ``projections`` (which of q, k, v they need) and implement ``mix`` and
    ``probs``. Context arguments (``num_tokens``, ``num_prefix_tokens``, ``grid_size``) describe
    the token layout the model was built for; the backbone updates ``token_grid`` per forward and
    numbers its blocks in ``block_index``.
    """

    projections: Sequence[str] = ("q", "k", "v")
    has_logits: bool = True  # False: no n x n attention matrix is ever formed (so nothing for attn_drop)
    no_mask: Optional[str] = None  # why the mechanism takes no attn_mask, and what to use (None: it takes one)
    # why it cannot leave padded keys out (a variable-size batch's mask), where ``no_mask`` does not say it alone
    no_padding: Optional[str] = None
    no_causal: Optional[str] = None  # why it has no causal form, and what to use (None: it has one)
    # How the mechanism takes ``rope``: "rotate" (q and k turned after qk-norm, before ``mix``) or "decoupled" (its
    # ``mix`` turns its kernel features itself, via ``rope_angles``); ``no_rope`` says why it takes none instead.
    rope_form: Optional[str] = None
    no_rope: Optional[str] = None
    # why the keys cannot be spatially reduced (sr_ratio / sr_pool); None: every key and value may come from the
    # reduced grid (the mixing treats the keys as a set)
    no_sr: Optional[str] = (
        "its keys are tied to the query grid (position tables, convs over V or windows); set sr_ratio: 1"
    )
    no_window: Optional[str] = None  # why it takes no ``window`` (None: any window runs it)

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = False,
        qk_norm: bool = False,
        scale_norm: bool = False,
        proj_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: Optional[Callable[..., nn.Module]] = None,
        *,
        heads: str = "split",
        head_dim: Optional[int] = None,
        logit_noise: float = 0.0,
        rope: RopeSpec = None,
        gate: Optional[str] = None,
        sr_ratio: int = 1,
        sr_pool: Optional[int] = None,
        window: Optional[int] = None,
        window_shift: bool = True,
        dim_out: Optional[int] = None,
        num_tokens: Optional[int] = None,
        num_prefix_tokens: int = 0,
        grid_size: Optional[Tuple[int, int]] = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        dd: Dict[str, Any] = {"device": device, "dtype": dtype}
        if head_dim is None:
            if dim % num_heads:
                raise ValueError(
                    f"dim={dim} is not divisible by num_heads={num_heads}; choose num_heads dividing {dim}, or set "
                    f"the attention option head_dim (attention={{'name': ..., 'head_dim': "
                    f"{max(1, dim // num_heads)}}})"
                )
            head_dim = dim // num_heads
        if not is_count(head_dim):
            raise ValueError(f"head_dim must be a positive integer, got {head_dim!r}")
        head_dim = int(head_dim)
        if (qk_norm or scale_norm) and norm_layer is None:
            raise ValueError("qk_norm / scale_norm need a norm_layer")
        if logit_noise < 0:
            raise ValueError(f"logit_noise is a standard deviation and must be >= 0, got {logit_noise}")
        if rope is not None and self.no_rope is not None:
            raise ValueError(f"{type(self).__name__} takes no rope: {self.no_rope}")
        if gate is not None and gate not in GATES:
            raise ValueError(f"unknown gate={gate!r}; choose one of {list(GATES)} (or null for none)")
        if attn_drop > 0 and not self.has_logits:
            raise ValueError(
                f"attn_drop={attn_drop}: {type(self).__name__} never forms the attention matrix, so it "
                "has nothing to drop; set attn_drop_rate=0 (regularise with proj_drop_rate or "
                "drop_path_rate instead)"
            )
        self.num_heads, self.head_dim, self.heads = num_heads, head_dim, heads
        self.attn_dim = num_heads * head_dim
        self.logit_noise = float(logit_noise)
        self.eval_logit_noise = 0.0
        self.num_tokens, self.num_prefix_tokens = num_tokens, num_prefix_tokens
        self.grid_size: Optional[Tuple[int, int]] = (grid_size[0], grid_size[1]) if grid_size is not None else None
        self.token_grid: Optional[Tuple[int, int]] = None
        # a variable-size batch: each image's grid, its tokens at the top-left of the token_grid canvas (else None)
        self.image_grids: Optional[Tuple[Tuple[int, int], ...]] = None
        self.block_index = 0  # this layer's block in the backbone's stack (set by the ViT; window shifts odd ones)
        self.attention_probe: Optional[Callable] = None

        self.in_proj = HeadProjection(dim, num_heads, head_dim, len(self.projections), heads, qkv_bias, **dd)
        use_qk_norm = qk_norm and "q" in self.projections
        # norm_layer is not None whenever qk_norm or scale_norm is set (checked above)
        self.q_norm = norm_layer(head_dim, **dd) if use_qk_norm and norm_layer is not None else nn.Identity()
        self.k_norm = norm_layer(head_dim, **dd) if use_qk_norm and norm_layer is not None else nn.Identity()
        self.attn_drop = nn.Dropout(attn_drop)
        self.norm = norm_layer(self.attn_dim, **dd) if scale_norm and norm_layer is not None else nn.Identity()
        self.proj = nn.Linear(self.attn_dim, dim_out or dim, bias=proj_bias, **dd)
        self.proj_drop = nn.Dropout(proj_drop)
        self.rope = build_rope(rope, head_dim, num_heads, **dd)
        # sigma(x W_g + b_g) of the layer's input: H*d values (channel) or H (head); bias as q, k, v's (timm's gate)
        self.gate_mode = gate
        self.out_gate = (
            nn.Linear(dim, self.attn_dim if gate == "channel" else num_heads, bias=qkv_bias, **dd) if gate else None
        )
        self.sr = spatial_reduction(type(self).__name__, dim, sr_ratio, sr_pool, self.no_sr, **dd)
        if self.sr is not None and (self.projections[0] != "q" or len(self.projections) < 2 or rope is not None):
            raise ValueError(
                f"{type(self).__name__} takes no spatial reduction with these options: it reduces the keys and values "
                "of a mechanism with queries, and keys on another grid than the queries take no rope; set sr_ratio: 1"
            )
        self.window, self.window_shift = self._window(window, window_shift, num_prefix_tokens)
        self.register_load_state_dict_pre_hook(ZooAttention._timm_qkv_names)

    def _window(self, window: Optional[int], shift: bool, num_prefix: int) -> Tuple[Optional[int], bool]:
        if window is None:
            return None, bool(shift)
        if self.no_window is not None:
            raise ValueError(f"{type(self).__name__} takes no window option: {self.no_window}")
        if not is_count(window):
            raise ValueError(f"window must be a positive integer (tokens per window side) or null, got {window!r}")
        if num_prefix:
            raise ValueError(
                f"window={window}: windows cut the patch grid, and this model has {num_prefix} prefix (class / "
                "register) tokens; build it without them (class_token=False, global_pool='avg') or drop window"
            )
        if not isinstance(shift, bool):
            raise ValueError(f"window_shift={shift!r}; give true or false")
        return int(window), shift

    def _timm_qkv_names(self, state_dict: dict, prefix: str, *args) -> None:
        """Read timm's fused ``qkv`` (ViT, Swin), or its ``q`` and ``kv`` (PVT), as ``in_proj.proj`` (the same tensor
        for split q, k, v heads: a split-head softmax export keeps timm's names so that plain timm loads it), and
        PVT's ``sr`` and ``norm`` as the spatial reduction's."""
        if self.heads == "split" and tuple(self.projections) == ("q", "k", "v"):
            for kind in ("weight", "bias"):
                if f"{prefix}qkv.{kind}" in state_dict:
                    state_dict[f"{prefix}in_proj.proj.{kind}"] = state_dict.pop(f"{prefix}qkv.{kind}")
                if f"{prefix}q.{kind}" in state_dict and f"{prefix}kv.{kind}" in state_dict:
                    parts = (state_dict.pop(f"{prefix}q.{kind}"), state_dict.pop(f"{prefix}kv.{kind}"))
                    state_dict[f"{prefix}in_proj.proj.{kind}"] = torch.cat(parts)
        if self.sr is not None and isinstance(self.norm, nn.Identity):
            for kind in ("weight", "bias"):
                for name in ("sr", "norm"):
                    if f"{prefix}{name}.{kind}" in state_dict:
                        state_dict[f"{prefix}sr.{name}.{kind}"] = state_dict.pop(f"{prefix}{name}.{kind}")

    # -- what a mechanism implements -------------------------------------------------------
    def mix(
        self,
        x: torch.Tensor,
        q: Optional[torch.Tensor],
        k: Optional[torch.Tensor],
        v: torch.Tensor,
        attn_mask: Optional[torch.Tensor],
        is_causal: bool,
        logit_noise: float,
    ) -> torch.Tensor:
        """Mix value tokens: (B, H, N, D) -> (B, H, N, D)."""
        raise NotImplementedError

    def probs(
        self,
        x: torch.Tensor,
        q: Optional[torch.Tensor],
        k: Optional[torch.Tensor],
        attn_mask: Optional[torch.Tensor],
        is_causal: bool,
        query_index: torch.Tensor,
    ) -> torch.Tensor:
        """The (implied) noiseless attention matrix for the queries ``query_index``: (B, H, Q, N)."""
        raise NotImplementedError

    # -- shared machinery ---------------------------------------------------------------------
    def check_mask(self, attn_mask: Optional[torch.Tensor], is_causal: bool, x: torch.Tensor) -> None:
        """An ``attn_mask`` or ``is_causal`` the mechanism has no form for is a one-line error (``no_mask``,
        ``no_causal`` say why), never silently ignored; so is a mask that does not broadcast to (B, heads, N, N) of
        the tokens x (B, N, C)."""
        if attn_mask is not None and self.no_mask is not None and self.image_grids is not None:
            raise ValueError(self.padding_refusal(self.no_padding or self.no_mask))
        for given, option, why in (
            (attn_mask is not None, "attn_mask", self.no_mask),
            (is_causal, "is_causal", self.no_causal),
        ):
            if given and why is not None:
                raise ValueError(f"{type(self).__name__} takes no {option}: {why}")
        if attn_mask is None:
            return
        full = (x.shape[0], self.num_heads, x.shape[1], x.shape[1])
        shape = tuple(attn_mask.shape)
        if len(shape) > 4 or any(s != 1 and s != t for s, t in zip(shape[::-1], full[::-1])):
            raise ValueError(
                f"attn_mask {shape} does not broadcast to (B, heads, N, N) = {full} of this input (N counts its "
                f"{self.num_prefix_tokens} prefix tokens); give (B, 1, 1, N) key padding or (B, 1, N, N), True = attend"
            )

    def padding_refusal(self, why: str, fix: Optional[str] = None) -> str:
        """The one-line refusal of a variable-size batch (``image_grids`` set: the attn_mask is the padding's, not the
        caller's): the mechanism cannot leave the padded keys out, ``why``, and ``fix`` (else: a mechanism that
        takes key padding)."""
        fix = fix or "use a mechanism that takes key padding (e.g. attention='linear' or 'softmax')"
        return (
            f"{type(self).__name__} cannot take a variable-size batch: a list of images is padded to one canvas and "
            f"the padded keys must be left out, but {why}; give images of one size per batch (one (B, C, H, W) "
            f"tensor), or {fix} (docs/mechanisms.md section 22)"
        )

    @property
    def dropout_p(self) -> float:
        """The attention-dropout probability of this forward: ``attn_drop``'s while training, 0 in eval."""
        return self.attn_drop.p if self.training else 0.0

    @property
    def active_logit_noise(self) -> float:
        """``logit_noise`` while training, ``eval_logit_noise`` (0 unless switched on) in eval."""
        return self.logit_noise if self.training else self.eval_logit_noise

    def current_grid(self, num_tokens: int) -> Tuple[int, int]:
        """The (h, w) patch grid of the current input: set by the backbone (``token_grid``), else a square guess. A
        token count other than the backbone's grid's is an error, never a guessed grid: tokens were dropped or
        added between the patch embedding and the attention, and their grid places are lost."""
        n = num_tokens - self.num_prefix_tokens
        grid = self.token_grid
        if grid is not None and grid[0] * grid[1] == n:
            return grid
        if grid is not None:
            raise ValueError(
                f"{type(self).__name__} needs each token's place on the patch grid, and its input has {n} grid tokens "
                f"where token_grid, the {grid[0]}x{grid[1]} grid of the backbone's last input, has {grid[0] * grid[1]}"
                ": tokens were dropped on the way (timm's patch_drop_rate > 0; set it to 0), or the layer is called "
                "outside its backbone (set its token_grid to the input's grid)"
            )
        side = math.isqrt(max(n, 0))
        if side * side != n:
            raise ValueError(
                f"cannot infer the patch grid of {num_tokens} tokens ({self.num_prefix_tokens} prefix); "
                f"set token_grid=(h, w) on the attention layer or use a square input"
            )
        return side, side

    def rope_angles(self, num_tokens: int, like: torch.Tensor) -> torch.Tensor:
        """The RoPE table of the current input's grid (``rope`` set): (H or 1, num_tokens, d/2), prefix rows 0; for a
        variable-size batch (``image_grids``) each image's own table on the canvas, (B, H or 1, num_tokens, d/2)."""
        assert self.rope is not None
        grid = self.current_grid(num_tokens)
        if self.image_grids is not None:
            return canvas_rope(self.rope, self.image_grids, grid, self.num_prefix_tokens, like)
        return self.rope.angles(grid, self.num_prefix_tokens, like)

    def project(self, x: torch.Tensor):
        """q, k, v as (B, H, N, D) (None for projections the mechanism does not use); with a spatial reduction, k and v
        (B, H, n', D) of the reduced grid."""
        outs = self.in_proj(x, None if self.sr is None else reduce_keys(self, x))
        out = {name: outs[i] for i, name in enumerate(self.projections)}
        q, k = out.get("q"), out.get("k")
        if q is not None:
            q = self.q_norm(q)
        if k is not None:
            k = self.k_norm(k)
        return q, k, out.get("v")

    def forward(
        self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False
    ) -> torch.Tensor:
        B, N, _ = x.shape
        q, k, v = self.project(x)
        out = attend(self, x, q, k, v, attn_mask, is_causal).transpose(1, 2).reshape(B, N, self.attn_dim)
        return self.output(x, out)

    def output(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """The merged heads (B, N, H*d) through ``norm``, the sigmoid gate of the layer's input x (if any), ``proj``."""
        out = self.norm(out)
        if self.out_gate is not None:
            out = gate_heads(out, self.out_gate(x), self.num_heads)
        return self.proj_drop(self.proj(out))

    def __prepare_scriptable__(self):
        raise RuntimeError(
            f"torch.jit.script cannot compile {type(self).__name__} (vitzoo's attention layers are not "
            "TorchScript); use torch.jit.trace, torch.export or torch.onnx.export instead"
        )

    def extra_repr(self) -> str:
        return (
            f"heads={self.heads}, num_heads={self.num_heads}, head_dim={self.head_dim}, logit_noise={self.logit_noise}"
            f", gate={self.gate_mode}" + (f", window={self.window}" if self.window else "")
        )


def gate_heads(out: torch.Tensor, logits: torch.Tensor, num_heads: int) -> torch.Tensor:
    """out (B, N, H*d) times sigmoid(logits): (B, N, H*d) one gate per channel, or (B, N, H) one per head."""
    gate = logits.sigmoid().unflatten(-1, (num_heads, -1))
    return (out.unflatten(-1, (num_heads, -1)) * gate).flatten(-2)


# Under torch.fx (torchvision's feature extractor, timm's FX features) the functions below are leaves: the
# graph calls them on real tensors at run time, so each input's patch grid reaches the grid- and shape-dependent
# mixing, and tracing never stores a Proxy on the model.
@torch.fx.wrap
def attend(
    layer: ZooAttention,
    x: torch.Tensor,
    q: Optional[torch.Tensor],
    k: Optional[torch.Tensor],
    v: torch.Tensor,
    attn_mask: Optional[torch.Tensor],
    is_causal: bool,
) -> torch.Tensor:
    """``layer.mix`` (train/eval logit noise as the layer is now) and the layer's attention probe, if any; q and k
    turned by the layer's RoPE first where it takes the ``rotate`` form."""
    layer.check_mask(attn_mask, is_causal, x)
    if (layer.sr is not None or layer.window is not None) and (attn_mask is not None or is_causal):
        raise ValueError(
            f"{type(layer).__name__} with sr_ratio / sr_pool / window takes no attn_mask or is_causal: its keys are "
            "not the input's tokens one by one; give one batch of one size, unmasked"
        )
    if layer.rope is not None and layer.rope_form != "decoupled":  # decoupled: mix turns its features itself
        if layer.rope_form != "rotate" or q is None or k is None:
            raise TypeError(f"{type(layer).__name__} has a rope but no rope_form among {ROPE_FORMS} (or no_rope)")
        q, k = rotate_all(layer.rope_angles(q.shape[-2], q), q, k)
    if layer.window is not None:
        out = windowed_mix(layer, x, q, k, v, layer.active_logit_noise)
    else:
        out = layer.mix(x, q, k, v, attn_mask, is_causal, layer.active_logit_noise)
    if layer.attention_probe is not None and layer.window is not None:
        layer.attention_probe(layer, lambda index: windowed_probs(layer, x, q, k, index), x.shape[1])
    elif layer.attention_probe is not None:  # with spatial reduction: rows over the reduced keys
        layer.attention_probe(layer, lambda index: layer.probs(x, q, k, attn_mask, is_causal, index), x.shape[1])
    return out


@torch.fx.wrap
def reduce_keys(layer: ZooAttention, x: torch.Tensor) -> torch.Tensor:
    """The key / value input of ``layer`` with spatial reduction: x (B, N, C) on the layer's grid, reduced."""
    assert layer.sr is not None
    return layer.sr(x, layer.current_grid(x.shape[1]), layer.num_prefix_tokens)


@torch.fx.wrap
def share_grid(
    x: torch.Tensor,
    layers: Sequence[ZooAttention],
    grid: Tuple[int, int],
    image_grids: Optional[Sequence[Tuple[int, int]]] = None,
) -> torch.Tensor:
    """Set ``token_grid = grid`` and ``image_grids`` on ``layers`` and return ``x``: a backbone passes each input's
    grid through this (a node on x's path under torch.fx, wrapped again where it is called: ``torch.fx.wrap``
    patches by module)."""
    images = None if image_grids is None else tuple((int(h), int(w)) for h, w in image_grids)
    for layer in layers:
        layer.token_grid = (grid[0], grid[1])
        layer.image_grids = images
    return x

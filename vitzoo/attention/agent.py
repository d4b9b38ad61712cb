"""Agent attention (Han et al., ECCV 2024): queries and keys meet through n_a agent tokens.

out = softmax(Q A^T + B_q) (softmax(A K^T + B_a) V) + DWC(V), A the patch queries average-pooled to an agent
grid, B_q, B_a the official position biases; the mathematics, cost and resolution behaviour are in
docs/mechanisms.md, section 12.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as AF
from .base import ZooAttention
from .canvas import tables_on_canvas
from .grid import GridModule, Layout
from .grid_conv import grid_conv
from .registry import register_attention

__all__ = ["AgentAttention", "AgentBias", "agent_attention", "agent_probs", "agent_grid", "pool_agents"]

Grid = Tuple[int, int]
Biases = Optional[Tuple[torch.Tensor, torch.Tensor]]
BIAS_TABLE = 7  # the side of the official agent-token bias tables, resized to the patch grid


def agent_grid(grid: Grid, num_agents: int) -> Grid:
    """The agents' grid: side x side (side^2 = ``num_agents``), clipped to the patch grid per axis."""
    side = math.isqrt(num_agents)
    return min(side, grid[0]), min(side, grid[1])


def _pool_matrix(size, out, like: torch.Tensor) -> torch.Tensor:
    """(out, size) rows averaging the bins of adaptive average pooling: [floor(i s / o), ceil((i + 1) s / o))."""
    i, j = torch.arange(out, device=like.device), torch.arange(size, device=like.device)
    start, end = (i * size) // out, ((i + 1) * size + out - 1) // out
    bins = ((j >= start[:, None]) & (j < end[:, None])).to(like.dtype)
    return bins / bins.sum(-1, keepdim=True)


def _image_pool_matrices(grid: Grid, agents: Grid, image_grids: Sequence[Grid], like: torch.Tensor):
    """(P_h (B, 1, 1, a_h, H), P_w (B, 1, 1, a_w, W)): each image's pooling bins over its own grid, at the top-left of
    the H x W canvas (0 beyond it)."""
    return tuple(
        torch.stack([F.pad(_pool_matrix(g[axis], agents[axis], like), (0, grid[axis] - g[axis])) for g in image_grids])[
            :, None, None
        ]
        for axis in (0, 1)
    )


def pool_agents(
    q: torch.Tensor,
    grid: Grid,
    num_prefix: int,
    agents: Grid,
    key_mask: Optional[torch.Tensor] = None,
    image_grids: Optional[Sequence[Grid]] = None,
) -> torch.Tensor:
    """Agent tokens A (B, H, n_a, D): the patch queries adaptively average-pooled to ``agents``, written as
    two averaging matrices (P_h X P_w^T) so that exporters carry it at any grid (no adaptive-pool op).

    ``key_mask`` ((B or 1, 1, N) bool): each bin averages its unpadded tokens (an empty bin gives 0); ``image_grids``:
    the bins of each image's own grid, the image at the top-left of ``grid`` (a variable-size batch)."""
    B, H, _, D = q.shape
    patches = q[:, :, num_prefix:].transpose(-2, -1).reshape(B, H, D, *grid)
    if key_mask is None and image_grids is None:
        pooled = _pool_matrix(grid[0], agents[0], q) @ patches @ _pool_matrix(grid[1], agents[1], q).transpose(0, 1)
        return pooled.reshape(B, H, D, -1).transpose(-2, -1)
    if image_grids is None:
        rows, cols = _pool_matrix(grid[0], agents[0], q), _pool_matrix(grid[1], agents[1], q)
    else:
        rows, cols = _image_pool_matrices(grid, agents, image_grids, q)
    ones = torch.ones(1, 1, 1, *grid, dtype=q.dtype, device=q.device)
    weight = ones if key_mask is None else key_mask[..., num_prefix:].reshape(-1, 1, 1, *grid).to(q.dtype)
    total = rows @ (patches * weight) @ cols.transpose(-2, -1)
    pooled = total / (rows @ weight @ cols.transpose(-2, -1)).clamp_min(torch.finfo(q.dtype).tiny)
    return pooled.reshape(B, H, D, -1).transpose(-2, -1)


def _masked_biases(biases: Biases, key_mask: Optional[torch.Tensor], like: torch.Tensor):
    """(B_q, B_a) in ``like``'s dtype with -inf on the padded keys of B_a (a bool key mask alone without biases)."""
    query_bias, agent_bias = (None, None) if biases is None else (b.to(like.dtype) for b in biases)
    if key_mask is None:
        return query_bias, agent_bias
    keys = key_mask.unsqueeze(-2)  # (B or 1, 1, 1, N)
    return query_bias, keys if agent_bias is None else agent_bias.masked_fill(~keys, float("-inf"))


def agent_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grid: Grid,
    num_prefix: int = 0,
    num_agents: int = 49,
    scales: Tuple[Optional[float], Optional[float]] = (None, None),
    logit_noise: float = 0.0,
    dropout_p: float = 0.0,
    biases: Biases = None,
    key_mask: Optional[torch.Tensor] = None,
    image_grids: Optional[Sequence[Grid]] = None,
    agents: Optional[Grid] = None,
) -> torch.Tensor:
    """softmax(Q A^T s_q + B_q) (softmax(A K^T s_a + B_a) V) in O(n n_a d); ``scales`` = (s_q, s_a), default
    1/sqrt(d) (s_a may be a (B, 1, 1, 1) tensor: each image's log-n scale); ``biases`` = (B_q (H, N, n_a), B_a (H,
    n_a, N)), per image with a leading B axis, or None. ``key_mask``, ``image_grids``: padded keys get no weight and
    no share of an agent (``pool_agents``); ``agents``: the agent grid (default ``agent_grid(grid, num_agents)``).

    Logit noise of std ``logit_noise`` goes on both logit matrices, independently.
    """
    a = pool_agents(q, grid, num_prefix, agents or agent_grid(grid, num_agents), key_mask, image_grids)
    query_bias, agent_bias = _masked_biases(biases, key_mask, q)
    a_keys, s_a = (a * scales[1].to(a.dtype), 1.0) if isinstance(scales[1], torch.Tensor) else (a, scales[1])
    agent_v = AF.softmax_attention(a_keys, k, v, s_a, logit_noise, attn_mask=agent_bias, dropout_p=dropout_p)
    return AF.softmax_attention(q, a, agent_v, scales[0], logit_noise, attn_mask=query_bias, dropout_p=dropout_p)


def agent_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    grid: Grid,
    query_index: torch.Tensor,
    num_prefix: int = 0,
    num_agents: int = 49,
    scales: Tuple[Optional[float], Optional[float]] = (None, None),
    biases: Biases = None,
    key_mask: Optional[torch.Tensor] = None,
    image_grids: Optional[Sequence[Grid]] = None,
    agents: Optional[Grid] = None,
) -> torch.Tensor:
    """The implied n x n matrix softmax(Q A^T s_q + B_q) softmax(A K^T s_a + B_a) for the queries ``query_index``."""
    a = pool_agents(q, grid, num_prefix, agents or agent_grid(grid, num_agents), key_mask, image_grids)
    query_bias, agent_bias = _masked_biases(biases, key_mask, q)
    query_bias = None if query_bias is None else query_bias[..., query_index, :]
    return AF.softmax_probs(q[:, :, query_index], a, scales[0], query_bias) @ AF.softmax_probs(
        a, k, scales[1], agent_bias
    )


def _resize(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """Axis ``dim`` of ``t`` resized to ``size`` by linear interpolation (half-pixel centres)."""
    if t.shape[dim] == size:
        return t
    # non-negative axes: the TorchScript ONNX exporter copies a negative movedim axis into Transpose's perm
    last, dim = t.dim() - 1, dim % t.dim()
    t = t.movedim(dim, last)
    out = F.interpolate(t.reshape(1, -1, t.shape[-1]), size=size, mode="linear", align_corners=False)
    return out.reshape(*t.shape[:-1], size).movedim(last, dim)


def _resize_grid(t: torch.Tensor, size: Grid) -> torch.Tensor:
    """The last two axes of ``t`` (an h x w grid) resized bilinearly (half-pixel centres)."""
    if tuple(t.shape[-2:]) == tuple(size):
        return t
    out = F.interpolate(t.reshape(1, -1, *t.shape[-2:]), size=tuple(size), mode="bilinear", align_corners=False)
    return out.reshape(*t.shape[:-2], *size)


class AgentBias(GridModule):
    """The official agent-attention position biases of one layer, per head.

    B_a (agents -> tokens) = a 7x7 table per agent resized to the patch grid + a per-agent row bias (one entry
    per grid row) + a column bias (per grid column); prefix tokens get one entry per agent each. B_q (tokens ->
    agents) is built the same way from its own tables. At another grid the tables are resized to it (bilinear,
    linear for the row and column biases); where the agent grid is clipped to a small patch grid, the agent axis
    is resized as a side x side grid too. The row / column tables follow a state dict saved at another grid.
    """

    # parameters, registered by name in __init__
    an: torch.Tensor
    na: torch.Tensor
    ah: torch.Tensor
    aw: torch.Tensor
    ha: torch.Tensor
    wa: torch.Tensor
    ac: torch.Tensor
    ca: torch.Tensor

    def __init__(self, num_heads: int, num_agents: int, layout: Layout, device=None, dtype=None):
        super().__init__(layout, device)
        H, n_a, P, T = num_heads, num_agents, layout.prefix, BIAS_TABLE
        shapes = {
            "an": (H, n_a, T, T),
            "na": (H, n_a, T, T),
            "ah": (H, n_a, layout.h),
            "aw": (H, n_a, layout.w),
            "ha": (H, layout.h, n_a),
            "wa": (H, layout.w, n_a),
            "ac": (H, n_a, P),
            "ca": (H, P, n_a),
        }
        for name, shape in shapes.items():
            param = nn.Parameter(torch.empty(shape, device=device, dtype=dtype))
            nn.init.trunc_normal_(param, std=0.02)
            self.register_parameter(name, param)
        self.side = math.isqrt(num_agents)

    def forward(self, grid: Grid, agents: Grid) -> Tuple[torch.Tensor, torch.Tensor]:
        """(B_q (H, P + h w, a), B_a (H, a, P + h w)) at patch ``grid`` with an ``agents`` grid (a of them)."""
        h, w = grid
        to_tokens = (
            _resize_grid(AF.acc(self.an), grid)
            + _resize(AF.acc(self.ah), -1, h)[..., None]
            + _resize(AF.acc(self.aw), -1, w)[..., None, :]
        ).flatten(-2)
        rows_cols = _resize(AF.acc(self.ha), 1, h)[:, :, None] + _resize(AF.acc(self.wa), 1, w)[:, None]
        to_agents = _resize_grid(AF.acc(self.na), grid).flatten(-2).transpose(-2, -1) + rows_cols.flatten(1, 2)
        agent_bias = self._agents(torch.cat([AF.acc(self.ac), to_tokens], dim=-1), 1, agents)
        query_bias = self._agents(torch.cat([AF.acc(self.ca), to_agents], dim=1), 2, agents)
        return query_bias, agent_bias

    def _agents(self, t: torch.Tensor, dim: int, agents: Grid) -> torch.Tensor:
        """The agent axis ``dim`` resized from the side x side agent grid to ``agents`` (unchanged when equal)."""
        if tuple(agents) == (self.side, self.side):
            return t
        last = t.dim() - 1  # non-negative, as in _resize
        t = t.movedim(dim, last).unflatten(last, (self.side, self.side))
        return _resize_grid(t, agents).flatten(last).movedim(last, dim)

    def resample_state(self, state, prefix, src):
        for name, dim, size in (
            ("ah", 2, self.built.h),
            ("aw", 2, self.built.w),
            ("ha", 1, self.built.h),
            ("wa", 1, self.built.w),
        ):
            key = prefix + name
            if key in state:
                state[key] = _resize(AF.acc(state[key]), dim, size).to(state[key].dtype)


@register_attention("agent")
class AgentAttention(ZooAttention):
    """Agent attention with a depthwise ``kernel_size`` conv on V over the patch grid (0: none).

    ``num_agents`` (a square, default 7x7) agents are pooled from the patch queries; prefix (class)
    tokens are queries and keys of both softmaxes but neither agents nor part of the conv term.
    ``bias``: the official position biases on both logit matrices (``AgentBias``; needs the built grid).
    ``scale: log_n`` counts n_a keys in softmax(Q A^T) and N in softmax(A K^T). A key-padding ``attn_mask``: agents
    pool unpadded tokens only, padded keys get no weight, the conv sees them as 0; in a variable-size batch
    (``image_grids``) each image pools over its own grid with its own biases (its agent grid must be the batch's).
    """

    rope_form = "rotate"  # agents pool the turned queries of their region
    no_causal = "every query reads every key through the agents; use attention='softmax' for causal inputs"

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        num_agents: int = 49,
        kernel_size: int = 3,
        bias: bool = True,
        scale: str = "sqrt_d",
        **kwargs,
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        side = math.isqrt(max(num_agents, 0))
        if num_agents < 1 or side * side != num_agents:
            raise ValueError(
                f"num_agents={num_agents} must be a perfect square (agents sit on a side x side grid), "
                f"e.g. num_agents: {max(side, 1) ** 2}"
            )
        self.num_agents, self.scale_mode = num_agents, scale
        self.train_keys = self._train_keys(scale)
        self.dwc = grid_conv("agent", self.attn_dim, kernel_size, **kwargs)
        if not isinstance(bias, bool):
            raise ValueError(f"agent bias={bias!r}; give true or false")
        if bias and self.grid_size is None:
            raise ValueError(
                "agent bias=true needs the training grid: build agent attention inside a vitzoo model, "
                "pass grid_size=(h, w), or set bias: false"
            )
        self.bias = None
        if bias:
            assert self.grid_size is not None  # checked above
            layout = Layout(self.num_prefix_tokens, *self.grid_size)
            self.bias = AgentBias(num_heads, num_agents, layout, kwargs.get("device"), kwargs.get("dtype"))

    def _train_keys(self, scale: str) -> Tuple[Optional[int], Optional[int]]:
        """(agents, tokens) at the build layout: the log-n scale's reference counts."""
        if scale == "log_n" and self.grid_size is None:
            raise ValueError(
                "scale='log_n' needs the training grid: build agent attention inside a vitzoo model "
                "or pass grid_size=(h, w)"
            )
        agents = tokens = None
        if self.grid_size is not None:
            agents = math.prod(agent_grid(self.grid_size, self.num_agents))
            tokens = self.num_prefix_tokens + math.prod(self.grid_size)
        for count in (agents, tokens):
            AF.check_scale(scale, count)
        return agents, tokens

    def scales(self, agents: Grid, num_tokens: Union[int, torch.Tensor]) -> Tuple[float, Union[float, torch.Tensor]]:
        """(s_q, s_a) for the agent grid: 1/sqrt(d), or the log-n scale of each softmax's key count (``num_tokens`` per
        image under a mask)."""
        return (
            AF.logit_scale(self.scale_mode, self.head_dim, math.prod(agents), self.train_keys[0]),
            AF.logit_scale(self.scale_mode, self.head_dim, num_tokens, self.train_keys[1]),
        )

    def biases(self, grid: Grid, agents: Optional[Grid] = None) -> Biases:
        """(B_q, B_a) at ``grid`` with an ``agents`` grid (default: the grid's own), or None without biases; in a
        variable-size batch each image's on the canvas."""
        if self.bias is None:
            return None
        agents = agents or agent_grid(grid, self.num_agents)
        if self.image_grids is None:
            return self.bias(grid, agents)
        tables = {g: self.bias(g, agents) for g in self.image_grids}
        P, grids = self.num_prefix_tokens, self.image_grids
        return (
            tables_on_canvas([tables[g][0] for g in grids], grids, grid, P, 1),
            tables_on_canvas([tables[g][1] for g in grids], grids, grid, P, 2),
        )

    def context(self, q: torch.Tensor, attn_mask: Optional[torch.Tensor]) -> dict:
        """The options of ``agent_attention`` / ``agent_probs`` for this input."""
        keys, grid = AF.key_padding(attn_mask), self.current_grid(q.shape[-2])
        agent_grids = {agent_grid(g, self.num_agents) for g in (self.image_grids or [grid])}
        if len(agent_grids) > 1:
            raise ValueError(
                f"agent: the images of this batch have agent grids {sorted(agent_grids)} (an image narrower than "
                f"{math.isqrt(self.num_agents)} patches clips them); batch images at least that wide, or lower "
                "num_agents"
            )
        agents = agent_grids.pop()
        num_tokens = q.shape[-2] if keys is None else AF.key_count(keys, AF.acc(q))
        return dict(
            grid=grid,
            num_prefix=self.num_prefix_tokens,
            num_agents=self.num_agents,
            scales=self.scales(agents, num_tokens),
            biases=self.biases(grid, agents),
            key_mask=keys,
            image_grids=self.image_grids,
            agents=agents,
        )

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        options = self.context(q, attn_mask)
        out = agent_attention(q, k, v, logit_noise=logit_noise, dropout_p=self.dropout_p, **options)
        if self.dwc is None:
            return out
        return out + self.dwc.over_grid(v, options["grid"], self.num_prefix_tokens, options["key_mask"])

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        return agent_probs(q, k, query_index=query_index, **self.context(q, attn_mask))

    def extra_repr(self) -> str:
        kernel = self.dwc.kernel_size[0] if self.dwc is not None else 0
        return (
            super().extra_repr() + f", num_agents={self.num_agents}, kernel_size={kernel}, "
            f"bias={self.bias is not None}, scale={self.scale_mode}"
        )

"""Agent attention (Han et al., ECCV 2024): queries and keys meet through n_a agent tokens.

out = softmax(Q A^T + B_q) (softmax(A K^T + B_a) V) + DWC(V), A the patch queries average-pooled to an agent
grid, B_q, B_a the official position biases; the mathematics, cost and resolution behaviour are in
docs/mechanisms.md, section 12.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as AF
from .base import ZooAttention
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


def pool_agents(q: torch.Tensor, grid: Grid, num_prefix: int, agents: Grid) -> torch.Tensor:
    """Agent tokens A (B, H, n_a, D): the patch queries adaptively average-pooled to ``agents``, written as
    two averaging matrices (P_h X P_w^T) so that exporters carry it at any grid (no adaptive-pool op)."""
    B, H, _, D = q.shape
    patches = q[:, :, num_prefix:].transpose(-2, -1).reshape(B, H, D, *grid)
    pooled = _pool_matrix(grid[0], agents[0], q) @ patches @ _pool_matrix(grid[1], agents[1], q).transpose(0, 1)
    return pooled.reshape(B, H, D, -1).transpose(-2, -1)


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
) -> torch.Tensor:
    """softmax(Q A^T s_q + B_q) (softmax(A K^T s_a + B_a) V) in O(n n_a d); ``scales`` = (s_q, s_a), default
    1/sqrt(d); ``biases`` = (B_q (H, N, n_a), B_a (H, n_a, N)) or None.

    Logit noise of std ``logit_noise`` goes on both logit matrices, independently.
    """
    a = pool_agents(q, grid, num_prefix, agent_grid(grid, num_agents))
    query_bias, agent_bias = (None, None) if biases is None else (b.to(q.dtype) for b in biases)
    agent_v = AF.softmax_attention(a, k, v, scales[1], logit_noise, attn_mask=agent_bias, dropout_p=dropout_p)
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
) -> torch.Tensor:
    """The implied n x n matrix softmax(Q A^T s_q + B_q) softmax(A K^T s_a + B_a) for the queries ``query_index``."""
    a = pool_agents(q, grid, num_prefix, agent_grid(grid, num_agents))
    query_bias, agent_bias = (None, None) if biases is None else biases
    query_bias = None if query_bias is None else query_bias[:, query_index]
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
    ``scale: log_n`` counts n_a keys in softmax(Q A^T) and N in softmax(A K^T).
    """

    rope_form = "rotate"  # agents pool the turned queries of their region
    no_mask = no_causal = (
        "every query reads every key through the agents; use attention='softmax' for masked or causal inputs"
    )

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

    def scales(self, grid: Grid, num_tokens: int) -> Tuple[float, float]:
        """(s_q, s_a) for the current grid: 1/sqrt(d), or the log-n scale of each softmax's key count."""
        agents = math.prod(agent_grid(grid, self.num_agents))
        return (
            AF.logit_scale(self.scale_mode, self.head_dim, agents, self.train_keys[0]),
            AF.logit_scale(self.scale_mode, self.head_dim, num_tokens, self.train_keys[1]),
        )

    def biases(self, grid: Grid) -> Biases:
        """(B_q, B_a) at ``grid``, or None without biases."""
        return None if self.bias is None else self.bias(grid, agent_grid(grid, self.num_agents))

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        grid, P = self.current_grid(q.shape[-2]), self.num_prefix_tokens
        out = agent_attention(
            q,
            k,
            v,
            grid,
            P,
            self.num_agents,
            self.scales(grid, q.shape[-2]),
            logit_noise,
            self.dropout_p,
            self.biases(grid),
        )
        return out if self.dwc is None else out + self.dwc.over_grid(v, grid, P)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        grid = self.current_grid(q.shape[-2])
        return agent_probs(
            q,
            k,
            grid,
            query_index,
            self.num_prefix_tokens,
            self.num_agents,
            self.scales(grid, q.shape[-2]),
            self.biases(grid),
        )

    def extra_repr(self) -> str:
        kernel = self.dwc.kernel_size[0] if self.dwc is not None else 0
        return (
            super().extra_repr() + f", num_agents={self.num_agents}, kernel_size={kernel}, "
            f"bias={self.bias is not None}, scale={self.scale_mode}"
        )

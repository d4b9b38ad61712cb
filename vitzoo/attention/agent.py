"""Agent attention (Han et al., ECCV 2024): queries and keys meet through n_a agent tokens.

out = softmax(Q A^T) (softmax(A K^T) V) + DWC(V), A the patch queries average-pooled to an agent
grid; the mathematics, cost and resolution behaviour are in docs/mechanisms.md, section 12.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from . import functional as AF
from .base import ZooAttention
from .grid_conv import grid_conv
from .registry import register_attention

__all__ = ["AgentAttention", "agent_attention", "agent_probs", "agent_grid", "pool_agents"]

Grid = Tuple[int, int]


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


def agent_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: Grid, num_prefix: int = 0,
                    num_agents: int = 49, scales: Tuple[Optional[float], Optional[float]] = (None, None),
                    logit_noise: float = 0.0, dropout_p: float = 0.0) -> torch.Tensor:
    """softmax(Q A^T s_q) (softmax(A K^T s_a) V) in O(n n_a d); ``scales`` = (s_q, s_a), default 1/sqrt(d).

    Logit noise of std ``logit_noise`` goes on both logit matrices, independently.
    """
    a = pool_agents(q, grid, num_prefix, agent_grid(grid, num_agents))
    agent_v = AF.softmax_attention(a, k, v, scales[1], logit_noise, dropout_p=dropout_p)
    return AF.softmax_attention(q, a, agent_v, scales[0], logit_noise, dropout_p=dropout_p)


def agent_probs(q: torch.Tensor, k: torch.Tensor, grid: Grid, query_index: torch.Tensor, num_prefix: int = 0,
                num_agents: int = 49, scales: Tuple[Optional[float], Optional[float]] = (None, None)) -> torch.Tensor:
    """The implied n x n matrix softmax(Q A^T s_q) softmax(A K^T s_a) for the queries ``query_index``."""
    a = pool_agents(q, grid, num_prefix, agent_grid(grid, num_agents))
    return AF.softmax_probs(q[:, :, query_index], a, scales[0]) @ AF.softmax_probs(a, k, scales[1])


@register_attention("agent")
class AgentAttention(ZooAttention):
    """Agent attention with a depthwise ``kernel_size`` conv on V over the patch grid (0: none).

    ``num_agents`` (a square, default 7x7) agents are pooled from the patch queries; prefix (class)
    tokens are queries and keys of both softmaxes but neither agents nor part of the conv term.
    ``scale: log_n`` counts n_a keys in softmax(Q A^T) and N in softmax(A K^T).
    """

    no_mask = no_causal = ("every query reads every key through the agents; use attention='softmax' for masked or causal "
                           "inputs")

    def __init__(self, dim: int, num_heads: int = 8, *args, num_agents: int = 49, kernel_size: int = 3,
                 scale: str = "sqrt_d", **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        side = math.isqrt(max(num_agents, 0))
        if num_agents < 1 or side * side != num_agents:
            raise ValueError(f"num_agents={num_agents} must be a perfect square (agents sit on a side x side grid), "
                             f"e.g. num_agents: {max(side, 1) ** 2}")
        self.num_agents, self.scale_mode = num_agents, scale
        self.train_keys = self._train_keys(scale)
        self.dwc = grid_conv("agent", self.attn_dim, kernel_size, **kwargs)

    def _train_keys(self, scale: str) -> Tuple[Optional[int], Optional[int]]:
        """(agents, tokens) at the build layout: the log-n scale's reference counts."""
        if scale == "log_n" and self.grid_size is None:
            raise ValueError("scale='log_n' needs the training grid: build agent attention inside a vitzoo model "
                             "or pass grid_size=(h, w)")
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
        return (AF.logit_scale(self.scale_mode, self.head_dim, agents, self.train_keys[0]),
                AF.logit_scale(self.scale_mode, self.head_dim, num_tokens, self.train_keys[1]))

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        grid, P = self.current_grid(q.shape[-2]), self.num_prefix_tokens
        out = agent_attention(q, k, v, grid, P, self.num_agents, self.scales(grid, q.shape[-2]), logit_noise,
                              self.dropout_p)
        return out if self.dwc is None else out + self.dwc.over_grid(v, grid, P)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        grid = self.current_grid(q.shape[-2])
        return agent_probs(q, k, grid, query_index, self.num_prefix_tokens, self.num_agents,
                           self.scales(grid, q.shape[-2]))

    def extra_repr(self) -> str:
        kernel = self.dwc.kernel_size[0] if self.dwc is not None else 0
        return super().extra_repr() + f", num_agents={self.num_agents}, kernel_size={kernel}, scale={self.scale_mode}"

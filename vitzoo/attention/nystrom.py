"""Nyströmformer (Xiong et al. 2021): softmax attention through m landmarks (docs/mechanisms.md, section 8)."""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..options import is_count
from . import functional as AF
from .base import ZooAttention
from .registry import register_attention

__all__ = ["NystromAttention", "nystrom_attention", "nystrom_probs", "segment_means", "iterative_pinv"]


def segment_means(x: torch.Tensor, num_segments: int, key_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """(..., N, D) -> (..., m, D), the official layout: the first m - (N mod m) segments hold floor(N / m)
    consecutive tokens, the last N mod m hold one more (needs m <= N). Under ``key_mask`` ((B or 1, 1, N) bool)
    N counts each image's tokens of the mask, taken in order, and the others join no segment (an image with none: m
    empty segments, means 0)."""
    if key_mask is None:
        n: Union[int, torch.Tensor] = x.shape[-2]
        i = torch.arange(x.shape[-2], device=x.device)
    else:
        n = key_mask.sum(-1, keepdim=True).clamp_min(num_segments)  # an image with no token: m empty segments, 0
        i = key_mask.cumsum(-1) - 1  # each kept token's place among the kept ones
    short = n // num_segments
    cut = (num_segments - n % num_segments) * short  # tokens in the short segments
    segment = torch.where(i < cut, i // short, num_segments - n % num_segments + (i - cut) // (short + 1))
    average = F.one_hot(segment.clamp_min(0), num_segments).transpose(-2, -1).to(x.dtype)
    if key_mask is not None:
        average = average * key_mask.unsqueeze(-2)
    return (average / average.sum(-1, keepdim=True).clamp_min(1)) @ x


def iterative_pinv(a: torch.Tensor, iterations: int = 6) -> torch.Tensor:
    """Moore-Penrose inverse of each (m, m) matrix by Z <- Z (13 I - AZ (15 I - AZ (7 I - AZ))) / 4.

    Z_0 = A^T / (|A|_1 |A|_inf), the norms of each matrix on its own (not of the batch).
    """
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norm = a.abs().sum(-2).amax(-1) * a.abs().sum(-1).amax(-1)
    z = a.transpose(-2, -1) / norm[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def _softmax(logits: torch.Tensor, logit_noise: float, keep: Optional[torch.Tensor] = None) -> torch.Tensor:
    if logit_noise > 0:
        logits = logits + AF.noise_draw(logits.shape, logit_noise, logits.device, logits.dtype)
    return logits.softmax(dim=-1) if keep is None else AF.masked_softmax(logits, keep)


def _factors(q, k, num_landmarks: int, pinv_iterations: int, scale, landmark_scale, logit_noise: float, key_mask):
    """softmax(Q K~^T), pinv(softmax(Q~ K~^T)), softmax(Q~ K^T), noise drawn in that order; landmarks and the keys
    of the last softmax from the tokens of ``key_mask``."""
    d = q.shape[-1]
    scale = d**-0.5 if scale is None else scale
    landmark_scale = d**-0.5 if landmark_scale is None else landmark_scale
    q, k = AF.acc(q), AF.mask_keys(AF.acc(k), key_mask)
    ql, kl = segment_means(q, num_landmarks, key_mask), segment_means(k, num_landmarks, key_mask)
    f = _softmax((q * landmark_scale) @ kl.transpose(-2, -1), logit_noise)
    a = _softmax((ql * landmark_scale) @ kl.transpose(-2, -1), logit_noise)
    logits = (ql * scale) @ k.transpose(-2, -1)
    b = _softmax(logits, logit_noise, None if key_mask is None else key_mask.unsqueeze(-2))
    return f, iterative_pinv(a, pinv_iterations), b


def nystrom_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    num_landmarks: int = 64,
    pinv_iterations: int = 6,
    scale: Optional[float] = None,
    landmark_scale: Optional[float] = None,
    logit_noise: float = 0.0,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T) V in O(n m d + m^3) per head; with m >= n (every
    token its own landmark) exact softmax(Q K^T) V, as the official code.

    ``scale`` multiplies the logits of the softmax over the n keys, ``landmark_scale`` those over the
    m landmark keys (both default 1/sqrt(d)); ``logit_noise`` adds independent noise to all three. ``key_mask``
    ((B or 1, 1, N) bool): landmarks and keys from its tokens only (each image needs m of them, or none: 0).
    """
    if num_landmarks >= k.shape[-2]:
        mask = None if key_mask is None else key_mask.unsqueeze(-2)
        return AF.softmax_attention(q, k, v, scale, logit_noise, attn_mask=mask)
    f, z, b = _factors(q, k, num_landmarks, pinv_iterations, scale, landmark_scale, logit_noise, key_mask)
    return (f @ (z @ (b @ AF.acc(v)))).to(v.dtype)


def nystrom_probs(
    q: torch.Tensor,
    k: torch.Tensor,
    num_landmarks: int = 64,
    pinv_iterations: int = 6,
    scale: Optional[float] = None,
    landmark_scale: Optional[float] = None,
    query_index: Optional[torch.Tensor] = None,
    key_mask: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The implied matrix F pinv(A) B for the rows ``query_index`` (all by default): (B, H, Nq, Nk).

    Its rows sum to about 1 and may hold small negative entries (it approximates a softmax matrix); with m >= n
    it is the softmax matrix.
    """
    if num_landmarks >= k.shape[-2]:
        mask = None if key_mask is None else key_mask.unsqueeze(-2)
        return AF.softmax_probs(q if query_index is None else q[:, :, query_index], k, scale, mask)
    f, z, b = _factors(q, k, num_landmarks, pinv_iterations, scale, landmark_scale, 0.0, key_mask)
    return (f if query_index is None else f[:, :, query_index]) @ (z @ b)


@register_attention("nystrom")
class NystromAttention(ZooAttention):
    """Nyström approximation of softmax attention with ``num_landmarks`` segment-mean landmarks.

    As many landmarks as tokens or more: exact softmax attention. ``pinv_iterations`` (6, as the paper) of
    ``iterative_pinv``. ``conv_kernel`` (odd, None = off; the paper uses 33) adds a depthwise
    convolution of V along the token axis, one kernel per head. Logit noise goes on the logits of all
    three softmaxes; ``scale: log_n`` scales each by the log of its own key count (docs/mechanisms.md). A key-padding
    ``attn_mask``: landmarks are the segment means of each image's unpadded tokens, padded keys get no weight (each
    image needs ``num_landmarks`` tokens or more, or none; the token-axis conv refuses masks).
    """

    rope_form = "rotate"  # landmarks are means of the turned q and k
    no_causal = "its landmarks mix all tokens; use attention='softmax' for causal inputs"

    has_logits = False  # no n x n matrix is formed: nothing for attn_drop

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *args,
        num_landmarks: int = 64,
        pinv_iterations: int = 6,
        conv_kernel: Optional[int] = None,
        scale: str = "sqrt_d",
        train_tokens: Optional[int] = None,
        **kwargs,
    ):
        super().__init__(dim, num_heads, *args, **kwargs)
        if not is_count(num_landmarks):
            raise ValueError(f"num_landmarks must be a positive integer, got {num_landmarks!r}")
        if not is_count(pinv_iterations):
            raise ValueError(f"pinv_iterations must be a positive integer (the paper uses 6), got {pinv_iterations!r}")
        if conv_kernel is not None and not (is_count(conv_kernel) and conv_kernel % 2 == 1):
            raise ValueError(
                f"conv_kernel must be an odd positive integer (the paper uses 33) or null, got {conv_kernel!r}"
            )
        self.train_tokens = train_tokens or self.num_tokens
        AF.check_scale(scale, self.train_tokens)
        if scale == "log_n" and num_landmarks < 2:
            raise ValueError(
                f"scale='log_n' needs num_landmarks >= 2 (a softmax over 1 landmark has no scale), got {num_landmarks}"
            )
        self.num_landmarks, self.pinv_iterations, self.scale_mode = int(num_landmarks), int(pinv_iterations), scale
        self.conv = None
        if conv_kernel is not None:
            self.conv = nn.Conv2d(
                num_heads,
                num_heads,
                (int(conv_kernel), 1),
                padding=(int(conv_kernel) // 2, 0),
                groups=num_heads,
                bias=False,
                device=kwargs.get("device"),
                dtype=kwargs.get("dtype"),
            )

    def options(self, k: torch.Tensor, attn_mask: Optional[torch.Tensor]) -> dict:
        """Landmark count, the two logit scales and the key mask for keys k (B, H, N, D) under ``attn_mask``."""
        keys = AF.key_padding(attn_mask)
        m, train = min(self.num_landmarks, k.shape[-2]), self.train_tokens
        if keys is not None and self.conv is not None:
            raise ValueError(
                "nystrom's conv_kernel runs along the token sequence, whose neighbours padding changes; set "
                "conv_kernel: null for masked inputs"
            )
        counts = None if keys is None else keys.sum(-1)
        short = (
            counts is not None and m < k.shape[-2] and AF.eager_checks() and bool(((counts > 0) & (counts < m)).any())
        )
        if short:
            raise ValueError(
                f"nystrom: an image of this masked batch has fewer than num_landmarks={m} tokens; lower num_landmarks "
                "or batch larger images"
            )
        train_landmarks = None if train is None else min(self.num_landmarks, train)
        scale = AF.logit_scale(self.scale_mode, self.head_dim, AF.key_count(keys, AF.acc(k)), train)
        landmark_scale = AF.logit_scale(self.scale_mode, self.head_dim, m, train_landmarks)
        return dict(
            num_landmarks=m,
            pinv_iterations=self.pinv_iterations,
            scale=scale,
            landmark_scale=landmark_scale,
            key_mask=keys,
        )

    def mix(self, x, q, k, v, attn_mask, is_causal, logit_noise):
        out = nystrom_attention(q, k, v, logit_noise=logit_noise, **self.options(k, attn_mask))
        return out if self.conv is None else out + self.conv(v)

    def probs(self, x, q, k, attn_mask, is_causal, query_index):
        out = nystrom_probs(q, k, query_index=query_index, **self.options(k, attn_mask))
        return out if self.conv is None else out + self.conv_matrix(k.shape[-2], query_index)

    def conv_matrix(self, num_tokens: int, query_index: torch.Tensor) -> torch.Tensor:
        """The convolution as a matrix: row i holds kernel tap j - i + r at column j (|j - i| <= r), (1, H, Q, N)."""
        assert self.conv is not None  # called only with the conv term
        weight = AF.acc(self.conv.weight)[:, 0, :, 0]  # (H, kernel)
        radius = weight.shape[-1] // 2
        tap = torch.arange(num_tokens, device=weight.device) - query_index.to(weight.device)[:, None] + radius
        inside = (tap >= 0) & (tap < weight.shape[-1])
        return (weight[:, tap.clamp(0, weight.shape[-1] - 1)] * inside).unsqueeze(0)

    def extra_repr(self) -> str:
        kernel = None if self.conv is None else self.conv.kernel_size[0]
        return (
            super().extra_repr() + f", num_landmarks={self.num_landmarks}, pinv_iterations={self.pinv_iterations}, "
            f"conv_kernel={kernel}, scale={self.scale_mode}"
        )

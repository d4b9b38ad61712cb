"""Linear filters, resampling and gray on (..., H, W) tensors, with the border rules of the reference code.

Borders: ``"nearest"`` repeats the edge pixel (scipy/skimage ``nearest``, cv2 ``BORDER_REPLICATE``),
``"reflect101"`` mirrors without repeating it (cv2's default ``BORDER_REFLECT_101``, scipy
``mirror``), ``"symmetric"`` mirrors and repeats it (scipy ``reflect``, cv2 ``BORDER_REFLECT``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

BORDERS = ("nearest", "reflect101", "symmetric")
LUMA = (0.299, 0.587, 0.114)  # cv2's RGB2GRAY weights
MATRIX_MAX_SIDE = 64  # up to this side a separable filter runs as two small matmuls (fast on CPU)


def border_index(i: Tensor, n: int, border: str) -> Tensor:
    """Map any integer positions ``i`` (outside 0..n-1 too) to the source index under ``border``."""
    if border == "nearest" or n == 1:
        return i.clamp(0, n - 1)
    if border == "reflect101":
        i = i.remainder(2 * (n - 1))
        return torch.where(i >= n, 2 * (n - 1) - i, i)
    if border == "symmetric":
        i = i.remainder(2 * n)
        return torch.where(i >= n, 2 * n - 1 - i, i)
    raise ValueError(f"unknown border {border!r}; choose one of {BORDERS}")


def padded_index(n: int, pad: int, border: str, device: torch.device) -> Tensor:
    """Source index of each position -pad .. n-1+pad."""
    return border_index(torch.arange(-pad, n + pad, device=device), n, border)


def gaussian_1d(sigma: float, radius: int) -> Tensor:
    """Normalised float64 Gaussian taps at -radius..radius (scipy's ``gaussian_filter1d``)."""
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    w = torch.exp(-0.5 * (t / sigma) ** 2)
    return w / w.sum()


def _filter_matrix(weights: Tensor, n: int, border: str, like: Tensor) -> Tensor:
    """(n, n) matrix M with M @ v = v correlated with the odd-length 1D ``weights``, 'same' size."""
    r = len(weights) // 2
    src = padded_index(n, r, border, like.device).unfold(0, 2 * r + 1, 1)  # (n, 2r + 1)
    rows = torch.arange(n, device=like.device)[:, None].expand_as(src)
    m = torch.zeros(n, n, dtype=torch.float64, device=like.device)
    return m.index_put_((rows, src), weights.to(m).expand_as(src), accumulate=True).to(like.dtype)


def _correlate_1d(x: Tensor, weights: Tensor, border: str, dim: int) -> Tensor:
    """Correlate along ``dim`` (-2 or -1): border padding by index, then a conv."""
    idx = padded_index(x.shape[dim], len(weights) // 2, border, x.device)
    y = x[..., idx, :] if dim == -2 else x[..., idx]  # indexing: index_select is slow on CPU along these dims
    k = weights.to(x).view(1, 1, -1, 1) if dim == -2 else weights.to(x).view(1, 1, 1, -1)
    return F.conv2d(y.reshape(-1, 1, *y.shape[-2:]), k).reshape(x.shape)


def separable(x: Tensor, weights: Tensor, border: str) -> Tensor:
    """The same odd-length 1D filter along H and W of ``x`` (..., H, W), 'same' size."""
    h, w = x.shape[-2:]
    r = len(weights) // 2
    if max(h, w) <= MATRIX_MAX_SIDE or r >= min(h, w):
        return _filter_matrix(weights, h, border, x) @ x @ _filter_matrix(weights, w, border, x).T
    return _correlate_1d(_correlate_1d(x, weights, border, -2), weights, border, -1)


def gaussian_blur(x: Tensor, sigma: float, border: str = "nearest", truncate: float = 4.0) -> Tensor:
    """``skimage.filters.gaussian`` over the last two dims: taps to ``int(truncate * sigma + 0.5)``."""
    if sigma == 0:  # scipy leaves the image as is
        return x.clone()
    return separable(x, gaussian_1d(sigma, int(truncate * sigma + 0.5)), border)


def correlate2d(x: Tensor, kernel: Tensor, border: str) -> Tensor:
    """``cv2.filter2D``: each (H, W) plane of ``x`` (..., H, W) correlated with an odd square kernel."""
    h, w = x.shape[-2:]
    r = kernel.shape[-1] // 2
    y = x[..., padded_index(h, r, border, x.device), :][..., padded_index(w, r, border, x.device)]
    out = F.conv2d(y.reshape(-1, 1, h + 2 * r, w + 2 * r), kernel.to(x)[None, None])
    return out.reshape(x.shape)


def _zoom_taps(n: int, factor: float, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """imagecorruptions' clipped_zoom along one axis of length n: the central ceil(n / factor) crop
    enlarged by ``factor`` like ``scipy.ndimage.zoom(order=1)`` (round(crop * factor) outputs whose grid
    maps the crop's end pixels onto the output's). Returns each output's two source indices (in the
    whole axis) and the weight of the second."""
    crop = math.ceil(n / float(factor))
    top = (n - crop) // 2
    size = int(round(crop * factor))
    step = (crop - 1) / (size - 1) if size > 1 else 0.0
    coords = torch.arange(size, dtype=torch.float64, device=device) * step
    i0 = coords.floor().long().clamp(0, crop - 1)
    return top + i0, top + (i0 + 1).clamp(max=crop - 1), coords - i0


def _zoom_matrix(n: int, factor: float, like: Tensor) -> Tensor:
    i0, i1, f = _zoom_taps(n, factor, like.device)
    rows = torch.arange(len(i0), device=like.device)
    m = torch.zeros(len(i0), n, dtype=torch.float64, device=like.device)
    m.index_put_((rows, i0), 1 - f, accumulate=True).index_put_((rows, i1), f, accumulate=True)
    return m.to(like.dtype)


def clipped_zoom(x: Tensor, factor: float) -> Tensor:
    """``imagecorruptions``' clipped_zoom on (..., H, W): the central crop enlarged by ``factor``, whole
    (at least H x W; callers keep its top-left H x W). Small images: two matmuls; larger: two lerps."""
    h, w = x.shape[-2:]
    if max(h, w) <= MATRIX_MAX_SIDE:
        return _zoom_matrix(h, factor, x) @ x @ _zoom_matrix(w, factor, x).T
    r0, r1, fr = _zoom_taps(h, factor, x.device)
    y = x[..., r0, :] + (x[..., r1, :] - x[..., r0, :]) * fr.to(x.dtype)[:, None]
    c0, c1, fc = _zoom_taps(w, factor, x.device)
    return y[..., c0] + (y[..., c1] - y[..., c0]) * fc.to(x.dtype)


def box_matrix(n_in: int, n_out: int, like: Tensor) -> Tensor:
    """(n_out, n_in) matrix of PIL's BOX resampling: each output pixel averages the input pixels whose
    centres fall in its footprint (Pillow's ``precompute_coeffs`` with the box filter)."""
    scale = n_in / n_out
    support = 0.5 * max(scale, 1.0)
    centre = (torch.arange(n_out, dtype=torch.float64) + 0.5) * scale
    x = torch.arange(n_in, dtype=torch.float64)
    lo = (centre - support + 0.5).floor().clamp(min=0)
    hi = (centre + support + 0.5).floor().clamp(max=n_in)
    t = (x[None, :] - centre[:, None] + 0.5) / max(scale, 1.0)
    inside = (x[None, :] >= lo[:, None]) & (x[None, :] < hi[:, None]) & (t > -0.5) & (t <= 0.5)
    m = inside.double()
    return (m / m.sum(1, keepdim=True)).to(device=like.device, dtype=like.dtype)


def nearest_index(n_in: int, n_out: int, device: torch.device) -> Tensor:
    """PIL's NEAREST source index of each output pixel: floor((i + 0.5) * n_in / n_out)."""
    i = torch.arange(n_out, dtype=torch.float64, device=device)
    return ((i + 0.5) * (n_in / n_out)).floor().long().clamp(max=n_in - 1)


def gray(x: Tensor) -> Tensor:
    """(B, 1, H, W) luma of RGB images (cv2's weights); 1-channel images are their own gray."""
    if x.shape[1] == 1:
        return x
    w = torch.tensor(LUMA, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * w).sum(1, keepdim=True)


def check_channels(x: Tensor, name: str) -> None:
    if x.shape[1] not in (1, 3):
        raise ValueError(f"{name} needs 1 or 3 channels (gray or RGB), got {x.shape[1]}; pick another corruption")

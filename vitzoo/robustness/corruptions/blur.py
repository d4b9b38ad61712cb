"""The blur family: ``fn(images, c, generator)`` following the reference code's operations."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .draws import integers, uniform
from .filters import clipped_zoom, gaussian_1d, padded_index, separable
from .filters import gaussian_blur as _skimage_gaussian


def gaussian_blur(x: Tensor, sigma: float, generator: Optional[torch.Generator]) -> Tensor:
    """``skimage.filters.gaussian(x, sigma)``: truncated at ``int(4 sigma + 0.5)``, edge repeated."""
    return _skimage_gaussian(x, sigma)


def disk_kernel(radius: float, alias_blur: float) -> Tensor:
    """The reference's anti-aliased disk (a 17x17 grid, or 2r+1 for r > 8), cropped to its support."""
    half, k = (8, 3) if radius <= 8 else (int(radius), 5)
    t = torch.arange(-half, half + 1, dtype=torch.float64)
    disk = ((t[:, None] ** 2 + t[None, :] ** 2) <= radius**2).double()
    disk = separable(disk / disk.sum(), gaussian_1d(alias_blur, k // 2), "reflect101")  # cv2.GaussianBlur
    r = int(torch.nonzero(disk.sum(0)).max()) - half  # zero border rows/cols change nothing
    return disk[half - r : half + r + 1, half - r : half + r + 1]


def defocus_blur(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """``cv2.filter2D`` with the disk (reflect-101 borders), as one depthwise conv."""
    kernel = disk_kernel(*c).to(x)
    ch, h, w = x.shape[-3:]
    r = kernel.shape[0] // 2
    y = x[..., padded_index(h, r, "reflect101", x.device), :][..., padded_index(w, r, "reflect101", x.device)]
    return F.conv2d(y, kernel.expand(ch, 1, -1, -1), groups=ch)


# ---------------------------------------------------------------- glass blur


@lru_cache(maxsize=16)
def _glass_schedule(h: int, w: int, delta: int) -> tuple[Tensor, Tensor, list[int]]:
    """The reference's scan (rows h - delta .. delta + 1, each row's columns w - delta .. delta + 1,
    both descending) regrouped into waves of steps that touch disjoint pixels: step (i, j) of the
    scan goes to wave 2 delta i + j. Two steps that may share a pixel (rows and columns both less
    than 2 delta apart) keep their order, so the waves give what the sequential loop gives.
    Returns the scan index of each step in wave order, its flat pixel index, and the wave sizes."""
    rows = torch.arange(h - delta, delta, -1)
    cols = torch.arange(w - delta, delta, -1)
    wave = (2 * delta * torch.arange(len(rows))[:, None] + torch.arange(len(cols))[None, :]).flatten()
    order = torch.argsort(wave, stable=True)
    pixel = (rows[:, None] * w + cols[None, :]).flatten()[order]
    sizes = [n for n in torch.bincount(wave).tolist() if n]
    return order, pixel, sizes


def glass_sources(offsets: Tensor, h: int, w: int, delta: int) -> Tensor:
    """Source pixel (flat index) of every output pixel after the reference's local shuffle.

    ``offsets`` (B, iterations, H - 2 delta, W - 2 delta, 2) holds each scan step's (dx, dy) in
    [-delta, delta), in scan order. At each step the reference runs ``x[r, c], x[r + dy, c + dx] =
    x[r + dy, c + dx], x[r, c]`` on an (H, W, 3) array: the right side holds numpy views, so the
    neighbour is copied into (r, c) and keeps its own value (a copy, not a swap)."""
    b, iterations = offsets.shape[:2]
    order, pixel, sizes = (t.to(offsets.device) if isinstance(t, Tensor) else t for t in _glass_schedule(h, w, delta))
    src = torch.arange(h * w, device=offsets.device).repeat(b, 1)
    for it in range(iterations):
        off = offsets[:, it].reshape(b, -1, 2)[:, order]
        neighbour = pixel + off[..., 1] * w + off[..., 0]  # (B, steps), in wave order
        for a, n in zip(pixel.split(sizes), neighbour.split(sizes, dim=1)):
            src[:, a] = src.gather(1, n)
    return src


def glass_blur(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """Blur, quantise to 8 bits (``np.uint8`` truncates), move pixels locally, blur again."""
    sigma, delta, iterations = c
    b, ch, h, w = x.shape
    if h <= 2 * delta or w <= 2 * delta:
        raise ValueError(f"glass_blur at this severity needs images larger than {2 * delta} px, got {h}x{w}")
    y = (_skimage_gaussian(x, sigma) * 255).floor().clamp(0, 255) / 255
    offsets = integers(-delta, delta, (b, iterations, h - 2 * delta, w - 2 * delta, 2), x, generator)
    src = glass_sources(offsets, h, w, delta)
    y = y.flatten(2).gather(2, src[:, None].expand(-1, ch, -1)).view_as(x)
    return _skimage_gaussian(y, sigma)


# ---------------------------------------------------------------- motion blur


def motion_blur_at(x: Tensor, radius: int, sigma: float, angles: Tensor) -> Tensor:
    """``imagecorruptions``' motion blur (ImageMagick's MotionBlurImage without libMagick) of each image
    along its own angle (degrees, a (B,) tensor): a one-sided Gaussian of ``2 radius + 1`` taps over
    the image shifted by ``ceil(i (sin, cos) - 0.5)`` with edges repeated; taps from the first one that
    leaves the image are dropped, as the reference stops there."""
    h, w = x.shape[-2:]
    width = 2 * int(radius) + 1
    i = torch.arange(width, dtype=torch.float64, device=x.device)
    taps = torch.exp(-(i**2) / (2 * sigma**2))
    taps = taps / taps.sum()
    rad = torch.deg2rad(angles.to(device=x.device, dtype=torch.float64))
    py, px = width * torch.sin(rad), width * torch.cos(rad)
    hyp = torch.hypot(py, px)
    dy = torch.ceil(i[None, :] * py[:, None] / hyp[:, None] - 0.5).long()  # (B, width)
    dx = torch.ceil(i[None, :] * px[:, None] / hyp[:, None] - 0.5).long()
    inside = ((dy.abs() < h) & (dx.abs() < w)).long().cumprod(1).to(x.dtype)
    weights = taps.to(x.dtype) * inside  # (B, width)
    shape = (x.shape[0],) + (1,) * (x.ndim - 3)
    out = torch.zeros_like(x)
    rows, cols = torch.arange(h, device=x.device), torch.arange(w, device=x.device)
    for k in range(width):
        r = (rows + dy[:, k, None]).clamp(0, h - 1)  # (B, H)
        c = (cols + dx[:, k, None]).clamp(0, w - 1)
        shifted = x.gather(-2, r.view(*shape, h, 1).expand_as(x)).gather(-1, c.view(*shape, 1, w).expand_as(x))
        out += weights[:, k].view(*shape, 1, 1) * shifted
    return out


def motion_blur(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """Motion blur (radius, sigma) at a uniform angle in [-45, 45) degrees per image."""
    radius, sigma = c
    return motion_blur_at(x, radius, sigma, uniform((x.shape[0],), x, generator, -45, 45, dtype=torch.float64))


# ---------------------------------------------------------------- zoom blur


def zoom_factors(start: float, stop: float, step: float) -> list[float]:
    """``np.arange(start, stop, step)`` to the last bit: ceil((stop - start) / step) values
    ``start + k * delta`` with numpy's ``delta = (start + step) - start``."""
    delta = (start + step) - start
    return [start + k * delta for k in range(math.ceil((stop - start) / step))]


def zoom_blur(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """The mean of the image and its clipped zooms by ``np.arange(*c)``."""
    h, w = x.shape[-2:]
    factors = zoom_factors(*c)
    out = x.clone()
    for z in factors:
        out += clipped_zoom(x, z)[..., :h, :w]
    return out / (len(factors) + 1)

"""Spatter (an extra corruption): water drops (severities with c5 = 0) or mud (c5 = 1).

The water drops follow the reference's OpenCV chain on 8-bit maps: Canny edges of the liquid layer,
the 5x5 chamfer distance to them (cv2's DIST_L2 mask 5), truncated at 20, box blur, histogram
equalisation, an emboss filter, box blur; each step written as a batched tensor op on integer
values.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from .draws import normal
from .filters import check_channels, correlate2d, gaussian_blur, gray

WATER = (175 / 255, 238 / 255, 238 / 255)  # pale turquoise, added on top
MUD = (63 / 255, 42 / 255, 20 / 255)  # brown, blended over
SOBEL_X = torch.tensor([[-1.0, 0, 1], [-2, 0, 2], [-1, 0, 1]])
EMBOSS = torch.tensor([[-2.0, -1, 0], [-1, 1, 1], [0, 1, 2]])
BOX3 = torch.ones(3, 3)
TG22 = 13573  # cv2's tan(22.5 deg) in 15-bit fixed point
# cv2's DIST_L2 5x5 chamfer steps (1, 1.4f, 2.1969f) in 16-bit fixed point, by (dy, dx)
CHAMFER_ONE = 1 << 16
CHAMFER = {1: CHAMFER_ONE, 2: 91750, 5: 143976}  # keyed by dy^2 + dx^2
DIST_MAX = 20


def canny(img: Tensor, low: float, high: float) -> Tensor:
    """``cv2.Canny(img, low, high)`` (3x3 Sobel with edges repeated, L1 magnitude, cv2's non-maximum
    rule and 8-connected hysteresis) of (B, H, W) 8-bit values; a bool edge map."""
    gx = correlate2d(img, SOBEL_X.double(), "nearest")
    gy = correlate2d(img, SOBEL_X.T.double(), "nearest")
    mag = gx.abs() + gy.abs()
    p = F.pad(mag, (1, 1, 1, 1))  # magnitudes outside the image are 0

    def at(dy: int, dx: int) -> Tensor:
        return p[:, 1 + dy : p.shape[1] - 1 + dy, 1 + dx : p.shape[2] - 1 + dx]

    ax, ay = gx.abs(), gy.abs() * 32768
    tg22x = ax * TG22
    horizontal = ay < tg22x
    vertical = ~horizontal & (ay > tg22x + ax * 65536)
    s = torch.where((gx < 0) != (gy < 0), -1, 1)
    diag_pos = (mag > at(-1, -1)) & (mag > at(1, 1))  # s = 1: up-left and down-right
    diag_neg = (mag > at(-1, 1)) & (mag > at(1, -1))  # s = -1
    peak = torch.where(
        horizontal,
        (mag > at(0, -1)) & (mag >= at(0, 1)),
        torch.where(vertical, (mag > at(-1, 0)) & (mag >= at(1, 0)), torch.where(s == 1, diag_pos, diag_neg)),
    )
    weak = peak & (mag > low)
    edges = weak & (mag > high)
    while True:
        grown = weak & (F.max_pool2d(edges[:, None].to(mag.dtype), 3, 1, 1)[:, 0] > 0)
        if torch.equal(grown, edges):
            return edges
        edges = grown


def chamfer_distance(edges: Tensor) -> Tensor:
    """cv2's ``distanceTransform(DIST_L2, 5)`` to the nearest edge pixel of (B, H, W) bool maps, in
    units of 2^-16 px: its two raster passes, each row at once (the other rows' steps first, then
    the in-row step as a running minimum)."""
    b, h, w = edges.shape
    far = (h + w) * 3 * CHAMFER_ONE
    a, diag, knight = CHAMFER[1], CHAMFER[2], CHAMFER[5]
    d = F.pad(torch.where(edges, 0, far).long(), (2, 2), value=far)  # 2 far columns each side
    ramp = torch.arange(w, device=edges.device) * a
    for rows, sign in ((range(h), 1), (range(h - 1, -1, -1), -1)):
        for y in rows:
            best = d[:, y, 2 : w + 2]
            if 0 <= y - sign < h:
                near = d[:, y - sign]
                best = torch.minimum(best, near[:, 2 : w + 2] + a)
                best = torch.minimum(best, torch.minimum(near[:, 1 : w + 1], near[:, 3 : w + 3]) + diag)
                best = torch.minimum(best, torch.minimum(near[:, :w], near[:, 4:]) + knight)
            if 0 <= y - 2 * sign < h:
                far_row = d[:, y - 2 * sign]
                best = torch.minimum(best, torch.minimum(far_row[:, 1 : w + 1], far_row[:, 3 : w + 3]) + knight)
            if sign == 1:  # left to right: d[x] = min over k <= x of best[k] + a (x - k)
                d[:, y, 2 : w + 2] = torch.cummin(best - ramp, 1).values + ramp
            else:  # right to left
                d[:, y, 2 : w + 2] = torch.cummin((best + ramp).flip(1), 1).values.flip(1) - ramp
    return d[..., 2 : w + 2]


def equalize_hist(img: Tensor) -> Tensor:
    """``cv2.equalizeHist`` of each (H, W) map of 8-bit values in (B, H, W)."""
    b = img.shape[0]
    flat = img.reshape(b, -1).long()
    total = flat.shape[1]
    hist = torch.zeros(b, 256, dtype=torch.long, device=img.device).scatter_add_(1, flat, torch.ones_like(flat))
    first = (hist > 0).long().argmax(1, keepdim=True)
    scale = 255.0 / (total - hist.gather(1, first)).clamp(min=1).float()  # float32, as cv2
    lut = ((hist.cumsum(1) - hist.gather(1, first)).float() * scale).round().clamp(0, 255)
    lut = torch.where(hist.gather(1, first) == total, first.float(), lut)  # a constant map stays itself
    return lut.gather(1, flat).view_as(img).to(img.dtype)


def water_mask(liquid_u8: Tensor) -> Tensor:
    """The reference's drop shading (B, H, W) from the 8-bit liquid layer, before normalising."""
    edges = canny(liquid_u8, 50, 150)
    dist = chamfer_distance(edges).clamp(max=DIST_MAX * CHAMFER_ONE)  # threshold TRUNC at 20
    dist = (correlate2d(dist.double(), BOX3.double(), "reflect101") / (9 * CHAMFER_ONE)).floor()  # blur, uint8
    dist = equalize_hist(dist)
    dist = correlate2d(dist, EMBOSS.double(), "reflect101").clamp(0, 255)  # filter2D to CV_8U
    dist = (correlate2d(dist, BOX3.double(), "reflect101") / 9).round()  # blur on uint8
    return liquid_u8 * dist


def spatter_at(x: Tensor, c: tuple, noise: Tensor) -> Tensor:
    """Spatter from the reference's N(0, 1) draw ``noise`` (B, H, W), float64."""
    loc, scale, sigma, thresh, intensity, mud = c
    liquid = gaussian_blur((loc + scale * noise).double(), sigma)
    liquid = torch.where(liquid < thresh, 0.0, liquid)
    if mud:
        m = gaussian_blur((liquid > thresh).float(), intensity).to(x)
        m = torch.where(m < 0.8, 0.0, m)[:, None]
        colour = torch.tensor(MUD, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
        return x * (1 - m) + _match_channels(colour, x) * m
    liquid_u8 = (liquid * 255).floor().remainder(256)  # numpy's astype(uint8) wraps
    m = water_mask(liquid_u8)
    peak = m.amax(dim=(1, 2), keepdim=True)
    m = torch.where(peak > 0, m / peak.clamp(min=1), 0.0) * intensity  # no liquid at all: unchanged image
    colour = torch.tensor(WATER, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return x + m[:, None].to(x) * _match_channels(colour, x)


def _match_channels(colour: Tensor, x: Tensor) -> Tensor:
    return gray(colour) if x.shape[1] == 1 else colour


def spatter(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    check_channels(x, "spatter")
    noise = normal((x.shape[0], *x.shape[-2:]), x, generator, dtype=torch.float64)
    return spatter_at(x, c, noise)

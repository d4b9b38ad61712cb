"""The digital family plus brightness and saturate: ``fn(images, c, generator)``."""

from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import Tensor
from torchvision.io import decode_jpeg, encode_jpeg

from .draws import uniform
from .filters import border_index, box_matrix, check_channels, gaussian_blur, nearest_index

HUE_ZERO = (0.0, 1.0, 1.0)  # where skimage finds no hue (gray pixels) it uses 0, red: (v, p, p)


def contrast(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    """``(x - m) c + m`` with ``m`` the per-image, per-channel mean."""
    mean = x.mean(dim=(-2, -1), keepdim=True)
    return (x - mean) * c + mean


def brightness(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    """HSV value ``V + c`` (clipped to 1) at the same hue and saturation: every channel times
    ``V' / V`` (black becomes gray ``c``), what skimage's rgb2hsv / hsv2rgb round trip gives."""
    check_channels(x, "brightness")
    v = x.amax(dim=1, keepdim=True)
    v_new = (v + c).clamp(max=1)
    return torch.where(v > 0, x * (v_new / v.clamp(min=torch.finfo(x.dtype).tiny)), v_new)


def saturate(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """HSV saturation ``S c0 + c1`` (clipped to [0, 1]) at the same hue and value: channel
    ``V - V S' (V - x) / (V - min)``; gray pixels take hue 0 (red) as skimage gives them."""
    check_channels(x, "saturate")
    v = x.amax(dim=1, keepdim=True)
    delta = v - x.amin(dim=1, keepdim=True)
    colour = delta > 0
    s = torch.where(colour, delta / v.clamp(min=torch.finfo(x.dtype).tiny), 0.0)
    s_new = (s * c[0] + c[1]).clamp(0, 1)
    hue_zero = torch.tensor(HUE_ZERO[: x.shape[1]], dtype=x.dtype, device=x.device).view(1, -1, 1, 1)
    g = torch.where(colour, (v - x) / delta.clamp(min=torch.finfo(x.dtype).tiny), hue_zero)
    return v - v * s_new * g


def jpeg_compression(x: Tensor, quality: int, generator: Optional[torch.Generator]) -> Tensor:
    """libjpeg at ``quality`` via torchvision (the PIL encoder's bytes); rounds to 8 bits first."""
    if x.shape[1] not in (1, 3):
        raise ValueError(f"jpeg_compression needs 1 or 3 channels, got {x.shape[1]}; pick another corruption")
    u8 = (x * 255).round().to(torch.uint8).cpu()
    with warnings.catch_warnings():  # torchvision >= 0.29 flags its codecs as deprecated (moving to
        warnings.simplefilter("ignore", DeprecationWarning)  # torchcodec); PIL gives the same bytes
        decoded = decode_jpeg(encode_jpeg(list(u8), quality=quality))
    return torch.stack(decoded).to(device=x.device, dtype=x.dtype) / 255


def pixelate(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    """PIL BOX down to ``int(side c)`` then back up (BOX upsampling is nearest neighbour)."""
    h, w = x.shape[-2:]
    sh, sw = max(1, int(h * c)), max(1, int(w * c))
    small = box_matrix(h, sh, x) @ x @ box_matrix(w, sw, x).T
    return small[..., nearest_index(sh, h, x.device), :][..., nearest_index(sw, w, x.device)]


# ---------------------------------------------------------------- elastic transform


def _bilinear(x: Tensor, row0: Tensor, col0: Tensor, fy: Tensor, fx: Tensor, border: str) -> Tensor:
    """Bilinear samples of (B, C, H, W) ``x``: top-left taps ``row0``/``col0`` (B, H, W) int, fractions
    ``fy``/``fx``; taps outside the image follow ``border``."""
    b, ch, h, w = x.shape
    flat = x.flatten(2)
    r = [border_index(row0 + k, h, border) for k in (0, 1)]
    c = [border_index(col0 + k, w, border) for k in (0, 1)]

    def tap(i: int, j: int) -> Tensor:
        return flat.gather(2, (r[i] * w + c[j]).view(b, 1, -1).expand(-1, ch, -1)).view_as(x)

    fy, fx = fy[:, None].to(x.dtype), fx[:, None].to(x.dtype)
    return (
        tap(0, 0) * ((1 - fy) * (1 - fx))
        + tap(0, 1) * ((1 - fy) * fx)
        + tap(1, 0) * (fy * (1 - fx))
        + tap(1, 1) * (fy * fx)
    )


def _affine_points(h: int, w: int) -> Tensor:
    """The reference's three source points, (x, y) as cv2 reads them (it builds them from (H, W))."""
    ch, cw, s = float(h // 2), float(w // 2), float(min(h, w) // 3)
    return torch.tensor([[ch + s, cw + s], [ch + s, cw - s], [ch - s, cw - s]], dtype=torch.float32)


def affine_warp(x: Tensor, shift: Tensor) -> Tensor:
    """``cv2.warpAffine`` (bilinear, reflect-101 borders) by the affine map taking the reference's three
    points to themselves plus ``shift`` (B, 3, 2): each output pixel samples the inverse map's point."""
    b, _, h, w = x.shape
    src = _affine_points(h, w).to(shift.device).double()
    dst = src + shift.double()
    ones = torch.ones(b, 3, 1, dtype=torch.float64, device=shift.device)
    inverse = torch.linalg.solve(torch.cat([dst, ones], 2), src.expand(b, -1, -1))  # (B, 3, 2): dst -> src
    cols = torch.arange(w, dtype=torch.float64, device=shift.device)
    rows = torch.arange(h, dtype=torch.float64, device=shift.device)
    grid = torch.stack(
        torch.broadcast_tensors(
            cols[None, :], rows[:, None], torch.ones(1, 1, dtype=torch.float64, device=shift.device)
        ),
        -1,
    )
    at = (grid.view(1, h * w, 3) @ inverse).view(b, h, w, 2).to(x.device)  # (x, y) in the source
    c0, r0 = at[..., 0].floor(), at[..., 1].floor()
    return _bilinear(x, r0.long(), c0.long(), at[..., 1] - r0, at[..., 0] - c0, "reflect101")


def elastic_at(x: Tensor, c: tuple, shift: Tensor, noise: Tensor) -> Tensor:
    """The reference's elastic transform from its draws: ``shift`` (B, 3, 2) for the affine warp,
    ``noise`` (B, 2, H, W) U(-1, 1) for dx and dy, each smoothed by a Gaussian of std c1 (symmetric
    borders, truncated at 3 std) and scaled by c0, then sampled bilinearly with symmetric borders."""
    alpha, sigma = c[0], c[1]
    h, w = x.shape[-2:]
    warped = affine_warp(x, shift)
    disp = (gaussian_blur(noise.double(), sigma, "symmetric", truncate=3.0) * alpha).float().double().to(x.device)
    rows = torch.arange(h, dtype=torch.float64, device=x.device)[:, None] + disp[:, 1]
    cols = torch.arange(w, dtype=torch.float64, device=x.device)[None, :] + disp[:, 0]
    r0, c0 = rows.floor(), cols.floor()
    return _bilinear(warped, r0.long(), c0.long(), rows - r0, cols - c0, "symmetric")


def elastic_transform(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """Random affine (points moved by U(-c2, c2)), then a smooth random displacement (c0, c1)."""
    b, _, h, w = x.shape
    shift = uniform((b, 3, 2), x, generator, -c[2], c[2], dtype=torch.float64).float()
    noise = uniform((b, 2, h, w), x, generator, -1, 1, dtype=torch.float64)
    return elastic_at(x, c, shift, noise)

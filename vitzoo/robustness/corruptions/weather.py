"""The weather family (snow, frost, fog; brightness lives in ``digital``): ``fn(images, c, generator)``."""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from .blur import motion_blur_at
from .draws import integers, normal, uniform
from .filters import check_channels, clipped_zoom, gray

# The reference frost images drawn from at random (imagecorruptions 1.1.2's frost1-5, Apache-2.0: frost/README.md;
# its randint(5) never draws the sixth file it ships)
FROST_FILES = ("frost1.webp", "frost2.webp", "frost3.webp", "frost4.jpg", "frost5.jpg")


# ---------------------------------------------------------------- fog

Uniform = Callable[[Sequence[int], float, float], Tensor]


def plasma_fractal(
    batch: int, mapsize: int, decay: float, draw: Uniform, device: Optional[torch.device] = None
) -> Tensor:
    """The reference's diamond-square height map, (batch, mapsize, mapsize) float64 in [0, 1].

    ``draw(shape, low, high)`` supplies the uniform draws, in the reference's order."""
    m = torch.zeros(batch, mapsize, mapsize, dtype=torch.float64, device=device)
    step, wibble = mapsize, 100.0

    def wibbled_mean(a: Tensor) -> Tensor:
        return a / 4 + wibble * draw(a.shape, -wibble, wibble).to(a)

    while step >= 2:
        half = step // 2
        corner = m[:, 0::step, 0::step]
        squares = corner + corner.roll(-1, 1)
        squares = squares + squares.roll(-1, 2)
        m[:, half::step, half::step] = wibbled_mean(squares)
        centre = m[:, half::step, half::step]
        corner = m[:, 0::step, 0::step]
        m[:, 0::step, half::step] = wibbled_mean((centre + centre.roll(1, 1)) + (corner + corner.roll(-1, 2)))
        m[:, half::step, 0::step] = wibbled_mean((centre + centre.roll(1, 2)) + (corner + corner.roll(-1, 1)))
        step //= 2
        wibble /= decay
    m = m - m.amin(dim=(1, 2), keepdim=True)
    return m / m.amax(dim=(1, 2), keepdim=True)


def next_power_of_2(n: int) -> int:
    return 1 if n == 0 else 2 ** (n - 1).bit_length()


def fog(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """``x + c0 * plasma``, rescaled by ``max / (max + c0)`` (max over the whole image); the map is
    the next power of two of the longer side, cropped (32 for CIFAR, 256 for ImageNet at 224 px)."""
    amount, decay = c
    b, _, h, w = x.shape
    draw = lambda shape, low, high: uniform(shape, x, generator, low, high, torch.float64)  # noqa: E731
    plasma = plasma_fractal(b, next_power_of_2(max(h, w)), decay, draw, x.device)[:, None, :h, :w].to(x)
    peak = x.amax(dim=(1, 2, 3), keepdim=True)
    return (x + amount * plasma) * peak / (peak + amount)


# ---------------------------------------------------------------- frost


def frost_dir() -> Path:
    """The folder of the reference frost images, package data of vitzoo."""
    return Path(__file__).resolve().parent / "frost"


@lru_cache(maxsize=1)
def _frost_images() -> tuple[Tensor, ...]:
    """The five frost images as (3, h, w) float32 in [0, 1] (alpha dropped, as cv2.imread does)."""
    from PIL import Image  # torchvision depends on Pillow

    folder = frost_dir()
    out = []
    for name in FROST_FILES:
        with Image.open(folder / name) as im:
            rgb = torch.frombuffer(bytearray(im.convert("RGB").tobytes()), dtype=torch.uint8)
            out.append(rgb.view(im.height, im.width, 3).permute(2, 0, 1).float() / 255)
    return tuple(out)


@lru_cache(maxsize=16)
def _frost_layers(scale: float, h: int, w: int, device: torch.device) -> tuple[Tensor, ...]:
    """Each frost image resized for an h x w crop: by ``scale`` (make_cifar_c.py: 0.2, bilinear;
    ImageNet-C: 1, as is) when that leaves room, else enlarged to 1.1 times the fit (bicubic), as
    ``imagecorruptions`` does for images larger than a frost image."""
    layers = []
    for im in _frost_images():
        fh, fw = im.shape[-2:]
        if int(fh * scale) > h and int(fw * scale) > w:
            if scale != 1:
                im = F.interpolate(
                    im[None], scale_factor=scale, mode="bilinear", align_corners=False, recompute_scale_factor=False
                )[0]
        else:
            fit = 1.1 * max(h / fh, w / fw)
            size = (math.ceil(fh * fit), math.ceil(fw * fit))
            im = F.interpolate(im[None], size=size, mode="bicubic", align_corners=False)[0].clamp(0, 1)
        layers.append(im.to(device))
    return tuple(layers)


def frost_crops(x: Tensor, scale: float, generator: Optional[torch.Generator]) -> Tensor:
    """(B, 3, H, W): for each image one of the five frost layers at random, cropped at a random place
    (top-left drawn like the reference's ``randint(0, size - H)``)."""
    b, _, h, w = x.shape
    layers = _frost_layers(scale, h, w, x.device)
    pick = integers(0, len(layers), (b,), x, generator)
    u = uniform((b, 2), x, generator, dtype=torch.float64)
    out = torch.empty(b, 3, h, w, dtype=x.dtype, device=x.device)
    rows, cols = torch.arange(h, device=x.device), torch.arange(w, device=x.device)
    for k, layer in enumerate(layers):
        sel = (pick == k).nonzero().flatten()
        if len(sel) == 0:
            continue
        fh, fw = layer.shape[-2:]
        top = (u[sel, 0] * (fh - h)).long()
        left = (u[sel, 1] * (fw - w)).long()
        r = (top[:, None] + rows)[:, :, None]
        c = (left[:, None] + cols)[:, None, :]
        out[sel] = layer.to(x.dtype)[:, r, c].permute(1, 0, 2, 3)
    return out


def frost(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """``c0 x + c1 frost`` with a random crop of a reference frost image (resized by ``c2``)."""
    check_channels(x, "frost")
    crops = frost_crops(x, c[2], generator)
    return c[0] * x + c[1] * (gray(crops) if x.shape[1] == 1 else crops)


# ---------------------------------------------------------------- snow


def snow_layer(noise: Tensor, c: tuple, angles: Tensor, h: int, w: int) -> Tensor:
    """The reference's snow layer (B, 1, H, W) from its N(c0, c1^2) noise (B, H, W) and blur angles:
    clipped zoom by c2, zero below c3, clip, motion blur (radius c4, sigma c5), round to 8 bits."""
    layer = clipped_zoom(noise, c[2])
    layer = torch.where(layer < c[3], 0.0, layer).clamp(0, 1)
    layer = motion_blur_at(layer[:, None], c[4], c[5], angles)[..., :h, :w]
    return (layer * 255).round() / 255


def snow(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """``c6 x + (1 - c6) max(x, 1.5 gray + 0.5)`` plus the snow layer and its 180-degree rotation."""
    check_channels(x, "snow")
    b, _, h, w = x.shape
    noise = normal((b, h, w), x, generator, c[0], c[1])
    angles = uniform((b,), x, generator, -135, -45, dtype=torch.float64)
    layer = snow_layer(noise, c, angles, h, w)
    x = c[6] * x + (1 - c[6]) * torch.maximum(x, gray(x) * 1.5 + 0.5)
    return x + layer + layer.flip(-2, -1)

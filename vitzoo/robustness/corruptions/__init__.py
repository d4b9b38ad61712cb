"""Common image corruptions (Hendrycks & Dietterich, ICLR 2019) as batched, seeded tensor ops.

All 19: the 15 of CIFAR-10-C / ImageNet-C (``list_corruptions("benchmark")``) and the 4 extra ones
(``"extra"``: speckle_noise, gaussian_blur, spatter, saturate). Severity constants are the authors'
(github.com/hendrycks/robustness): ``ImageNet-C/create_c/make_cifar_c.py`` for protocol ``"cifar"``
and ``ImageNet-C/imagenet_c/imagenet_c/corruptions.py`` for ``"imagenet"``. Each op follows the
reference operation on a whole batch on any device; where it draws random numbers they come from
torch (same distribution, not the same draw). Results stay float (not rounded to 8 bits; JPEG
excepted) and are clipped to [0, 1]. docs/robustness/corruptions.md lists, per corruption, its
constants, how it was checked against the reference and what differs.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

from . import blur, digital, noise, spatter, weather

__all__ = ["Corruption", "CORRUPTIONS", "GROUPS", "PROTOCOLS", "corrupt", "default_protocol", "list_corruptions"]

PROTOCOLS = ("cifar", "imagenet")
SEVERITIES = (0, 1, 2, 3, 4, 5)
CIFAR_MAX_SIDE = 64  # images whose short side is at most this many pixels default to "cifar"
FAMILIES = ("noise", "blur", "weather", "digital")
GROUPS = ("benchmark", "extra") + FAMILIES


@dataclass(frozen=True)
class Corruption:
    """One corruption: ``fn(images, param, generator)`` and its per-severity params per protocol."""

    fn: Callable[[Tensor, object, Optional[torch.Generator]], Tensor]
    family: str  # "noise" | "blur" | "weather" | "digital"
    cifar: tuple
    imagenet: tuple
    extra: bool = False  # not one of the 15 that define CIFAR-10-C / ImageNet-C

    def param(self, severity: int, protocol: str):
        return getattr(self, protocol)[severity - 1]


S = 244  # ImageNet-C's elastic constants are written in units of 244 px ("should have been 224")
CORRUPTIONS: dict[str, Corruption] = {
    # noise
    "gaussian_noise": Corruption(
        noise.gaussian_noise, "noise", (0.04, 0.06, 0.08, 0.09, 0.10), (0.08, 0.12, 0.18, 0.26, 0.38)
    ),
    "shot_noise": Corruption(noise.shot_noise, "noise", (500, 250, 100, 75, 50), (60, 25, 12, 5, 3)),
    "impulse_noise": Corruption(
        noise.impulse_noise, "noise", (0.01, 0.02, 0.03, 0.05, 0.07), (0.03, 0.06, 0.09, 0.17, 0.27)
    ),
    "speckle_noise": Corruption(
        noise.speckle_noise, "noise", (0.06, 0.10, 0.12, 0.16, 0.20), (0.15, 0.20, 0.35, 0.45, 0.60), extra=True
    ),
    # blur
    "defocus_blur": Corruption(
        blur.defocus_blur,
        "blur",
        ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
        ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)),
    ),
    "glass_blur": Corruption(
        blur.glass_blur,
        "blur",  # (sigma, max shift, iterations)
        ((0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)),
        ((0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)),
    ),
    "motion_blur": Corruption(
        blur.motion_blur,
        "blur",  # (radius, sigma)
        ((6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)),
        ((10, 3), (15, 5), (15, 8), (15, 12), (20, 15)),
    ),
    "zoom_blur": Corruption(
        blur.zoom_blur,
        "blur",  # np.arange(start, stop, step) of zoom factors
        ((1, 1.06, 0.01), (1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.01), (1, 1.26, 0.01)),
        ((1, 1.11, 0.01), (1, 1.16, 0.01), (1, 1.21, 0.02), (1, 1.26, 0.02), (1, 1.31, 0.03)),
    ),
    "gaussian_blur": Corruption(blur.gaussian_blur, "blur", (0.4, 0.6, 0.7, 0.8, 1.0), (1, 2, 3, 4, 6), extra=True),
    # weather
    "snow": Corruption(
        weather.snow,
        "weather",  # (mean, std, zoom, threshold, blur radius, blur sigma, blend)
        (
            (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
            (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
            (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
            (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
            (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
        ),
        (
            (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
            (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
            (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
            (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
            (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
        ),
    ),
    "frost": Corruption(
        weather.frost,
        "weather",  # (image weight, frost weight, frost image resize)
        ((1, 0.2, 0.2), (1, 0.3, 0.2), (0.9, 0.4, 0.2), (0.85, 0.4, 0.2), (0.75, 0.45, 0.2)),
        ((1, 0.4, 1), (0.8, 0.6, 1), (0.7, 0.7, 1), (0.65, 0.7, 1), (0.6, 0.75, 1)),
    ),
    "fog": Corruption(
        weather.fog,
        "weather",  # (amount, wibble decay)
        ((0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)),
        ((1.5, 2), (2.0, 2), (2.5, 1.7), (2.5, 1.5), (3.0, 1.4)),
    ),
    "brightness": Corruption(digital.brightness, "weather", (0.05, 0.1, 0.15, 0.2, 0.3), (0.1, 0.2, 0.3, 0.4, 0.5)),
    "spatter": Corruption(
        spatter.spatter,
        "weather",  # (mean, std, sigma, threshold, intensity, mud)
        (
            (0.62, 0.1, 0.7, 0.7, 0.5, 0),
            (0.65, 0.1, 0.8, 0.7, 0.5, 0),
            (0.65, 0.3, 1, 0.69, 0.5, 0),
            (0.65, 0.1, 0.7, 0.69, 0.6, 1),
            (0.65, 0.1, 0.5, 0.68, 0.6, 1),
        ),
        (
            (0.65, 0.3, 4, 0.69, 0.6, 0),
            (0.65, 0.3, 3, 0.68, 0.6, 0),
            (0.65, 0.3, 2, 0.68, 0.5, 0),
            (0.65, 0.3, 1, 0.65, 1.5, 1),
            (0.67, 0.4, 1, 0.65, 1.5, 1),
        ),
        extra=True,
    ),
    # digital
    "contrast": Corruption(digital.contrast, "digital", (0.75, 0.5, 0.4, 0.3, 0.15), (0.4, 0.3, 0.2, 0.1, 0.05)),
    "elastic_transform": Corruption(
        digital.elastic_transform,
        "digital",  # (alpha, sigma, affine shift) in px
        (
            (32 * 0, 32 * 0, 32 * 0.08),
            (32 * 0.05, 32 * 0.2, 32 * 0.07),
            (32 * 0.08, 32 * 0.06, 32 * 0.06),
            (32 * 0.1, 32 * 0.04, 32 * 0.05),
            (32 * 0.1, 32 * 0.03, 32 * 0.03),
        ),
        (
            (S * 2, S * 0.7, S * 0.1),
            (S * 2, S * 0.08, S * 0.2),
            (S * 0.05, S * 0.01, S * 0.02),
            (S * 0.07, S * 0.01, S * 0.02),
            (S * 0.12, S * 0.01, S * 0.02),
        ),
    ),
    "pixelate": Corruption(digital.pixelate, "digital", (0.95, 0.9, 0.85, 0.75, 0.65), (0.6, 0.5, 0.4, 0.3, 0.25)),
    "jpeg_compression": Corruption(digital.jpeg_compression, "digital", (80, 65, 58, 50, 40), (25, 18, 15, 10, 7)),
    "saturate": Corruption(
        digital.saturate,
        "digital",  # (saturation factor, offset)
        ((0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)),
        ((0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)),
        extra=True,
    ),
}


def list_corruptions(group: Optional[str] = None) -> list[str]:
    """Sorted corruption names: all, ``"benchmark"`` (the 15), ``"extra"`` (the other 4) or one family
    (``"noise"``, ``"blur"``, ``"weather"``, ``"digital"``; extras included)."""
    if group is not None and group not in GROUPS:
        raise ValueError(f"unknown corruption group {group!r}; choose one of {list(GROUPS)}")
    keep = {None: lambda c: True, "benchmark": lambda c: not c.extra, "extra": lambda c: c.extra}.get(
        group, lambda c: c.family == group
    )
    return sorted(n for n, c in CORRUPTIONS.items() if keep(c))


def default_protocol(images: Tensor) -> str:
    """The protocol for ``protocol=None``: "cifar" up to 64 px on the short side, else "imagenet"."""
    return "cifar" if min(images.shape[-2:]) <= CIFAR_MAX_SIDE else "imagenet"


def _check(images: Tensor, name: str, severity: int, protocol: Optional[str]) -> None:
    if name not in CORRUPTIONS:
        raise ValueError(f"unknown corruption {name!r}; choose one of {list_corruptions()}")
    if not isinstance(severity, numbers.Integral) or isinstance(severity, bool) or severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {list(SEVERITIES)} (0 = clean), got {severity!r}")
    if protocol is not None and protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose one of {list(PROTOCOLS)} or None (by image size)")
    if not isinstance(images, Tensor) or images.ndim != 4 or not images.is_floating_point():
        what = f"{tuple(images.shape)} {images.dtype}" if isinstance(images, Tensor) else type(images).__name__
        raise ValueError(
            f"images must be a float tensor (B, C, H, W) in [0, 1], got {what}; for uint8 use images.float() / 255"
        )
    lo, hi = torch.aminmax(images) if images.numel() else (0, 1)
    if not (lo >= 0 and hi <= 1):  # NaN fails both
        if images.isnan().any():
            raise ValueError(
                "images contain NaN; find where they come from (a corrupted file, a division by zero) "
                "before corrupting them"
            )
        raise ValueError(
            f"images must lie in [0, 1], got values in [{lo.item():.3g}, {hi.item():.3g}]; "
            "corrupt before normalising, or clamp first"
        )


def corrupt(
    images: Tensor,
    name: str,
    severity: int = 3,
    protocol: Optional[str] = None,
    generator: Optional[torch.Generator] = None,
) -> Tensor:
    """Corrupt a batch (B, C, H, W) in [0, 1]; same shape, dtype and device, clipped to [0, 1].

    ``protocol`` picks the CIFAR-10-C or ImageNet-C strengths (None: by image size, see
    ``default_protocol``). Random corruptions draw from ``generator`` (on its own device), so
    the same seed gives the same output. Severity 0 returns an unchanged copy.

    >>> g = torch.Generator().manual_seed(0)
    >>> noisy = corrupt(images, "gaussian_noise", severity=3, generator=g)
    """
    _check(images, name, severity, protocol)
    if severity == 0 or images.numel() == 0:
        return images.clone()
    spec = CORRUPTIONS[name]
    param = spec.param(severity, protocol or default_protocol(images))
    work = images if images.dtype in (torch.float32, torch.float64) else images.float()
    return spec.fn(work, param, generator).clamp_(0, 1).to(images.dtype)

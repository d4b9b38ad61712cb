"""Common image corruptions (Hendrycks & Dietterich, ICLR 2019) as batched, seeded tensor ops.

Severity constants are copied from the authors' code, github.com/hendrycks/robustness:
``ImageNet-C/create_c/make_cifar_c.py`` (protocol ``"cifar"``, the CIFAR-10-C strengths) and
``ImageNet-C/imagenet_c/imagenet_c/corruptions.py`` (protocol ``"imagenet"``, the ImageNet-C
strengths). Differences from that code, for all corruptions: results stay float (no rounding
to uint8, except JPEG which is 8-bit by nature) and the random numbers come from torch, so the
noise is the same distribution but not the same draw.

How each corruption follows the reference:

* ``gaussian_noise`` ``x + N(0, c^2)``, ``shot_noise`` ``Poisson(x c) / c``, ``speckle_noise``
  ``x + x N(0, c^2)``: the same formula.
* ``impulse_noise``: salt-and-pepper as current scikit-image ``random_noise(mode="s&p",
  amount=c)``: each element (every channel on its own) is replaced with probability ``c``,
  by 1 or 0 with equal chance. (The skimage of 2018 drew ``ceil(c * size / 2)`` positions with
  replacement, so its changed fraction was a little below ``c``.)
* ``gaussian_blur``: exactly ``skimage.filters.gaussian(x, sigma=c, multichannel=True)``,
  i.e. a separable Gaussian truncated at ``int(4 c + 0.5)`` pixels with edge replication.
* ``defocus_blur``: exactly the reference disk kernel (disk of radius ``r`` anti-aliased by a
  3x3, or for ``r > 8`` 5x5, Gaussian of std ``alias_blur``), applied like ``cv2.filter2D``
  with reflect-101 borders. Like the reference, the ImageNet-C severity 4 and 5 kernels sum to
  1.013 and 1.011 (the anti-aliasing blur reflects at the grid edge that the disk touches).
* ``contrast``: exactly ``(x - m) c + m`` with ``m`` the per-image, per-channel mean.
* ``jpeg_compression``: libjpeg at quality ``c`` via torchvision (byte-identical to the PIL
  encoder the reference uses); the input is rounded to 8 bits first. 1 or 3 channels only.

All results are clipped to [0, 1]. Severity 0 returns an unchanged copy (a clean level for
sweeps).
"""
from __future__ import annotations

import numbers
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torchvision.io import decode_jpeg, encode_jpeg

__all__ = ["Corruption", "CORRUPTIONS", "PROTOCOLS", "corrupt", "default_protocol", "list_corruptions"]

PROTOCOLS = ("cifar", "imagenet")
SEVERITIES = (0, 1, 2, 3, 4, 5)
CIFAR_MAX_SIDE = 64  # images whose short side is at most this many pixels default to "cifar"


# ---------------------------------------------------------------- random draws

def _draw_device(x: Tensor, generator: Optional[torch.Generator]) -> torch.device:
    # Draw where the generator lives (a CPU generator then gives the same noise for CUDA images).
    return x.device if generator is None else generator.device


def _sample(sampler: Callable, x: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    """``torch.randn`` / ``torch.rand`` shaped like ``x``, drawn from ``generator``, on ``x``'s device."""
    dev = _draw_device(x, generator)
    return sampler(x.shape, generator=generator, device=dev, dtype=x.dtype).to(x.device)


# ---------------------------------------------------------------- noise family

def _gaussian_noise(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    return x + c * _sample(torch.randn, x, generator)


def _shot_noise(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    rate = (x * c).to(_draw_device(x, generator))
    return torch.poisson(rate, generator=generator).to(x.device) / c


def _impulse_noise(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    u = _sample(torch.rand, x, generator)  # u < c/2: salt, c/2 <= u < c: pepper, else untouched
    return torch.where(u < c, (u < c / 2).to(x.dtype), x)


def _speckle_noise(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    return x + x * (c * _sample(torch.randn, x, generator))


# ---------------------------------------------------------------- blur / digital

def _border_index(n: int, pad: int, border: str, device: torch.device) -> Tensor:
    """Source index of each position -pad .. n-1+pad: "nearest" repeats the edge (scipy),
    "reflect" mirrors without repeating it (cv2's BORDER_REFLECT_101), for any pad."""
    i = torch.arange(-pad, n + pad, device=device)
    if border == "nearest" or n == 1:
        return i.clamp(0, n - 1)
    i = i.remainder(2 * (n - 1))
    return torch.where(i >= n, 2 * (n - 1) - i, i)


def _filter_matrix(weights: Tensor, n: int, border: str, like: Tensor) -> Tensor:
    """(n, n) matrix M with M @ v = v correlated with the odd-length 1D ``weights``, 'same' size."""
    r = len(weights) // 2
    src = _border_index(n, r, border, like.device).unfold(0, 2 * r + 1, 1)  # (n, 2r + 1)
    rows = torch.arange(n, device=like.device)[:, None].expand_as(src)
    m = torch.zeros(n, n, dtype=torch.float64, device=like.device)
    return m.index_put_((rows, src), weights.to(m).expand_as(src), accumulate=True).to(like.dtype)


def _separable(x: Tensor, weights: Tensor, border: str) -> Tensor:
    """The same 1D filter along H and W, as banded matrices (fast for small images on CPU)."""
    h, w = x.shape[-2:]
    return _filter_matrix(weights, h, border, x) @ x @ _filter_matrix(weights, w, border, x).T


def _gaussian_1d(sigma: float, radius: int) -> Tensor:
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    w = torch.exp(-0.5 * (t / sigma) ** 2)
    return w / w.sum()


def _gaussian_blur(x: Tensor, sigma: float, generator: Optional[torch.Generator]) -> Tensor:
    return _separable(x, _gaussian_1d(sigma, int(4.0 * sigma + 0.5)), "nearest")  # scipy: truncate=4


def _disk_kernel(radius: float, alias_blur: float) -> Tensor:
    """The reference's anti-aliased disk (a 17x17 grid, or 2r+1 for r > 8), cropped to its support."""
    half, k = (8, 3) if radius <= 8 else (int(radius), 5)
    t = torch.arange(-half, half + 1, dtype=torch.float64)
    disk = ((t[:, None] ** 2 + t[None, :] ** 2) <= radius**2).double()
    disk = _separable(disk / disk.sum(), _gaussian_1d(alias_blur, k // 2), "reflect")  # cv2.GaussianBlur
    r = int(torch.nonzero(disk.sum(0)).max()) - half  # zero border rows/cols change nothing
    return disk[half - r:half + r + 1, half - r:half + r + 1]


def _defocus_blur(x: Tensor, c: tuple, generator: Optional[torch.Generator]) -> Tensor:
    """cv2.filter2D with the disk: reflect-101 padding by index, then a depthwise conv."""
    kernel = _disk_kernel(*c).to(x)
    ch, h, w = x.shape[-3:]
    r = kernel.shape[0] // 2
    y = x[..., _border_index(h, r, "reflect", x.device), :][..., _border_index(w, r, "reflect", x.device)]
    return F.conv2d(y, kernel.expand(ch, 1, -1, -1), groups=ch)


def _contrast(x: Tensor, c: float, generator: Optional[torch.Generator]) -> Tensor:
    mean = x.mean(dim=(-2, -1), keepdim=True)
    return (x - mean) * c + mean


def _jpeg_compression(x: Tensor, quality: int, generator: Optional[torch.Generator]) -> Tensor:
    if x.shape[1] not in (1, 3):
        raise ValueError(f"jpeg_compression needs 1 or 3 channels, got {x.shape[1]}; pick another corruption")
    u8 = (x * 255).round().to(torch.uint8).cpu()
    with warnings.catch_warnings():  # torchvision >= 0.29 flags its codecs as deprecated (moving to
        warnings.simplefilter("ignore", DeprecationWarning)  # torchcodec); PIL gives the same bytes
        decoded = decode_jpeg(encode_jpeg(list(u8), quality=quality))
    return torch.stack(decoded).to(device=x.device, dtype=x.dtype) / 255


# ---------------------------------------------------------------- registry

@dataclass(frozen=True)
class Corruption:
    """One corruption: ``fn(images, param, generator)`` and its per-severity params per protocol."""

    fn: Callable[[Tensor, object, Optional[torch.Generator]], Tensor]
    family: str  # "noise" | "blur" | "digital"
    cifar: tuple
    imagenet: tuple

    def param(self, severity: int, protocol: str):
        return getattr(self, protocol)[severity - 1]


CORRUPTIONS: dict[str, Corruption] = {
    "gaussian_noise": Corruption(_gaussian_noise, "noise",
                                 (0.04, 0.06, 0.08, 0.09, 0.10), (0.08, 0.12, 0.18, 0.26, 0.38)),
    "shot_noise": Corruption(_shot_noise, "noise", (500, 250, 100, 75, 50), (60, 25, 12, 5, 3)),
    "impulse_noise": Corruption(_impulse_noise, "noise",
                                (0.01, 0.02, 0.03, 0.05, 0.07), (0.03, 0.06, 0.09, 0.17, 0.27)),
    "speckle_noise": Corruption(_speckle_noise, "noise",
                                (0.06, 0.10, 0.12, 0.16, 0.20), (0.15, 0.20, 0.35, 0.45, 0.60)),
    "gaussian_blur": Corruption(_gaussian_blur, "blur", (0.4, 0.6, 0.7, 0.8, 1.0), (1, 2, 3, 4, 6)),
    "defocus_blur": Corruption(_defocus_blur, "blur",
                               ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)),
                               ((3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5))),
    "contrast": Corruption(_contrast, "digital", (0.75, 0.5, 0.4, 0.3, 0.15), (0.4, 0.3, 0.2, 0.1, 0.05)),
    "jpeg_compression": Corruption(_jpeg_compression, "digital", (80, 65, 58, 50, 40), (25, 18, 15, 10, 7)),
}


def list_corruptions(family: Optional[str] = None) -> list[str]:
    """Sorted corruption names, optionally only one family ("noise", "blur", "digital")."""
    families = sorted({c.family for c in CORRUPTIONS.values()})
    if family is not None and family not in families:
        raise ValueError(f"unknown corruption family {family!r}; choose one of {families}")
    return sorted(n for n, c in CORRUPTIONS.items() if family in (None, c.family))


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
        raise ValueError(f"images must be a float tensor (B, C, H, W) in [0, 1], got {what}; "
                         "for uint8 use images.float() / 255")
    lo, hi = torch.aminmax(images) if images.numel() else (0, 1)
    if not (lo >= 0 and hi <= 1):  # NaN fails both
        if images.isnan().any():
            raise ValueError("images contain NaN; find where they come from (a corrupted file, a division by zero) "
                             "before corrupting them")
        raise ValueError(f"images must lie in [0, 1], got values in [{lo.item():.3g}, {hi.item():.3g}]; "
                         "corrupt before normalising, or clamp first")


def corrupt(images: Tensor, name: str, severity: int = 3, protocol: Optional[str] = None,
            generator: Optional[torch.Generator] = None) -> Tensor:
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

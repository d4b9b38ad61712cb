"""2-D rotary position embeddings (RoPE) of the patch grid: the angle tables and the one rotation.

``rope``: ``axial`` (timm's ``RotaryEmbeddingCat``, EVA-02 and the naver RoPE-Axial ViTs), ``mixed`` (timm's
``RotaryEmbeddingMixed``: learned 2-D frequencies per block and head) or ``dinov3`` (timm's
``RotaryEmbeddingDinoV3``: normalised coordinates), or a dict ``{name: axial, base: 100, ...}`` with the variant's
options (``ROPE_OPTIONS``). docs/mechanisms.md section 20 has the formulas.

Every variant turns pairs of adjacent channels (2m, 2m+1) of each head by an angle theta_m of the token's
coordinates (t_0, t_1) on the grid; prefix (class / register) tokens get angle 0. Coordinates come from the grid of
the current input, so another resolution needs no resampling. DINOv3's own code pairs channel c with c + d/2
(rotate-half); that is the same function up to one fixed permutation of the channels of q and k.

Per-image grids: ``angles(grid, prefix, like)`` is the table of one grid (H or 1, prefix + h*w, d/2). A caller with
an own grid per image stacks ``positions(grid_b, like)`` padded to a common length into (B, n, 2), takes
``angles_from`` of it, (B, H or 1, n, d/2), and pads ``prefix`` zero rows in front (``with_prefix``).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..options import reject_unknown, split_spec

__all__ = ["ROPE_NAMES", "ROPE_OPTIONS", "RopeSpec", "Rope", "build_rope", "rotate_all", "with_prefix"]

ROPE_NAMES = ("axial", "mixed", "dinov3")
# each variant's options and their defaults (base: timm's default temperature of the variant)
ROPE_OPTIONS: Dict[str, Dict[str, Any]] = {
    "axial": {"base": 10000.0, "indexing": "ij", "offset": 0.0, "ref_grid": None},
    "mixed": {"base": 10.0, "indexing": "ij"},
    "dinov3": {"base": 100.0, "indexing": "ij", "offset": 0.0, "normalize": "separate"},
}
INDEXINGS = ("ij", "xy")  # ij: coordinate 0 is the row; xy: coordinate 0 is the column (naver's models)
NORMALIZES = ("separate", "min", "max")  # dinov3: each axis by its own size, or both by the smaller / larger
RopeSpec = Union[None, str, Mapping[str, Any]]
Grid = Tuple[int, int]


def rotate_all(angles: torch.Tensor, *xs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """Turn each pair of channels (2m, 2m+1) of every x (..., n, d) in ``xs`` (q and k, or a form's features) by
    ``angles`` (broadcastable to (..., n, d/2)): (x_2m cos - x_2m+1 sin, x_2m+1 cos + x_2m sin), computed in the wider
    of the two dtypes, returned in x's; cos and sin are taken once for all of ``xs``."""
    cos, sin = angles.cos(), angles.sin()

    def turn(x: torch.Tensor) -> torch.Tensor:
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2).to(x.dtype)

    return tuple(turn(x) for x in xs)


def real(value: Any) -> bool:
    """Whether an option's value is a real number (an int or a float, not a bool or a string)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def with_prefix(angles: torch.Tensor, prefix: int) -> torch.Tensor:
    """``angles`` (..., n, d/2) with ``prefix`` rows of 0 (no rotation) in front of the tokens."""
    return F.pad(angles, (0, 0, prefix, 0)) if prefix else angles


class Rope(nn.Module):
    """One attention layer's RoPE over ``dim`` channels of each of ``num_heads`` heads (see the module docstring).

    ``base``: axial's temperature T (bands T^(-k/(dim/4))), mixed's T of the initial magnitudes T^(-4k/dim),
    dinov3's period base (periods T^(4k/dim)). ``indexing``: ``ij`` (coordinate 0 = row) or ``xy`` (= column).
    ``offset``: added to the integer (axial) or 0.5-centred (dinov3) positions. ``ref_grid`` (axial): positions
    rescaled to t * ref / size per axis (EVA-02), so another grid interpolates instead of extrapolating.
    ``normalize`` (dinov3): ``separate`` | ``min`` | ``max``, the denominators of the normalised coordinates.
    """

    def __init__(
        self,
        name: str,
        dim: int,
        num_heads: int,
        *,
        base: float,
        indexing: str = "ij",
        offset: float = 0.0,
        ref_grid: Optional[Tuple[int, int]] = None,
        normalize: str = "separate",
        device=None,
        dtype=None,
    ):
        super().__init__()
        if dim % 4:
            raise ValueError(
                f"rope {name!r} turns channel pairs, a quarter of the channels per axis: the rotated width {dim} "
                f"must be a multiple of 4 (set head_dim)"
            )
        if indexing not in INDEXINGS:
            raise ValueError(f"rope indexing={indexing!r}; choose one of {list(INDEXINGS)}")
        if normalize not in NORMALIZES:
            raise ValueError(f"rope normalize={normalize!r}; choose one of {list(NORMALIZES)}")
        if not real(base) or not base > 0:
            raise ValueError(f"rope base must be a number > 0, got {base!r}")
        if not real(offset) or not math.isfinite(offset):
            raise ValueError(f"rope offset must be a finite number, got {offset!r}")
        if ref_grid is not None and not (
            isinstance(ref_grid, Sequence)
            and len(ref_grid) == 2
            and all(isinstance(s, numbers.Integral) and not isinstance(s, bool) and s >= 1 for s in ref_grid)
        ):
            raise ValueError(f"rope ref_grid must be a grid [rows, cols] of positive integers, got {ref_grid!r}")
        self.name, self.dim, self.num_heads, self.base = name, dim, num_heads, float(base)
        self.indexing, self.offset, self.normalize = indexing, float(offset), normalize
        self.ref_grid = (int(ref_grid[0]), int(ref_grid[1])) if ref_grid is not None else None
        self.freqs = None
        if name == "mixed":
            self.freqs = nn.Parameter(mixed_frequencies(dim, num_heads, self.base, device=device, dtype=dtype))

    def bands(self, like: torch.Tensor) -> torch.Tensor:
        """The dim/4 angular frequencies per axis of ``axial`` and ``dinov3``, in ``like``'s dtype."""
        k = torch.arange(self.dim // 4, device=like.device, dtype=like.dtype)
        if self.name == "dinov3":  # 2 pi / P_k, P_k = base^(4k/dim)
            return 2 * math.pi * self.base ** (-4 * k / self.dim)
        return self.base ** (-4 * k / self.dim)

    def positions(self, grid: Grid, like: torch.Tensor) -> torch.Tensor:
        """The (t_0, t_1) coordinates of the h*w grid tokens in raster order: (h*w, 2), fp32 or wider."""
        dtype = torch.promote_types(like.dtype, torch.float32)
        sizes = (int(grid[0]), int(grid[1]))
        if self.name == "dinov3":
            denom = {"separate": sizes, "min": (min(sizes),) * 2, "max": (max(sizes),) * 2}[self.normalize]
            axes = [
                2 * (torch.arange(s, device=like.device, dtype=dtype) + 0.5 + self.offset) / d - 1
                for s, d in zip(sizes, denom)
            ]
        else:
            axes = [torch.arange(s, device=like.device, dtype=dtype) + self.offset for s in sizes]
            if self.ref_grid is not None:
                axes = [t / s * r for t, s, r in zip(axes, sizes, self.ref_grid)]
        rows, cols = torch.meshgrid(axes[0], axes[1], indexing="ij")
        coords = (rows, cols) if self.indexing == "ij" else (cols, rows)
        return torch.stack(coords, dim=-1).reshape(-1, 2)

    def angles_from(self, positions: torch.Tensor) -> torch.Tensor:
        """theta for coordinates (..., n, 2): (..., H or 1, n, dim/2) in their dtype. ``axial`` / ``dinov3``:
        [t_0 omega, t_1 omega] (one table for all heads); ``mixed``: t_0 f_0 + t_1 f_1 per head."""
        t0, t1 = positions[..., None, :, 0:1], positions[..., None, :, 1:2]  # (..., 1, n, 1)
        if self.freqs is None:
            omega = self.bands(positions)
            return torch.cat([t0 * omega, t1 * omega], dim=-1)
        f = self.freqs.to(positions.dtype)
        return t0 * f[0][:, None, :] + t1 * f[1][:, None, :]

    def angles(self, grid: Grid, prefix: int, like: torch.Tensor) -> torch.Tensor:
        """The table of ``prefix`` unrotated tokens then the ``grid`` tokens: (H or 1, prefix + h*w, dim/2)."""
        return with_prefix(self.angles_from(self.positions(grid, like)), prefix)

    def spec(self) -> Dict[str, Any]:
        """This RoPE as a ``rope`` spec: ``{name: ..., <every option>}``."""
        return {"name": self.name, **{key: getattr(self, key) for key in ROPE_OPTIONS[self.name]}}

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.spec().items()) + f", dim={self.dim}"


def mixed_frequencies(dim: int, num_heads: int, base: float, device=None, dtype=None) -> torch.Tensor:
    """RoPE-Mixed's initial (f_0, f_1) per head and pair: (2, H, dim/2). Magnitudes base^(-4k/dim), one random
    direction psi per head; pairs m < dim/4 point along psi, the others along psi + pi/2 (timm's init)."""
    mag = base ** -(torch.arange(0, dim, 4, device=device, dtype=torch.float32) / dim)
    psi = torch.rand(num_heads, 1, device=device) * 2 * math.pi
    f0 = torch.cat([mag * psi.cos(), mag * (psi + math.pi / 2).cos()], dim=-1)
    f1 = torch.cat([mag * psi.sin(), mag * (psi + math.pi / 2).sin()], dim=-1)
    return torch.stack([f0, f1]).to(dtype or torch.get_default_dtype())


def build_rope(spec: RopeSpec, dim: int, num_heads: int, device=None, dtype=None) -> Optional[Rope]:
    """The ``Rope`` for a spec (None, a name, or ``{name: ..., options}``); a bad spec is one ValueError."""
    if spec is None:
        return None
    name, options = split_spec("rope", spec, ROPE_NAMES)
    reject_unknown(f"rope {name!r}", options, sorted(ROPE_OPTIONS[name]))
    return Rope(name, dim, num_heads, **{**ROPE_OPTIONS[name], **options}, device=device, dtype=dtype)

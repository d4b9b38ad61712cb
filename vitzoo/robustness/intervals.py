"""Uncertainty of an accuracy measured on a finite set of images: the Wilson score interval."""

from __future__ import annotations

import math
from typing import Tuple

__all__ = ["wilson_interval", "accuracy_interval"]


def wilson_interval(correct: int, n: int, z: float = 1.96) -> Tuple[float, float]:
    """Wilson score interval (z = 1.96: 95%) of a proportion ``correct / n``, as (low, high) in [0, 1].

    p = correct / n; centre = (p + z^2 / 2n) / (1 + z^2 / n);
    half-width = z / (1 + z^2 / n) * sqrt(p (1 - p) / n + z^2 / 4n^2).
    """
    if n <= 0 or not 0 <= correct <= n:
        raise ValueError(f"wilson_interval needs 0 <= correct <= n and n > 0, got correct={correct}, n={n}")
    p, z2 = correct / n, z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def accuracy_interval(accuracy: float, n: int, z: float = 1.96) -> Tuple[float, float]:
    """:func:`wilson_interval` of an accuracy measured on ``n`` images (``accuracy * n`` rounded to a count)."""
    return wilson_interval(round(accuracy * n), n, z)

"""Errors that name their fix, shared by the library and its entry points."""

from __future__ import annotations

__all__ = ["MissingDependency"]


class MissingDependency(ImportError):
    """An optional package a feature needs is not installed; the message names the install."""

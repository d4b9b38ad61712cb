"""Robustness evaluation: input corruptions (and, with eval.py, noise sweeps)."""
from .corruptions import CORRUPTIONS, PROTOCOLS, corrupt, list_corruptions

__all__ = ["CORRUPTIONS", "PROTOCOLS", "corrupt", "list_corruptions"]

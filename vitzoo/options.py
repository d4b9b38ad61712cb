"""The one rule for option mappings (attention specs, ``module.optim``, ``transfer``...): a key the code does not
know is a one-line error naming it and the valid ones, never silently dropped."""

from __future__ import annotations

from typing import Collection

__all__ = ["reject_unknown"]


def reject_unknown(owner: str, given: Collection[str], valid: Collection[str]) -> None:
    """Raise ``ValueError`` when ``given`` holds keys outside ``valid``; ``owner`` names what takes the options."""
    unknown = sorted(set(given) - set(valid))
    if unknown:
        raise ValueError(f"{owner} has no option(s) {unknown}; valid options: {sorted(valid)}")

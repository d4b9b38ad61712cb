"""vitzoo's architectures in timm's registry, under the prefix ``vitzoo_``.

``@zoo_model`` registers a builder named by its short name (``pvt_v2_b0``) with timm as ``vitzoo_pvt_v2_b0``, so that
none shadows timm's own ``pvt_v2_b0`` or ``swin_tiny_*``; ``vitzoo.create_model`` and ``vitzoo.list_models()`` keep
the short names. The builder's module holds its ``default_cfgs`` under the prefixed names (``zoo_cfgs``).
Names registered before the prefix (``vit_cifar`` in an older export's config.json) stay loadable (``legacy_names``).
"""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, Dict, Mapping, TypeVar

import timm
from timm.models import generate_default_cfgs, register_model, register_model_deprecations

__all__ = ["PREFIX", "zoo_model", "zoo_cfgs", "zoo_names", "timm_name", "short_name", "legacy_names"]

PREFIX = "vitzoo_"
_NAMES: Dict[str, str] = {}  # short name -> timm name
_BUILDERS: Dict[str, Callable[..., Any]] = {}  # short name -> the builder registered with timm
F = TypeVar("F", bound=Callable[..., Any])


def timm_name(short: str) -> str:
    """``pvt_v2_b0`` -> ``vitzoo_pvt_v2_b0`` (a name already prefixed is returned as it is)."""
    return short if short.startswith(PREFIX) else PREFIX + short


def short_name(name: str) -> str:
    """``vitzoo_pvt_v2_b0`` -> ``pvt_v2_b0``."""
    return name[len(PREFIX) :] if name.startswith(PREFIX) else name


def zoo_cfgs(cfgs: Mapping[str, Dict[str, Any]]):
    """timm's ``generate_default_cfgs`` of ``{short name: cfg}``, keyed by the prefixed names."""
    return generate_default_cfgs({timm_name(name): cfg for name, cfg in cfgs.items()})


def zoo_model(fn: F) -> F:
    """Register ``fn`` (named by its short name) with timm as ``vitzoo_<name>``; returns ``fn`` unchanged."""
    short = fn.__name__
    if short in _NAMES:
        raise ValueError(f"architecture {short!r} is registered twice")

    @functools.wraps(fn)
    def builder(*args, **kwargs):
        return fn(*args, **kwargs)

    builder.__name__ = builder.__qualname__ = timm_name(short)
    register_model(builder)
    _NAMES[short] = timm_name(short)
    _BUILDERS[short] = builder
    return fn


def legacy_names(*shorts: str) -> None:
    """Keep timm names from before the prefix loadable (an export whose config.json says ``"vit_cifar"``): each
    maps to ``vitzoo_<name>`` through timm's table of deprecated names (timm warns once with the new name, and
    ``timm.list_models`` leaves them out); a name timm itself has stays timm's."""
    for short in shorts:
        if timm.is_model(short):
            continue
        builder = _BUILDERS[short]
        setattr(sys.modules[builder.__module__], builder.__name__, builder)  # where timm's table looks it up
        register_model_deprecations(builder.__module__, {short: builder.__name__})


def zoo_names() -> list:
    """Sorted short names of the architectures registered through ``zoo_model``."""
    return sorted(_NAMES)

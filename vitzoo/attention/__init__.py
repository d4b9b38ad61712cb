"""How tokens attend: mechanisms behind one contract (``ZooAttention``) and a name registry.

Every module of this package is imported here, so a mechanism registers itself by existing: adding
one is one file (``@register_attention``) plus its preset in configs/model/. Each registered class is
exported under its own name.
"""
import importlib as _importlib
import pkgutil as _pkgutil

from . import functional
from .base import HEAD_MODES, HeadProjection, ZooAttention
from .feature_maps import FeatureMap, build_feature_map, list_feature_maps, register_feature_map
from .registry import (AttentionSpec, attention_layer, attention_options, build_attention, list_attentions,
                       register_attention, resolve_attention)

for _module in _pkgutil.iter_modules(__path__):
    _importlib.import_module(f"{__name__}.{_module.name}")

_MECHANISMS = {cls.__name__: cls for cls in (resolve_attention(name)[0] for name in list_attentions())}
globals().update(_MECHANISMS)

__all__ = [
    "functional", "AttentionSpec", "ZooAttention", "HeadProjection", "HEAD_MODES", "register_attention",
    "list_attentions", "resolve_attention", "attention_options", "build_attention", "attention_layer",
    "FeatureMap", "register_feature_map", "list_feature_maps", "build_feature_map", *sorted(_MECHANISMS),
]

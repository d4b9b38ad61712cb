"""Name -> mechanism registry, and the one place an attention spec is parsed.

A spec is a name (``"linear"``) or a mapping with a ``name`` and options
(``{"name": "linear", "feature_map": "relu", "logit_noise": 0.1}``). A registered name may
carry preset options (``taylor`` is ``LinearAttention`` with ``feature_map="taylor"``).
"""
from __future__ import annotations

import inspect
from typing import Any, Dict, Mapping, Tuple, Type, Union

from .base import ZooAttention

__all__ = ["register_attention", "list_attentions", "resolve_attention", "attention_options",
           "build_attention", "attention_layer", "AttentionSpec"]

AttentionSpec = Union[str, Mapping[str, Any]]
_REGISTRY: Dict[str, Tuple[Type[ZooAttention], Dict[str, Any]]] = {}
# Arguments the backbone supplies; they describe the model, not the mechanism.
_CONTEXT_ARGS = {"num_tokens", "num_prefix_tokens", "grid_size", "dim_out", "device", "dtype"}


def register_attention(name: str, **preset):
    """Class decorator: register ``cls`` under ``name`` with preset options."""
    def wrap(cls: Type[ZooAttention]):
        if name in _REGISTRY:
            raise ValueError(f"attention {name!r} is registered twice")
        _REGISTRY[name] = (cls, dict(preset))
        return cls
    return wrap


def list_attentions() -> list:
    """Sorted names of all registered mechanisms."""
    return sorted(_REGISTRY)


def attention_options(cls: Type[ZooAttention]) -> list:
    """The options a spec may set for ``cls`` (its keyword-only arguments and the shared ones)."""
    names = set()
    for klass in cls.__mro__:
        if klass is object or "__init__" not in vars(klass):
            continue
        for p in inspect.signature(klass.__init__).parameters.values():
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _CONTEXT_ARGS:
                names.add(p.name)
        if klass is ZooAttention:
            break
    return sorted(names)


def resolve_attention(spec: AttentionSpec) -> Tuple[Type[ZooAttention], Dict[str, Any]]:
    """(class, options) for a spec; unknown names and options are a ValueError naming the valid ones."""
    if isinstance(spec, str):
        name, options = spec, {}
    elif isinstance(spec, Mapping):
        options = dict(spec)
        name = options.pop("name", None)
        if name is None:
            raise ValueError(f"attention spec {dict(spec)} has no 'name'; add name: one of {list_attentions()}")
    else:
        raise ValueError(f"attention must be a name or a mapping with a 'name', got {type(spec).__name__}")
    if name not in _REGISTRY:
        raise ValueError(f"unknown attention {name!r}; choose one of {list_attentions()}")
    cls, preset = _REGISTRY[name]
    valid = attention_options(cls)
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"attention {name!r} has no option(s) {unknown}; valid options: {valid}")
    return cls, {**preset, **options}


def build_attention(spec: AttentionSpec, dim: int, **layer_kwargs) -> ZooAttention:
    """Build the module for ``spec`` with timm's ``attn_layer`` arguments (dim, num_heads, ...)."""
    cls, options = resolve_attention(spec)
    return cls(dim, **layer_kwargs, **options)


def attention_layer(spec: AttentionSpec, **context) -> type:
    """A class usable as timm's ``attn_layer=`` that builds ``spec`` (plus model ``context``).

    timm calls ``attn_layer(dim, num_heads=..., qkv_bias=..., ...)`` and checks
    ``issubclass(attn_layer, ...)``, so this returns a class whose constructor returns the built
    mechanism; the instances are ordinary (picklable) mechanism modules.
    """
    resolve_attention(spec)  # fail at build time, not deep inside timm

    def __new__(cls, dim, **layer_kwargs):
        layer_kwargs.pop("depth", None)
        return build_attention(spec, dim, **context, **layer_kwargs)

    name = spec if isinstance(spec, str) else spec["name"]
    return type(f"AttentionLayer[{name}]", (), {"__new__": __new__, "spec": spec})

"""Name registries for mechanisms and feature maps, built from specs (parsed by ``vitzoo.options.split_spec``).

A spec is a name (``"linear"``) or a mapping with a ``name`` and options
(``{"name": "linear", "feature_map": "relu", "logit_noise": 0.1}``,
``{"name": "hedgehog", "num_features": 32}``). A registered name may carry preset options
(``taylor`` is ``LinearAttention`` with ``feature_map="taylor"``).
"""

from __future__ import annotations

import inspect
from typing import Any, Collection, Dict, Mapping, Tuple, Union

from ..options import reject_unknown, split_spec
from .base import ZooAttention

__all__ = [
    "Spec",
    "Registry",
    "register_attention",
    "list_attentions",
    "resolve_attention",
    "attention_options",
    "build_attention",
    "attention_layer",
    "AttentionSpec",
]

Spec = Union[str, Mapping[str, Any]]  # a name, or a mapping with a "name" and options
AttentionSpec = Spec


class Registry:
    """Names -> subclasses of ``base``, each with preset options; ``kind`` names the spec in error messages.

    A spec may set the keyword-only arguments of the class's ``__init__`` and of its bases' up to ``base``,
    except ``context`` (what the caller supplies, not the spec).
    """

    def __init__(self, kind: str, base: type, context: Collection[str] = ()):
        self.kind, self.base, self.context = kind, base, frozenset(context)
        self._entries: Dict[str, Tuple[type, Dict[str, Any]]] = {}

    def register(self, name: str, **preset):
        """Class decorator: register ``cls`` under ``name`` with preset options."""

        def wrap(cls: type):
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._entries[name] = (cls, dict(preset))
            return cls

        return wrap

    def names(self) -> list:
        """Sorted registered names."""
        return sorted(self._entries)

    def options(self, cls: type) -> list:
        """The options a spec may set for ``cls``."""
        names = set()
        for klass in cls.__mro__:
            if klass is object or "__init__" not in vars(klass):
                continue
            for p in inspect.signature(vars(klass)["__init__"]).parameters.values():
                if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in self.context:
                    names.add(p.name)
            if klass is self.base:
                break
        return sorted(names)

    def resolve(self, spec: Spec) -> Tuple[type, Dict[str, Any]]:
        """(class, options) for a spec; a wrong type, a missing or unknown name and unknown options are a
        ValueError naming the valid ones."""
        name, options = split_spec(self.kind, spec, self.names())
        cls, preset = self._entries[name]
        reject_unknown(f"{self.kind} {name!r}", options, self.options(cls))
        return cls, {**preset, **options}


# Arguments the backbone supplies; they describe the model, not the mechanism.
_ATTENTIONS = Registry(
    "attention", ZooAttention, context=("num_tokens", "num_prefix_tokens", "grid_size", "dim_out", "device", "dtype")
)
register_attention = _ATTENTIONS.register
list_attentions = _ATTENTIONS.names
attention_options = _ATTENTIONS.options
resolve_attention = _ATTENTIONS.resolve


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

"""What the pyramid backbones (PVT, PVTv2, Swin) share: a mechanism per stage, built with the stage's defaults.

``attention`` for a pyramid is one spec (every block), a list of one entry per stage, or a per-block form over all
blocks (``vitzoo.attention.stack.stage_specs``). A backbone supplies per-stage defaults (PVT's ``sr_ratio``, Swin's
``window``); each applies to the mechanisms that take it and that the spec leaves unset. A mechanism that cannot run
in a stage refuses in one line that names the stage.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Sequence, Type, cast

import torch.nn as nn

from vitzoo.attention import AttentionSpec, ZooAttention, attention_options, build_attention, resolve_attention
from vitzoo.attention.stack import stage_specs

__all__ = ["with_defaults", "stage_attention", "stage_layer", "zoo_layers"]


def with_defaults(spec: AttentionSpec, defaults: Mapping[str, Any]) -> AttentionSpec:
    """``spec`` with each of ``defaults`` that its mechanism takes and it leaves unset: ``sr_ratio`` / ``sr_pool``
    where the mechanism reduces keys (``no_sr`` is None), ``window`` where it takes one (``window_size`` for the
    ``window`` mechanism, which is windowed itself)."""
    resolved, options = resolve_attention(spec)
    cls = cast(Type[ZooAttention], resolved)
    name = spec if isinstance(spec, str) else spec["name"]
    added: Dict[str, Any] = {}
    for key, value in defaults.items():
        if key in ("sr_ratio", "sr_pool") and cls.no_sr is not None:
            continue
        if key == "window" and cls.no_window is not None:
            key = "window_size" if "window_size" in attention_options(cls) else ""
        if key and key not in options and value is not None:
            added[key] = value
    if not added:
        return spec
    return {"name": name, **added, **({} if isinstance(spec, str) else spec)}


def stage_attention(attention: Any, depths: Sequence[int]) -> List[List[AttentionSpec]]:
    """One spec per block, grouped by stage (a bad spec or count is one ValueError)."""
    return stage_specs(attention, depths)


def stage_layer(spec: AttentionSpec, stage: int, dim: int, num_heads: int, **kwargs) -> ZooAttention:
    """``build_attention(spec, dim, num_heads=..., **kwargs)``; a refusal names the stage."""
    try:
        return build_attention(spec, dim, num_heads=num_heads, **kwargs)
    except ValueError as err:
        raise ValueError(f"stage {stage + 1} ({dim} channels, {num_heads} heads): {err}") from None


def zoo_layers(module: nn.Module) -> Iterator[ZooAttention]:
    """The zoo attention layers of ``module``, in order."""
    return (m for m in module.modules() if isinstance(m, ZooAttention))

"""The published linear-attention pyramids: FLatten, Agent, InLine and Pola PVT-T and Swin-T as their releases build
them (docs/pyramids.md gives each configuration and its parameters and FLOPs beside the official model's).

Each is an architecture (``vitzoo.create_model("flatten_pvt_tiny")``, timm ``vitzoo_flatten_pvt_tiny``) whose default
``attention`` is the release's mix; any other ``attention`` replaces it. The PVT-T releases are PVT v1 without the class
token (mean head, no final norm); the Swin-T releases run their linear stages in windows of 56 (the whole stage at
224) and Swin's attention in windows of 7 in the others.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

import torch.nn as nn

from .pvt import pvt_tiny
from .registry import zoo_model
from .swin import swin_tiny

__all__ = ["RELEASES"]

FLATTEN = {"name": "focused_linear", "power": 3.0, "kernel_size": 5, "focus_norm": "token"}
POLA = {"name": "pola", "alpha": 4.0, "kernel_size": 5}
INLINE = {"name": "inline"}
SOFTMAX = "softmax"  # PVT's (spatial reduction 8, 4, 2, 1) or Swin's (windows of 7, relative position bias)


def _agent(num_agents: int) -> Dict[str, Any]:
    return {"name": "agent", "num_agents": num_agents, "kernel_size": 3, "bias": True}


def _in_swin_windows(spec: Dict[str, Any]) -> Dict[str, Any]:
    return {**spec, "window": 56}


_PVT_RELEASE = dict(class_token=False, global_pool="avg", final_norm=False)

# name: (base builder, default attention per stage, the base's keyword arguments)
RELEASES: Dict[str, tuple] = {
    "flatten_pvt_tiny": (pvt_tiny, [FLATTEN] * 4, _PVT_RELEASE),
    "agent_pvt_tiny": (pvt_tiny, [_agent(9), _agent(16), _agent(49), _agent(49)], _PVT_RELEASE),
    "inline_pvt_tiny": (pvt_tiny, [INLINE] * 4, dict(_PVT_RELEASE, num_heads=(2, 4, 10, 16))),
    "pola_pvt_tiny": (pvt_tiny, [POLA] * 4, _PVT_RELEASE),
    "flatten_swin_tiny": (swin_tiny, [_in_swin_windows(FLATTEN)] * 2 + [SOFTMAX] * 2, {}),
    "agent_swin_tiny": (swin_tiny, [_in_swin_windows(_agent(n)) for n in (9, 16, 49)] + [SOFTMAX], {}),
    "inline_swin_tiny": (swin_tiny, [_in_swin_windows(INLINE)] * 3 + [SOFTMAX], {}),
    "pola_swin_tiny": (swin_tiny, [_in_swin_windows(POLA)] * 2 + [SOFTMAX] * 2, {}),
}


def _register(name: str, base: Callable[..., nn.Module], attention: List[Any], kwargs: Dict[str, Any]) -> None:
    def builder(pretrained: bool = False, **overrides) -> nn.Module:
        return base(pretrained, **{"attention": attention, **kwargs, **overrides})

    builder.__name__ = builder.__qualname__ = name
    builder.__module__ = __name__
    builder.__doc__ = f"{name}: {base.__name__} with the release's attention per stage (docs/pyramids.md)."
    zoo_model(builder)


for _name, (_base, _attention, _kwargs) in RELEASES.items():
    _register(_name, _base, _attention, _kwargs)

"""Initialise a pyramid of any mechanism per stage from a pretrained softmax pyramid of its family
(``create_model("pvt_v2_b0", attention=..., init_from=...)``).

The source is ``timm:<model>.<tag>`` (timm's PVTv2 / Swin, downloaded as ``timm.create_model`` does), a state dict file
(timm's or the official PVT v1 layout) or a vitzoo export folder. Tensors of the same name and shape are copied: patch
embeddings, position tables, norms, MLPs, merging, the head when the class count matches. Each attention layer reads
the source's projections as it reads timm's names (``q`` + ``kv`` or ``qkv`` as its q, k, v rows, PVT's ``sr`` /
``norm`` as its spatial reduction, Swin's bias table as ``rel_table``); what only the mechanism has keeps its own
initialisation, and what the mechanism does not use stays unused (both in the one line logged).
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Dict, Union

import timm
import torch
import torch.nn as nn
from safetensors.torch import load_file

from vitzoo.attention import ZooAttention, WindowAttention
from .hub_probe import offline_unless_reachable
from .local_dir import WEIGHTS_NAME, check_export
from .pretrained import LoadReport
from .pretrained_sources import STATE_DICT_SUFFIXES, read_state_dict

__all__ = ["initialise_pyramid", "PYRAMID_SOURCES"]

log = logging.getLogger(__name__)

PYRAMID_SOURCES = (
    "timm:<model>.<tag> (a PVTv2 or Swin), a .safetensors / .pth / .bin state dict, or a vitzoo export folder"
)


def initialise_pyramid(model: nn.Module, source: Union[str, os.PathLike]) -> LoadReport:
    """Load the pretrained pyramid ``source`` into ``model`` in place; logs one line and returns the report."""
    text = os.fspath(source)
    state = _read(text)
    for name, layer in model.named_modules():  # the names each layer reads (its load hooks, run here to match shapes)
        if isinstance(layer, ZooAttention):
            layer._timm_qkv_names(state, f"{name}.")
            if isinstance(layer, WindowAttention):
                layer._timm_table_name(state, f"{name}.")
    own = model.state_dict()
    fits = {k: v for k, v in state.items() if k in own and own[k].shape == v.shape}
    report = LoadReport(
        text,
        loaded=sorted(fits),
        new=sorted(k for k in own if k not in fits),
        unused=sorted(k for k in state if k not in fits),
    )
    skeleton = [k for k in report.new if not re.search(r"(^|\.)(attn|head)\.", k)]  # all but attention and head
    if skeleton:
        raise ValueError(
            f"init_from={text!r} is not this {type(model).__name__}'s family or shape: {len(skeleton)} of its tensors "
            f"outside the attention and the head are not in it (e.g. {skeleton[0]}); give the same architecture's "
            f"softmax weights: {PYRAMID_SOURCES}"
        )
    model.load_state_dict(fits, strict=False)
    log.info(str(report))
    return report


def _read(text: str) -> Dict[str, torch.Tensor]:
    if text.startswith("timm:"):
        return _from_timm(text)
    path = Path(text).expanduser()
    if path.is_dir():
        check_export(path)
        return load_file(str(path / WEIGHTS_NAME))
    if not path.is_file() or path.suffix not in STATE_DICT_SUFFIXES:
        raise FileNotFoundError(f"init_from={text!r} is not a file or folder vitzoo reads; give {PYRAMID_SOURCES}")
    return read_state_dict(text, path)


def _from_timm(text: str) -> Dict[str, torch.Tensor]:
    """Download as ``timm.create_model(name, pretrained=True)`` does (hub cache included); offline, one line."""
    name = text[len("timm:") :]
    if not timm.is_model(name.split(".")[0]):
        raise ValueError(f"init_from={text!r}: timm has no model {name!r}; list them with timm.list_pretrained('pvt*')")
    try:
        with offline_unless_reachable() as unreachable:
            return timm.create_model(name, pretrained=True).state_dict()
    except OSError as err:  # no network, hub error, nothing cached
        reason = unreachable or (str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__)
        raise ValueError(
            f"init_from={text!r}: the weights could not be downloaded ({reason}); offline, save "
            f"timm.create_model('{name}', pretrained=True).state_dict() where the hub is reachable and pass the file"
        ) from None

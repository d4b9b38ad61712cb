"""Initialise a pyramid of any mechanism per stage from a pretrained softmax pyramid of its family
(``create_model("pvt_v2_b0", attention=..., init_from=...)``).

The source is ``timm:<model>.<tag>`` (timm's PVTv2 / Swin, downloaded as ``timm.create_model`` does), a state dict file
(timm's or the official layout) or a vitzoo export folder. Tensors of the same name and shape are copied: patch
embeddings, position tables, norms, MLPs, merging, the head when the class count matches. Each layer reads the
source's names as its own load hooks read them (an attention layer: timm's ``q`` + ``kv`` or ``qkv`` as its q, k, v
rows, PVT's ``sr`` / ``norm`` as its spatial reduction, Swin's bias table as ``rel_table``; MLLA's ``qk``); what only
the mechanism has keeps its own initialisation, and what it does not use stays unused (both in the one line logged).
"""

from __future__ import annotations

import copy
import logging
import os
import re
from pathlib import Path
from typing import Dict, List, Union

import timm
import torch
import torch.nn as nn
from safetensors.torch import load_file

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
    other_shape: List[str] = []

    def drop_other_shapes(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
        """After the module's own load hooks (its names for timm's / the official tensors): a tensor of another
        shape than the module's stays unused."""
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
            key = prefix + name
            if tensor is not None and key in state_dict and state_dict[key].shape != tensor.shape:
                other_shape.append(key)
                del state_dict[key]

    trial = copy.deepcopy(model)  # the model itself changes only once the source is known to fit
    hooks = [m.register_load_state_dict_pre_hook(drop_other_shapes) for m in trial.modules()]
    missing, unexpected = trial.load_state_dict(state, strict=False)
    for hook in hooks:
        hook.remove()
    report = LoadReport(
        text,
        loaded=sorted(k for k in model.state_dict() if k not in set(missing)),
        new=sorted(missing),
        unused=sorted([*unexpected, *other_shape]),
    )
    skeleton = [k for k in report.new if not re.search(r"(^|\.)(attn|head)\.", k)]  # all but attention and head
    if skeleton:
        raise ValueError(
            f"init_from={text!r} is not this {type(model).__name__}'s family or shape: {len(skeleton)} of its tensors "
            f"outside the attention and the head are not in it (e.g. {skeleton[0]}); give the same architecture's "
            f"softmax weights: {PYRAMID_SOURCES}"
        )
    model.load_state_dict(trial.state_dict())
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

"""Where pretrained softmax ViT weights come from: ``timm:<model>.<tag>``, a state dict file, a vitzoo export.

Each source gives a :class:`ViTWeights`: the tensors in the layout of timm's ``VisionTransformer``
(``blocks.N.attn.qkv``) and, where the source records it, a model of the source's architecture whose
attributes tell what the tensors do not (number of heads, position-embedding grid, pooling, activation, RoPE).
timm's ROPE-ViT checkpoints (``Eva`` models) are read through ``pretrained_eva``.
"""

from __future__ import annotations

import os
import pickle
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Union, cast

import timm
import torch
import torch.nn as nn
from safetensors import SafetensorError
from safetensors.torch import load_file
from timm.layers import PatchEmbed
from timm.models import clean_state_dict, get_pretrained_cfg
from timm.models.vision_transformer import VisionTransformer

from vitzoo.attention import SoftmaxAttention, resolve_attention
from .hub_probe import offline_unless_reachable
from .local_dir import WEIGHTS_NAME, check_export
from .pretrained_eva import EVA_HINT, eva_differences, eva_layout, eva_rope, is_eva, rotates_halves
from .registry import short_name, timm_name
from .vit import VIT_ARCHS

__all__ = ["ViTWeights", "read_vit_weights", "read_state_dict", "SOURCE_FORMS", "STATE_DICT_SUFFIXES"]

STATE_DICT_SUFFIXES = (".safetensors", ".pth", ".bin")
SOURCE_FORMS = (
    "timm:<model>.<tag>, a .safetensors / .pth / .bin state dict of a timm VisionTransformer or ROPE-ViT, or a vitzoo "
    "export folder"
)
_QKV = ".attn.qkv."
_IN_PROJ = ".attn.in_proj.proj."


@dataclass
class ViTWeights:
    """A softmax ViT's tensors in timm's layout; ``reference`` (None for a bare state dict) is a model of the
    source's architecture, on the meta device for an export, read for what the tensors do not record. ``rope``:
    the checkpoint's RoPE as a ``rope`` spec, with the settings the source records (None: none, or not recorded);
    ``rotate_half``: whether its q and k pair channel c with c + d/2 (None: not recorded)."""

    source: str
    state: Dict[str, torch.Tensor]
    reference: Optional[nn.Module] = None
    rope: Optional[Dict[str, Any]] = None
    notes: List[str] = field(default_factory=list)
    rotate_half: Optional[bool] = False


def read_vit_weights(
    source: Union[str, os.PathLike], before_download: Optional[Callable[[ViTWeights], None]] = None
) -> ViTWeights:
    """The weights ``source`` names (see ``SOURCE_FORMS``); each problem is a one-line ValueError /
    FileNotFoundError. ``before_download`` sees a timm model's architecture (tensors on the meta device) first."""
    text = os.fspath(source)
    if text.startswith("timm:"):
        return _from_timm(text, before_download)
    path = Path(text).expanduser()
    if path.is_dir():
        return _from_export(text, path)
    if not path.is_file():
        raise FileNotFoundError(f"init_from={text!r} does not exist; give {SOURCE_FORMS}")
    if path.suffix == ".ckpt":
        raise ValueError(
            f"init_from={text!r} is a training checkpoint; export it first (`python -m vitzoo.export "
            f"{text} OUT`) and pass init_from=OUT"
        )
    if path.suffix not in STATE_DICT_SUFFIXES:
        raise ValueError(f"init_from={text!r} has suffix {path.suffix!r}; give {SOURCE_FORMS}")
    state = read_state_dict(text, path)
    if {"blocks.0.gamma_1", "blocks.0.attn.q_bias", "rope.freqs"} & set(
        state
    ):  # a timm Eva: RoPE settings not recorded
        rope = {"name": "mixed"} if "rope.freqs" in state else None
        note = "RoPE settings are not in a state dict: the model's are taken"
        return ViTWeights(text, eva_layout(state), rope=rope, notes=[note], rotate_half=None)
    return ViTWeights(text, state)


def read_state_dict(text: str, path: Path) -> Dict[str, torch.Tensor]:
    """The tensors of a .safetensors / .pth / .bin state dict file (a training script's wrapper unpacked); an
    unreadable file is one ValueError."""
    try:
        state = (
            load_file(str(path))
            if path.suffix == ".safetensors"
            else torch.load(path, map_location="cpu", weights_only=True)
        )
    except (SafetensorError, RuntimeError, OSError, EOFError, ValueError, pickle.UnpicklingError) as err:
        reason = str(err).strip().splitlines()[0][:160] if str(err).strip() else type(err).__name__
        raise ValueError(
            f"init_from={text!r} is not a readable state dict ({reason}); save it with "
            f"safetensors' save_file(model.state_dict(), ...) or torch.save(model.state_dict(), ...)"
        ) from None
    return _tensors_only(text, state)


def _tensors_only(source: str, state) -> Dict[str, torch.Tensor]:
    """The state dict inside a training script's wrapper (``state_dict`` / ``model`` key, ``module.`` prefixes)."""
    wrapped = next(
        (state[key] for key in ("state_dict", "model") if isinstance(state, dict) and isinstance(state.get(key), dict)),
        state,
    )
    state = clean_state_dict(wrapped) if isinstance(wrapped, dict) else wrapped
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(
            f"init_from={source!r} holds no state dict of tensors; pass a model's state dict (model.state_dict())"
        )
    return state


def _from_timm(source: str, before_download: Optional[Callable[[ViTWeights], None]]) -> ViTWeights:
    """Download as ``timm.create_model(name, pretrained=True)`` does (hub cache included) and keep its model."""
    name = source[len("timm:") :]
    try:
        cfg = get_pretrained_cfg(name, allow_unregistered=False)
    except RuntimeError as err:
        raise ValueError(
            f"init_from={source!r}: {err} List the weights timm has with timm.list_pretrained('vit_*')"
        ) from None
    with torch.device("meta"):  # the architecture alone, to refuse a non-ViT or another shape before downloading
        layout = timm.create_model(name)
    if is_eva(layout):
        differences = eva_differences(layout)
        if differences:
            raise ValueError(
                f"init_from={source!r} is a timm Eva whose {', '.join(differences)} do not map onto vitzoo's ViT; "
                f"{EVA_HINT}"
            )
    elif not _is_plain_vit(layout):
        raise ValueError(
            f"init_from={source!r} is a {type(layout).__name__}, not a ViT with a patch embedding "
            f"(timm's VisionTransformer); pick a vit_* model ({EVA_HINT})"
        )
    if before_download is not None:
        before_download(_timm_weights(source, layout))
    try:
        with offline_unless_reachable() if cfg is not None and cfg.hf_hub_id else nullcontext() as unreachable:
            model = timm.create_model(name, pretrained=True)
    except OSError as err:  # no network, hub error, nothing cached (huggingface_hub's and urllib's errors are OSErrors)
        reason = unreachable or (str(err).strip().splitlines()[0][:120] if str(err).strip() else type(err).__name__)
        raise ValueError(
            f"init_from={source!r}: the weights could not be downloaded ({reason}); offline, pass a "
            f"local file instead: save timm.create_model('{name}', pretrained=True).state_dict() where "
            f"the hub is reachable (safetensors' save_file) and pass init_from=/path/to/weights.safetensors"
        ) from None
    return _timm_weights(source, model)


def _timm_weights(source: str, model: nn.Module) -> ViTWeights:
    """A timm ViT's or ROPE-ViT's (checked) weights in timm's VisionTransformer layout."""
    if is_eva(model):
        return ViTWeights(source, eva_layout(model.state_dict()), model, eva_rope(model), [], rotates_halves(model))
    return ViTWeights(source, model.state_dict(), model)


def _is_plain_vit(model: nn.Module) -> bool:
    return isinstance(model, VisionTransformer) and type(model.patch_embed) is PatchEmbed


def _from_export(source: str, path: Path) -> ViTWeights:
    """A vitzoo export of a softmax ViT, its ``in_proj`` written back as timm's fused ``qkv``."""
    cfg = check_export(path)
    arch, args = short_name(cfg["architecture"]), dict(cfg.get("model_args") or {})
    if arch not in VIT_ARCHS:
        raise ValueError(
            f"init_from={source!r} is an export of {arch}, not a ViT; give a ViT's export "
            f"({', '.join(sorted(VIT_ARCHS))})"
        )
    spec = args.pop("attention", "softmax")
    cls, options = resolve_attention(spec)
    if not issubclass(cls, SoftmaxAttention):
        raise ValueError(
            f"init_from={source!r} holds {cls.__name__} weights; init_from takes a softmax ViT (load "
            f"this export as it is with vitzoo.export.load_exported)"
        )
    with torch.device("meta"):  # the export's own architecture, for its attributes
        reference = cast(
            VisionTransformer, timm.create_model(timm_name(arch), attention=spec, **args)
        )  # a VIT_ARCHS arch
    state = load_file(str(path / WEIGHTS_NAME))
    rope = getattr(reference.blocks[0].attn, "rope", None)
    return ViTWeights(source, _qkv_layout(state, reference), reference, None if rope is None else rope.spec())


def _qkv_layout(state: Dict[str, torch.Tensor], reference: VisionTransformer) -> Dict[str, torch.Tensor]:
    """vitzoo's softmax tensors renamed to timm's; projected heads multiplied into one fused q|k|v map."""
    out = {}
    for name, tensor in state.items():
        if ".attn.in_proj.head_weight" in name:
            continue
        if _IN_PROJ in name:
            block = name.split(".attn.")[0]
            head_weight = state.get(f"{block}.attn.in_proj.head_weight")
            if head_weight is not None:  # x W_o^T H_o per output o: weight H_o^T W_o, bias b_o H_o
                parts = tensor.chunk(len(head_weight))
                tensor = torch.cat([h.T @ p if p.ndim == 2 else p @ h for p, h in zip(parts, head_weight)])
            name = name.replace(_IN_PROJ, _QKV)
        out[name] = tensor
    return out

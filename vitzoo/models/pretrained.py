"""Initialise a vitzoo ViT of any mechanism from a pretrained softmax ViT (``create_model(..., init_from=...)``).

Tensors of the same name are copied: patch embedding, class / register tokens, norms, MLPs, layer scales,
the attention's output projection, the head when the class count matches (else it stays new). The position
embedding is resampled to the model's grid, and the patch embedding to its patch size and input channels,
with timm's own functions and arguments (as ``checkpoint_filter_fn`` / ``load_pretrained`` do). timm's fused
``qkv`` fills the rows of q, k, v the mechanism projects; projected heads start as the identity, so they
reproduce the checkpoint's q, k, v exactly. What only the mechanism has keeps its own initialisation.
"""

from __future__ import annotations

import logging
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Mapping, Set, Union, cast

import torch
import torch.nn as nn
from timm.layers import resample_abs_pos_embed, resample_patch_embed
from timm.models import adapt_input_conv

from vitzoo.attention import ZooAttention
from .pretrained_eva import interleave_qk
from .pretrained_sources import SOURCE_FORMS, ViTWeights, read_vit_weights
from .vit import ZooVisionTransformer

__all__ = ["initialise_from", "LoadReport", "compact_names"]

log = logging.getLogger(__name__)

QKV = ("q", "k", "v")
_RESAMPLE: Dict[str, Any] = dict(interpolation="bicubic", antialias=True)  # timm's checkpoint_filter_fn defaults
_REQUIRED = ("patch_embed.proj.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.fc1.weight")
# Checkpoint tensors a model may leave unused: its head (a headless model) and timm's dropped representation layer.
_MAY_BE_UNUSED = re.compile(r"^(head|pre_logits)\.")


@dataclass
class LoadReport:
    """What ``initialise_from`` did; ``str(report)`` is the one line it logs."""

    source: str
    loaded: List[str]
    new: List[str]
    unused: List[str]
    notes: List[str] = field(default_factory=list)
    head_note: str = ""

    def __str__(self) -> str:
        notes = f" ({'; '.join(self.notes)})" if self.notes else ""
        head = f" ({self.head_note})" if self.head_note else ""
        return (
            f"init_from={self.source}: {len(self.loaded)} tensors loaded{notes}; new: {compact_names(self.new)}"
            f"{head}; unused from the checkpoint: {compact_names(self.unused)}"
        )


def initialise_from(model: nn.Module, source: Union[str, os.PathLike]) -> LoadReport:
    """Load the pretrained softmax ViT ``source`` (see ``SOURCE_FORMS``) into ``model`` in place; logs one line.

    A checkpoint of another width, depth, head count or layout, or one that is not a ViT, is one ValueError.
    """
    if isinstance(getattr(model, "model", None), ZooVisionTransformer):
        raise ValueError(
            "init_from loads a whole ViT, not a feature wrapper (features_only=True): build the model "
            "without features_only and take features with forward_intermediates, or export it "
            "(vitzoo.export.export_model) and load the export with features_only=True"
        )
    if not isinstance(model, ZooVisionTransformer):
        raise ValueError(
            f"init_from loads a ViT's weights; {type(model).__name__} is not a vitzoo ViT (build one of "
            f"the vit_* architectures, or a pyramid: vitzoo.models.initialise_from)"
        )
    weights = read_vit_weights(source, before_download=lambda layout: _check_architecture(model, layout))
    _check_architecture(model, weights)
    report = _load(model, weights)
    log.info(str(report))
    return report


# -- architecture -------------------------------------------------------------------------------------------
def _timm_shapes(model: nn.Module) -> Dict[str, torch.Size]:
    """The model's tensor shapes under timm's names (the attention's input projection as ``qkv``)."""
    return {name.replace(".attn.in_proj.proj.", ".attn.qkv."): t.shape for name, t in model.state_dict().items()}


def _tensor_facts(shapes: Mapping[str, torch.Size], has_q: bool) -> Dict[str, Any]:
    """Architecture options a timm ViT's tensor names and shapes record."""
    width = shapes["patch_embed.proj.weight"][0]
    facts = {
        "embed_dim": width,
        "depth": 1 + max(int(name.split(".")[1]) for name in shapes if name.startswith("blocks.")),
        "mlp_ratio": shapes["blocks.0.mlp.fc1.weight"][0] / width,
        "class_token": "cls_token" in shapes,
        "reg_tokens": shapes["reg_token"][1] if "reg_token" in shapes else 0,
        "qkv_bias": "blocks.0.attn.qkv.bias" in shapes,
        "init_values": 1e-5 if "blocks.0.ls1.gamma" in shapes else None,  # layer scale (its value is loaded)
        "pre_norm": "norm_pre.weight" in shapes,
        "final_norm": "norm.weight" in shapes,
        "fc_norm": "fc_norm.weight" in shapes,
        "pos_embed": "learn" if "pos_embed" in shapes else "none",
    }
    if has_q:  # a mechanism without q (Synthesizer) has no qk-norm to load
        facts["qk_norm"] = "blocks.0.attn.q_norm.weight" in shapes
        if facts["qk_norm"]:
            facts["num_heads"] = width // shapes["blocks.0.attn.q_norm.weight"][0]
    return facts


def _module_facts(vit: Any) -> Dict[str, Any]:
    """Architecture options only a built model shows."""
    block: Any = vit.blocks[0]  # a block of any block_fn (norm1, attn, mlp)
    norm = block.norm1
    return {
        "num_heads": block.attn.num_heads,
        "global_pool": vit.global_pool,
        "no_embed_class": vit.no_embed_class,
        "act_layer": type(block.mlp.act).__name__,
        "norm_layer": f"{type(norm).__name__}(eps={norm.eps})",
        "block_fn": "Block" if type(block).__name__ == "EvaBlock" else type(block).__name__,  # pretrained_eva
    }


def _check_architecture(model: ZooVisionTransformer, weights: ViTWeights) -> None:
    """One ValueError if the weights are not a ViT's, or naming every option where the checkpoint's ViT and the
    model differ, with both values."""
    missing = [name for name in _REQUIRED if name not in weights.state]
    if missing:
        keys = ", ".join(list(weights.state)[:4])
        raise ValueError(
            f"init_from={weights.source} is not a timm VisionTransformer state dict (it has no "
            f"{', '.join(missing)}; its first keys: {keys}); give {SOURCE_FORMS}"
        )
    has_q = "q" in _attention(model.blocks[0]).projections
    mine = {**_tensor_facts(_timm_shapes(model), has_q), **_module_facts(model)}
    theirs = _tensor_facts({k: v.shape for k, v in weights.state.items()}, has_q)
    if weights.reference is not None:
        theirs.update(_module_facts(weights.reference))
    differ = [key for key in mine if key in theirs and theirs[key] != mine[key]]
    if differ:
        ckpt = ", ".join(f"{key}={theirs[key]!r}" for key in differ)
        built = ", ".join(f"{key}={mine[key]!r}" for key in differ)
        plus = " ".join(f"++model.kwargs.{key}={_hydra(theirs[key])}" for key in differ)
        raise ValueError(
            f"init_from={weights.source}: the checkpoint's ViT has {ckpt}, the model {built}; build the "
            f"model with the checkpoint's values (create_model(..., {ckpt}); train.py: {plus})"
        )
    if weights.rope is not None:
        _check_rope(model, weights.source, weights.rope)


def _check_rope(model: ZooVisionTransformer, source: str, want: Dict[str, Any]) -> None:
    """Every block's RoPE has the checkpoint's settings (those it records), or one ValueError naming both."""
    for index, block in enumerate(model.blocks):
        rope = _attention(block).rope
        have = None if rope is None else rope.spec()
        if have is None or any(have.get(key) != value for key, value in want.items()):
            raise ValueError(
                f"init_from={source}: the checkpoint's ViT has rope={want}, block {index} of the model "
                f"rope={have}; build the model with the checkpoint's RoPE (attention={{'name': ..., 'rope': {want}}})"
            )


# -- mapping ------------------------------------------------------------------------------------------------
def _load(model: ZooVisionTransformer, weights: ViTWeights) -> LoadReport:
    target = model.state_dict()
    mapped: Dict[str, torch.Tensor] = {}
    used: Set[str] = set()
    notes: List[str] = list(weights.notes)
    state = _adjacent_pairs(model, weights, notes)
    partial: List[str] = []
    identity: List[str] = []
    for index, block in enumerate(model.blocks):
        prefix = f"blocks.{index}.attn"
        mapped.update(_projections(_attention(block), prefix, state, weights.source, used, partial, identity))
    for name in target:
        if name not in mapped and ".attn.in_proj." not in name and name in state:
            mapped[name] = state[name]
            used.add(name)
    _resample_embeddings(model, weights, mapped, notes)
    head_note = ""
    if "head.weight" in mapped and mapped["head.weight"].shape != target["head.weight"].shape:
        for name in ("head.weight", "head.bias"):
            mapped.pop(name, None)
            used.discard(name)
        head_note = (
            f"the model has {target['head.weight'].shape[0]} classes, the checkpoint {state['head.weight'].shape[0]}"
        )
    for name, tensor in mapped.items():
        if tensor.shape != target[name].shape:
            raise ValueError(
                f"init_from={weights.source}: the checkpoint's {name} has shape {tuple(tensor.shape)}, "
                f"the model's {tuple(target[name].shape)}; build the model with the checkpoint's shape"
            )
    new = [name for name in target if name not in mapped]
    unused = [name for name in state if name not in used]
    _check_leftovers(model, weights.source, new, unused)
    if identity:
        notes.append(
            f"{compact_names(identity)} set to the identity (projected heads reproduce the checkpoint's q, k, v)"
        )
    result = model.load_state_dict(mapped, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys  # every mapped name comes from the model's state dict
    loaded = [name for name in mapped if name not in identity]
    return LoadReport(weights.source, loaded, new, unused + partial, notes, head_note)


def _adjacent_pairs(model: ZooVisionTransformer, weights: ViTWeights, notes: List[str]) -> Dict[str, torch.Tensor]:
    """The checkpoint with rotate-half q and k reordered to vitzoo's adjacent RoPE pairs (pretrained_eva). Where the
    source does not record its layout (a bare state dict), a model with dinov3 RoPE takes it as DINOv3's own."""
    attn = _attention(model.blocks[0])
    halves = weights.rotate_half
    if halves is None:
        halves = attn.rope is not None and attn.rope.name == "dinov3"
        if halves:
            notes.append("q, k read as DINOv3's rotate-half pairs")
    return interleave_qk(weights.state, attn.num_heads) if halves else weights.state


def _attention(block: nn.Module) -> ZooAttention:
    """A ZooVisionTransformer block's mechanism (its ``attn``: the model's attention spec built it)."""
    return cast(ZooAttention, block.attn)


def _projections(
    attn: ZooAttention,
    prefix: str,
    state: Mapping[str, torch.Tensor],
    source: str,
    used: Set[str],
    partial: List[str],
    identity: List[str],
) -> Dict[str, torch.Tensor]:
    """The mechanism's ``in_proj`` from timm's fused ``qkv`` (rows q | k | v, each ``num_heads`` heads in turn)."""
    rows = [QKV.index(p) for p in attn.projections]
    proj, out = attn.in_proj.proj, {}
    if attn.heads == "projected" and attn.attn_dim != proj.in_features:
        raise ValueError(
            f"init_from={source}: projected heads reproduce the checkpoint's q, k, v only when "
            f"num_heads x head_dim equals the width ({proj.in_features}); the model has "
            f"{attn.num_heads} x {attn.head_dim} = {attn.attn_dim}: leave head_dim unset (null)"
        )
    for kind in ("weight", "bias"):
        name = f"{prefix}.qkv.{kind}"
        if getattr(proj, kind) is None or name not in state:
            continue  # a bias on one side only differs in qkv_bias, which _check_architecture reports
        fused = state[name]
        if fused.shape[0] % 3:
            raise ValueError(
                f"init_from={source}: {name} has shape {tuple(fused.shape)}, not three stacked q, k, v "
                f"projections; give a timm VisionTransformer state dict"
            )
        parts = fused.chunk(3)
        out[f"{prefix}.in_proj.proj.{kind}"] = torch.cat([parts[r] for r in rows])
        used.add(name)
        if len(rows) < 3 and kind == "weight":
            partial.append(f"{prefix}.qkv (rows {', '.join(QKV[r] for r in range(3) if r not in rows)})")
    if attn.in_proj.head_weight is not None:
        head_weight = attn.in_proj.head_weight
        eye = torch.eye(head_weight.shape[1], dtype=head_weight.dtype, device=head_weight.device)
        out[f"{prefix}.in_proj.head_weight"] = eye.expand_as(head_weight)
        identity.append(f"{prefix}.in_proj.head_weight")
    return out


def _resample_embeddings(
    model: ZooVisionTransformer, weights: ViTWeights, mapped: Dict[str, torch.Tensor], notes: List[str]
) -> None:
    """Position embedding to the model's grid, patch embedding to its patch size and input channels (timm's way)."""
    patch = mapped.get("patch_embed.proj.weight")
    want = model.patch_embed.proj.weight.shape
    if patch is not None and patch.shape[-2:] != want[-2:]:
        mapped["patch_embed.proj.weight"] = patch = resample_patch_embed(patch, list(want[-2:]), **_RESAMPLE)
        notes.append(
            f"patch embedding {_size(weights.state['patch_embed.proj.weight'].shape[-2:])} -> {_size(want[-2:])}"
        )
    if patch is not None and patch.shape[1] != want[1]:
        try:
            mapped["patch_embed.proj.weight"] = adapt_input_conv(want[1], patch, base_chans=patch.shape[1])
        except NotImplementedError as err:
            raise ValueError(
                f"init_from={weights.source}: the patch embedding's {patch.shape[1]} input channels "
                f"cannot be adapted to the model's {want[1]} ({err}); build the model with "
                f"in_chans={patch.shape[1]}"
            ) from None
        notes.append(f"patch embedding {patch.shape[1]} -> {want[1]} input channels")
    pos = mapped.get("pos_embed")
    if pos is None:
        return
    prefix = 0 if model.no_embed_class else model.num_prefix_tokens
    tokens = pos.shape[1] - prefix
    reference: Any = weights.reference  # a ViT or ROPE-ViT (pretrained_sources)
    if reference is not None:
        old = tuple(reference.patch_embed.grid_size)
    else:  # a bare state dict: a square grid, as timm assumes
        side = math.isqrt(max(tokens, 0))
        old = (side, side)
    if old[0] * old[1] != tokens:
        raise ValueError(
            f"init_from={weights.source}: the position embedding has {pos.shape[1]} tokens, {prefix} "
            f"prefix + {tokens}, which is no {'x'.join(map(str, old))} grid; build the model with the "
            f"checkpoint's class_token / reg_tokens / no_embed_class"
        )
    new = tuple(model.patch_embed.grid_size)
    if old != new:
        mapped["pos_embed"] = resample_abs_pos_embed(
            pos, new_size=list(new), old_size=list(old), num_prefix_tokens=prefix, **_RESAMPLE
        )
        notes.append(f"position embedding {_size(old)} -> {_size(new)}")


def _check_leftovers(model: ZooVisionTransformer, source: str, new: List[str], unused: List[str]) -> None:
    """Only the mechanism's own tensors and the head may be new, only the head left unused."""
    own = re.compile(r"^blocks\.\d+\.attn\.(?!in_proj\.|proj\.|q_norm\.|k_norm\.|norm\.)")
    lacking = [name for name in new if not own.match(name) and not name.startswith("head.")]
    if lacking:
        raise ValueError(
            f"init_from={source}: the checkpoint has no {compact_names(lacking)}, which the model has; "
            f"build the model with the checkpoint's architecture"
        )
    has_q = "q" in _attention(model.blocks[0]).projections
    extra = [
        name
        for name in unused
        if not _MAY_BE_UNUSED.match(name) and not (not has_q and re.match(r"^blocks\.\d+\.attn\.[qk]_norm\.", name))
    ]
    if extra:
        raise ValueError(
            f"init_from={source}: the model has no place for the checkpoint's {compact_names(extra)}; "
            f"give a plain timm VisionTransformer or build the model with the checkpoint's architecture"
        )


def _hydra(value: Any) -> str:
    """A value as a Hydra override spells it."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def _size(size: Iterable[int]) -> str:
    return "x".join(str(int(s)) for s in size)


def compact_names(names: Iterable[str]) -> str:
    """Tensor names with block indices folded and leaves grouped: ``blocks.*.attn.dwc.{weight,bias}``."""
    groups: Dict[str, List[str]] = {}
    for name in names:
        stem, _, leaf = re.sub(r"^blocks\.\d+\.", "blocks.*.", name).rpartition(".")
        leaves = groups.setdefault(stem, [])
        if leaf not in leaves:
            leaves.append(leaf)
    if not groups:
        return "none"
    return ", ".join(
        (f"{stem}." if stem else "") + (leaves[0] if len(leaves) == 1 else "{" + ",".join(leaves) + "}")
        for stem, leaves in groups.items()
    )

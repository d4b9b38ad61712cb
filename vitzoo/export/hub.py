"""Export directories in timm's hub layout (``model.safetensors`` + ``config.json``) and loading them.

Weights and config are written by timm's public ``save_for_hf``, so ``timm.create_model('local-dir:<dir>',
pretrained=True)`` reads back exactly what was saved: the architecture, ``model_args`` (the full
attention spec as JSON, the model's shape, ``num_classes``) and ``pretrained_cfg`` (input size,
mean/std, interpolation). A ``vitzoo`` entry adds the weights' SHA-256 so corruption is caught, and the weights
file's metadata names the attention (``vitzoo_attention``), so a builder handed the file alone can check it.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any, Dict, Iterator, Mapping, Optional, Union

import timm
import torch.nn as nn
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from huggingface_hub import HfApi
from timm.models import save_for_hf

import vitzoo
from vitzoo.attention import SoftmaxAttention
from vitzoo.models.local_dir import (
    ATTENTION_KEY,
    CONFIG_NAME,
    WEIGHTS_NAME,
    check_export,
    file_sha256,
    verify_local_dir,
)
from vitzoo.models.registry import short_name
from vitzoo.models.vit import VIT_ARCHS

from .card import model_card, render_card

__all__ = [
    "export_model",
    "load_exported",
    "push_to_hub",
    "check_export",
    "verify_local_dir",
    "WEIGHTS_NAME",
    "CONFIG_NAME",
    "CARD_NAME",
]

CARD_NAME = "README.md"


def export_model(
    model: nn.Module,
    out_dir: Union[str, Path],
    head: bool = True,
    data_config: Optional[Mapping[str, Any]] = None,
    metrics: Optional[Mapping[str, Any]] = None,
    data: Optional[str] = None,
) -> Path:
    """Write ``model`` (built by ``vitzoo.create_model`` / ``timm.create_model``) to ``out_dir``: weights, config
    and a model card (README.md).

    ``head=False`` drops the classifier (``num_classes=0`` in the config, head weights removed).
    ``data_config`` sets preprocessing for ``pretrained_cfg`` (``input_size``/``img_size``,
    ``mean``, ``std``, ``interpolation``, ``crop_pct``); ``metrics`` and ``data`` (what it was trained on) go
    into the config's ``vitzoo`` entry and the card. Split-head softmax attention keeps timm's ``attn.qkv`` names,
    so plain timm loads those weights. The model itself is not modified.
    """
    if not getattr(model, "_model_args", None):
        raise ValueError(
            "the model carries no construction arguments; build it with vitzoo.create_model(...) "
            "or timm.create_model(...) so the export can record how to rebuild it"
        )
    if not head:
        headless: Any = copy.deepcopy(model)  # a timm model: reset_classifier is timm's
        headless.reset_classifier(0)
        model = headless
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(
            f"{out} is a file; the export is a folder (model.safetensors + config.json): pass a folder path"
        )
    info = {
        "version": vitzoo.__version__,
        **({"data": data} if data else {}),
        **({"metrics": dict(metrics)} if metrics else {}),
    }
    with _timm_attention_names(model):
        save_for_hf(
            model,
            str(out),
            model_config={"vitzoo": info},
            model_args=_pinned_args(model),
            safe_serialization=True,
            data_config=dict(data_config or {}),
        )
    weights, config_file = out / WEIGHTS_NAME, out / CONFIG_NAME
    _record_attention(model, weights)
    _chmod_like_a_new_file(weights)
    config = json.loads(config_file.read_text())
    config["vitzoo"]["weights_sha256"] = file_sha256(weights)
    config_file.write_text(json.dumps(config, indent=2))
    (out / CARD_NAME).write_text(render_card(model_card(config, out.resolve().name), out.resolve().name) + "\n")
    return out


def _record_attention(model: nn.Module, weights: Path) -> None:
    """The attention spec into the weights file's metadata, so that a loader handed the file alone (timm's
    ``pretrained_cfg_overlay=dict(file=...)``) can tell it from another mechanism's (``check_weights_attention``)."""
    if not type(model).__module__.startswith("vitzoo."):
        return
    spec = _pinned_args(model).get("attention", getattr(model, "_model_args", {}).get("attention", "softmax"))
    with safe_open(str(weights), framework="pt") as f:
        metadata = f.metadata() or {}
    save_file(load_file(str(weights)), str(weights), metadata={**metadata, ATTENTION_KEY: json.dumps(spec)})


@contextmanager
def _timm_attention_names(model: nn.Module) -> Iterator[None]:
    """While saving: split-head softmax layers give their ``in_proj.proj`` tensors timm's ``qkv`` names (the same
    tensors; ``ZooAttention`` reads either name back)."""

    def rename(module, state_dict, prefix, local_metadata):
        for kind in ("weight", "bias"):
            if f"{prefix}in_proj.proj.{kind}" in state_dict:
                state_dict[f"{prefix}qkv.{kind}"] = state_dict.pop(f"{prefix}in_proj.proj.{kind}")

    handles = [
        m.register_state_dict_post_hook(rename)
        for m in model.modules()
        if type(m) is SoftmaxAttention and m.heads == "split"
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def push_to_hub(
    export_dir: Union[str, Path],
    repo_id: str,
    token: Optional[str] = None,
    private: bool = False,
    commit_message: str = "Add model",
) -> Any:
    """Upload an export to the Hugging Face Hub as timm's ``push_to_hf_hub`` lays it out: the export's own weights
    file (its attention metadata included) and config, and its model card named after the repository (kept when
    the repository has a README.md already). Returns the hub's commit info."""
    config = check_export(export_dir)
    api = HfApi(token=token, library_name="timm", library_version=timm.__version__)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    has_readme = api.file_exists(repo_id=repo_id, filename=CARD_NAME)
    with TemporaryDirectory() as folder:
        for name in (WEIGHTS_NAME, CONFIG_NAME):
            shutil.copyfile(Path(export_dir) / name, Path(folder) / name)
        if not has_readme:
            name = repo_id.split("/")[-1]
            (Path(folder) / CARD_NAME).write_text(render_card(model_card(config, name), name) + "\n")
        return api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message)


def _pinned_args(model: Any) -> Dict[str, Any]:
    """Construction arguments that would otherwise come from defaults or from ``img_size``, written out so an
    export keeps computing the same function: the ViT shape, and the log-n scale's training token count
    (else a loader passing another ``img_size``, e.g. smp or mmseg, would rescale the logits)."""
    arch = short_name(model.pretrained_cfg.get("architecture") or "")
    args = {k: v for k, v in VIT_ARCHS.get(arch, {}).items() if k not in ("img_size", "num_classes")}
    args.update({k: v for k, v in model._model_args.items() if k in args})
    spec = model._model_args.get("attention")
    train_tokens = {m.train_tokens for m in model.modules() if getattr(m, "uses_log_n", False)}
    if spec is not None and len(train_tokens) == 1:  # ViTs; non-local stages each have their own grid
        spec = {"name": spec} if isinstance(spec, str) else dict(spec)
        args["attention"] = {**spec, "train_tokens": train_tokens.pop()}
    return args


def load_exported(export_dir: Union[str, Path], **kwargs) -> nn.Module:
    """Validate ``export_dir`` and build it via ``timm.create_model('local-dir:...', pretrained=True)``.

    kwargs go to timm, e.g. ``features_only=True`` or ``num_classes=21`` (a fresh head).
    """
    check_export(export_dir)
    return timm.create_model(f"local-dir:{Path(export_dir).resolve()}", pretrained=True, **kwargs)


def _chmod_like_a_new_file(path: Path) -> None:
    """safetensors writes through a private (0600) file; give it the mode any new file gets (0644 under umask 022)."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)

"""Export directories in timm's hub layout (``model.safetensors`` + ``config.json``) and loading them.

The config is written by timm's own ``save_config_for_hf``, so ``timm.create_model('local-dir:<dir>',
pretrained=True)`` reads back exactly what was saved: the architecture, ``model_args`` (the full
attention spec as JSON, the model's shape, ``num_classes``) and ``pretrained_cfg`` (input size,
mean/std, interpolation). A ``vitzoo`` entry adds the weights' SHA-256 so corruption is caught.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

import timm
import torch.nn as nn
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from timm.models._hub import save_config_for_hf

import vitzoo
from vitzoo.attention import resolve_attention

__all__ = ["export_model", "load_exported", "check_export", "verify_local_dir", "WEIGHTS_NAME", "CONFIG_NAME"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
_REEXPORT = "re-export it with `python -m vitzoo.export CKPT OUT`"


def export_model(model: nn.Module, out_dir: Union[str, Path], head: bool = True,
                 data_config: Optional[Mapping[str, Any]] = None) -> Path:
    """Write ``model`` (built by ``vitzoo.create_model`` / ``timm.create_model``) to ``out_dir``.

    ``head=False`` drops the classifier (``num_classes=0`` in the config, head weights removed).
    ``data_config`` sets preprocessing for ``pretrained_cfg`` (``input_size``/``img_size``,
    ``mean``, ``std``, ``interpolation``, ``crop_pct``). The model itself is not modified.
    """
    if not getattr(model, "_model_args", None):
        raise ValueError("the model carries no construction arguments; build it with vitzoo.create_model(...) "
                         "or timm.create_model(...) so the export can record how to rebuild it")
    if not head:
        model = copy.deepcopy(model)
        model.reset_classifier(0)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file; the export is a folder (model.safetensors + config.json): pass a "
                         f"folder path")
    out.mkdir(parents=True, exist_ok=True)
    weights = out / WEIGHTS_NAME
    save_file({k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, str(weights),
              metadata={"format": "pt"})
    _chmod_like_a_new_file(weights)
    info = {"version": vitzoo.__version__, "weights_sha256": _sha256(weights)}
    save_config_for_hf(model, str(out / CONFIG_NAME), model_config={"vitzoo": info},
                       model_args=_pinned_args(model), data_config=dict(data_config or {}))
    return out


def _pinned_args(model: nn.Module) -> Dict[str, Any]:
    """Construction arguments that would otherwise come from defaults or from ``img_size``, written out so an
    export keeps computing the same function: the ViT shape, and the log-n scale's training token count
    (else a loader passing another ``img_size``, e.g. smp or mmseg, would rescale the logits)."""
    from vitzoo.models.vit import VIT_ARCHS

    arch = model.pretrained_cfg.get("architecture")
    args = {k: v for k, v in VIT_ARCHS.get(arch, {}).items() if k not in ("img_size", "num_classes")}
    args.update({k: v for k, v in model._model_args.items() if k in args})
    spec = model._model_args.get("attention")
    train_tokens = {m.train_tokens for m in model.modules() if getattr(m, "uses_log_n", False)}
    if spec is not None and len(train_tokens) == 1:  # ViTs; non-local stages each have their own grid
        spec = {"name": spec} if isinstance(spec, str) else dict(spec)
        args["attention"] = {**spec, "train_tokens": train_tokens.pop()}
    return args


def verify_local_dir(pretrained: bool, pretrained_cfg: Any) -> None:
    """Called by the zoo's model builders: a ``local-dir:`` export is checked (checksum, config) before timm
    loads it, so a corrupted file fails with the same clear error as ``load_exported``."""
    cfg = pretrained_cfg.to_dict() if hasattr(pretrained_cfg, "to_dict") else pretrained_cfg
    if pretrained and isinstance(cfg, Mapping) and cfg.get("source") == "local-dir" and cfg.get("file"):
        check_export(cfg["file"])


def check_export(export_dir: Union[str, Path]) -> Dict[str, Any]:
    """Validate an export directory and return its parsed config; each problem is a one-line ValueError."""
    root = Path(export_dir)
    cfg_file, weights = root / CONFIG_NAME, root / WEIGHTS_NAME
    if not cfg_file.is_file() or not weights.is_file():
        missing = [p.name for p in (cfg_file, weights) if not p.is_file()]
        raise FileNotFoundError(f"{root} is not a vitzoo export (missing {', '.join(missing)}); "
                                f"create one with `python -m vitzoo.export CKPT {root}`")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e}); {_REEXPORT}") from None
    arch = cfg.get("architecture")
    if not isinstance(arch, str) or not timm.is_model(arch):
        raise ValueError(f"{cfg_file} names architecture {arch!r}, which is not registered; "
                         f"use one of {vitzoo.list_models()} or import the package that registers it")
    spec = cfg.get("model_args", {}).get("attention")
    if spec is not None:
        try:
            resolve_attention(spec)
        except ValueError as e:
            raise ValueError(f"{cfg_file}: {e} (edit model_args.attention, or upgrade vitzoo to a version "
                             f"that has it)") from None
    try:
        with safe_open(str(weights), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{weights} is truncated or corrupted ({e}); {_REEXPORT}") from None
    expected = cfg.get("vitzoo", {}).get("weights_sha256")
    if expected and _sha256(weights) != expected:
        raise ValueError(f"{weights} does not match the checksum in {CONFIG_NAME} (the file is corrupted "
                         f"or was replaced); {_REEXPORT}")
    return cfg


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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

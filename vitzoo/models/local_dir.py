"""Checks on an export directory in timm's hub layout (``model.safetensors`` + ``config.json``).

Here, beside the model builders that verify a ``local-dir:`` source before timm loads it, so that
models/ never imports export/ (which writes these directories and imports models/).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

import timm
from safetensors import SafetensorError, safe_open

from vitzoo.attention.stack import check_attention

__all__ = [
    "check_export",
    "verify_local_dir",
    "check_weights_attention",
    "weights_attention",
    "file_sha256",
    "WEIGHTS_NAME",
    "CONFIG_NAME",
    "ATTENTION_KEY",
    "REEXPORT_HINT",
]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
ATTENTION_KEY = "vitzoo_attention"  # the weights file's metadata entry: the attention spec as JSON
REEXPORT_HINT = "re-export it with `python -m vitzoo.export CKPT OUT`"


def verify_local_dir(
    pretrained: bool, pretrained_cfg: Any, overlay: Optional[Mapping[str, Any]] = None, attention: Any = None
) -> None:
    """Called by the zoo's model builders: a ``local-dir:`` export is checked (checksum, config) before timm
    loads it, so a corrupted file fails with the same clear error as ``load_exported``; with ``attention`` (the
    spec being built), weights that name another attention (:func:`check_weights_attention`) are refused."""
    cfg = pretrained_cfg.to_dict() if hasattr(pretrained_cfg, "to_dict") else pretrained_cfg
    cfg = {**(cfg if isinstance(cfg, Mapping) else {}), **(overlay or {})}
    if not pretrained or not cfg.get("file"):
        return
    if cfg.get("source") == "local-dir":
        check_export(cfg["file"])
    if attention is not None:
        check_weights_attention(Path(cfg["file"]), attention)


def weights_attention(path: Path) -> Any:
    """The attention spec a weights file was exported with: its safetensors metadata (``vitzoo_attention``), else
    the ``config.json`` beside it (exports written before the metadata); None when neither says."""
    if path.is_dir():
        path = path / WEIGHTS_NAME
    if path.suffix == ".safetensors" and path.is_file():
        try:
            with safe_open(str(path), framework="pt") as f:
                stored = (f.metadata() or {}).get(ATTENTION_KEY)
        except (SafetensorError, OSError):
            return None  # timm's loader reports the damaged file
        if stored is not None:
            return json.loads(stored)
    config = path.parent / CONFIG_NAME
    if path.name == WEIGHTS_NAME and config.is_file():
        try:
            return json.loads(config.read_text(encoding="utf-8")).get("model_args", {}).get("attention")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            return None
    return None


def check_weights_attention(path: Path, attention: Any) -> None:
    """Weights exported with another mechanism than ``attention`` are one ValueError naming ``local-dir:``; the
    same mechanism with other options is one warning (the weights fit; the function may differ)."""
    stored = weights_attention(path)
    if stored is None or _canonical(stored) == _canonical(attention):
        return
    folder = path if path.is_dir() else path.parent
    load = f"timm.create_model('local-dir:{folder}', pretrained=True) builds the attention its config.json names"
    if _mechanisms(stored) != _mechanisms(attention):
        raise ValueError(
            f"{path} holds weights of attention {_show(stored)}, not the {_show(attention)} this model is built "
            f"with; {load} (or pass attention={_show(stored)})"
        )
    warnings.warn(
        f"{path} was exported with attention {_show(stored)}; this model is built with {_show(attention)} "
        f"(the weights fit; {load})",
        UserWarning,
        stacklevel=4,
    )


def _canonical(spec: Any) -> Any:
    """A spec as one form: a name as ``{"name": ...}``, without the token count an export pins."""
    if isinstance(spec, str):
        return {"name": spec}
    if isinstance(spec, (list, tuple)):
        return [_canonical(s) for s in spec]
    if isinstance(spec, Mapping):
        return {k: _canonical(v) if ":" in str(k) else v for k, v in spec.items() if k != "train_tokens"}
    return spec


def _mechanisms(spec: Any) -> list:
    """The mechanism names of a spec, one per spec in a stack (a list, or block slices such as ``":6"``)."""
    if isinstance(spec, str):
        return [spec]
    if isinstance(spec, (list, tuple)):
        return [n for s in spec for n in _mechanisms(s)]
    if isinstance(spec, Mapping):
        if "name" in spec:
            return [spec["name"]]
        return [n for k, v in spec.items() if ":" in str(k) for n in _mechanisms(v)]
    return []


def _show(spec: Any) -> str:
    spec = _canonical(spec)
    return repr(spec["name"]) if isinstance(spec, dict) and list(spec) == ["name"] else json.dumps(spec)


def check_export(export_dir: Union[str, Path]) -> Dict[str, Any]:
    """Validate an export directory and return its parsed config; each problem is a one-line ValueError."""
    root = Path(export_dir)
    cfg_file, weights = root / CONFIG_NAME, root / WEIGHTS_NAME
    if not cfg_file.is_file() or not weights.is_file():
        missing = [p.name for p in (cfg_file, weights) if not p.is_file()]
        raise FileNotFoundError(
            f"{root} is not a vitzoo export (missing {', '.join(missing)}); "
            f"create one with `python -m vitzoo.export CKPT {root}`"
        )
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{cfg_file} is not valid JSON ({e}); {REEXPORT_HINT}") from None
    arch = cfg.get("architecture")
    if not isinstance(arch, str) or not timm.is_model(arch):
        raise ValueError(
            f"{cfg_file} names architecture {arch!r}, which is not registered; use one of "
            f"vitzoo.list_models() or import the package that registers it"
        )
    spec = cfg.get("model_args", {}).get("attention")
    if spec is not None:
        try:
            check_attention(spec)
        except ValueError as e:
            raise ValueError(
                f"{cfg_file}: {e} (edit model_args.attention, or upgrade vitzoo to a version that has it)"
            ) from None
    try:
        with safe_open(str(weights), framework="pt") as f:
            f.keys()
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{weights} is truncated or corrupted ({e}); {REEXPORT_HINT}") from None
    expected = cfg.get("vitzoo", {}).get("weights_sha256")
    if expected and file_sha256(weights) != expected:
        raise ValueError(
            f"{weights} does not match the checksum in {CONFIG_NAME} (the file is corrupted "
            f"or was replaced); {REEXPORT_HINT}"
        )
    return cfg


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

"""Checks on an export directory in timm's hub layout (``model.safetensors`` + ``config.json``).

Here, beside the model builders that verify a ``local-dir:`` source before timm loads it, so that
models/ never imports export/ (which writes these directories and imports models/).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Dict, Mapping, Union

import timm
from safetensors import SafetensorError, safe_open

from vitzoo.attention.stack import check_attention

__all__ = ["check_export", "verify_local_dir", "file_sha256", "WEIGHTS_NAME", "CONFIG_NAME", "REEXPORT_HINT"]

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"
REEXPORT_HINT = "re-export it with `python -m vitzoo.export CKPT OUT`"


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

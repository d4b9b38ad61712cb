"""Training checkpoint (Lightning ``.ckpt`` from train.py) -> an export directory.

The network and its preprocessing come from the checkpoint's hyperparameters through the
pipeline's own loader (``vitzoo.training.evaluate.load_classifier``, ``weights_only=True``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional, Tuple, Union

import yaml
from timm.layers import to_2tuple

from .hub import export_model

__all__ = ["export_checkpoint", "run_metrics"]


def export_checkpoint(ckpt: Union[str, Path], out_dir: Union[str, Path], head: bool = True) -> Path:
    """Turn a training checkpoint into ``out_dir``; ``head=False`` drops the classifier. Returns ``out_dir``.
    The model card names the data and metrics of the checkpoint's run (when it still sits in its run folder)."""
    from vitzoo.training.evaluate import load_classifier, read_checkpoint  # Lightning: only when a checkpoint is read

    model, hparams = load_classifier(ckpt)
    data_config = {"input_size": (hparams.get("in_chans", 3), *to_2tuple(hparams["img_size"]))}
    data_config.update({k: tuple(hparams[k]) for k in ("mean", "std") if hparams.get(k) is not None})
    metrics, data = run_metrics(read_checkpoint(ckpt), Path(ckpt).resolve().parent.parent)
    return export_model(model, out_dir, head=head, data_config=data_config, metrics=metrics, data=data)


def run_metrics(checkpoint: Dict[str, Any], run_dir: Path) -> Tuple[Dict[str, Any], Optional[str]]:
    """(metrics, data module name) of a checkpoint: its epoch and step and its ModelCheckpoint's best score, with the
    validation and test metrics of the run's metrics.json and the data of its .hydra/config.yaml when present."""
    metrics: Dict[str, Any] = {"epochs": checkpoint.get("epoch", -1) + 1, "global_step": checkpoint.get("global_step")}
    for state in (checkpoint.get("callbacks") or {}).values():
        if isinstance(state, dict) and state.get("monitor") and state.get("best_model_score") is not None:
            metrics[f"best {state['monitor']}"] = round(float(state["best_model_score"]), 4)
    if (run_dir / "metrics.json").is_file():
        found = json.loads((run_dir / "metrics.json").read_text())
        metrics.update(
            {k: round(v, 4) for k, v in found.items() if k.startswith(("val/", "test/")) and isinstance(v, float)}
        )
    config = run_dir / ".hydra" / "config.yaml"
    target = (yaml.safe_load(config.read_text()) or {}).get("data", {}).get("_target_") if config.is_file() else None
    return metrics, str(target).rsplit(".", 1)[-1].removesuffix("DataModule") if target else None

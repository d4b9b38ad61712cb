"""Checkpoint loading (``weights_only=True``) and plain evaluation of a model on a dataloader."""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from .module import build_model

__all__ = ["read_checkpoint", "load_classifier", "evaluate", "run_record"]

_REQUIRED = ("arch", "attention", "num_classes", "img_size")


def read_checkpoint(path: Union[str, os.PathLike]) -> Dict[str, Any]:
    """A Lightning checkpoint as a dict, unpickled with ``weights_only=True`` (no arbitrary code)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        found = sorted(p.name for p in Path(path).glob("*.ckpt"))
        raise ValueError(
            f"checkpoint {path!r} is a folder; pass one checkpoint file"
            + (f" in it: {', '.join(found[:5])}" if found else ", e.g. <run>/checkpoints/last.ckpt")
        )
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"checkpoint {path!r} does not exist; pass a .ckpt written by train.py, "
            f"e.g. logs/train/runs/<date>/checkpoints/last.ckpt"
        )
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        if not zipfile.is_zipfile(path):
            reason = "not a torch.save archive"
        else:  # a real archive holding something other than tensors and plain values, or damaged inside
            reason = next(
                (line.strip() for line in str(err).splitlines() if "Unsupported global" in line),
                f"{type(err).__name__}",
            )
        raise ValueError(
            f"checkpoint {path!r} is not readable ({reason}); the file is corrupted or not a torch "
            f"checkpoint: use another .ckpt written by train.py"
        ) from None
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise ValueError(f"checkpoint {path!r} holds no 'state_dict'; pass a Lightning .ckpt written by train.py")
    return checkpoint


def run_record(ckpt_path: str, name: str) -> Optional[Path]:
    """``.hydra/<name>`` (config.yaml, overrides.yaml) of the train.py run a checkpoint was written by
    (``<run>/checkpoints/<file>.ckpt``), or None when the checkpoint no longer sits in its run directory."""
    path = Path(ckpt_path).resolve().parent.parent / ".hydra" / name
    return path if path.is_file() else None


def load_classifier(path: Union[str, os.PathLike]) -> Tuple[nn.Module, Dict[str, Any]]:
    """(network in eval mode, hyperparameters) from a checkpoint written by train.py.

    The hyperparameters hold what the input pipeline needs: ``img_size``, ``mean``, ``std``.
    """
    checkpoint = read_checkpoint(path)
    hparams = dict(checkpoint.get("hyper_parameters") or {})
    missing = [k for k in _REQUIRED if k not in hparams]
    if missing:
        raise ValueError(
            f"checkpoint {os.fspath(path)!r} lacks hyperparameters {missing}; it was not written by vitzoo's train.py"
        )
    prefix = "model."
    state = {k[len(prefix) :]: v for k, v in checkpoint["state_dict"].items() if k.startswith(prefix)}
    try:
        model = build_model(hparams)
        model.load_state_dict(state)
    except (TypeError, ValueError, RuntimeError) as err:  # ValueError: create_model's unknown keyword
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        detail = lines[1] if len(lines) > 1 and type(err) is RuntimeError else lines[0] if lines else type(err).__name__
        detail = detail.split("; ")[0]  # the cause, not the fix meant for a config
        raise ValueError(
            f"checkpoint {os.fspath(path)!r}: its weights do not fit the architecture it names "
            f"({hparams['arch']}, attention {hparams['attention']}): {detail[:200]}; the checkpoint was "
            f"edited or mixes two models, use the .ckpt train.py wrote for that run"
        ) from None
    return model.eval(), hparams


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader,
    device: Optional[torch.device] = None,
    preprocess: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
) -> Dict[str, float]:
    """Top-1 / top-5 accuracy and mean cross-entropy of ``model`` over ``loader`` (torchmetrics, as the training
    module counts them).

    ``preprocess`` maps each image batch (already on ``device``) before the forward pass, e.g.
    a corruption followed by normalisation when the loader yields [0, 1] images.
    """
    device = torch.device(device) if device is not None else next(model.parameters()).device
    was_training = model.training
    model.eval()
    metrics: Optional[MetricCollection] = None
    loss = MeanMetric().to(device)
    try:
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            if preprocess is not None:
                images = preprocess(images)
            logits = model(images).float()
            if metrics is None:
                classes = logits.shape[-1]
                metrics = MetricCollection(
                    {f"acc{k}": MulticlassAccuracy(classes, top_k=min(k, classes), average="micro") for k in (1, 5)}
                ).to(device)
            metrics.update(logits, labels)
            loss.update(F.cross_entropy(logits, labels, reduction="none"))
    finally:
        model.train(was_training)
    if metrics is None:
        raise ValueError("the dataloader yielded no images")
    counted = int(loss.weight)
    return {**{k: float(v) for k, v in metrics.compute().items()}, "loss": float(loss.compute()), "num_images": counted}

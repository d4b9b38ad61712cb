"""Training checkpoint (Lightning ``.ckpt`` from train.py) -> an export directory.

The network and its preprocessing come from the checkpoint's hyperparameters through the
pipeline's own loader (``vitzoo.training.evaluate.load_classifier``, ``weights_only=True``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Union

from timm.layers import to_2tuple

from .hub import export_model

__all__ = ["export_checkpoint"]


def export_checkpoint(ckpt: Union[str, Path], out_dir: Union[str, Path], head: bool = True) -> Path:
    """Turn a training checkpoint into ``out_dir``; ``head=False`` drops the classifier. Returns ``out_dir``."""
    from vitzoo.training.evaluate import load_classifier  # imports Lightning: only when a checkpoint is read

    model, hparams = load_classifier(ckpt)
    data_config = {"input_size": (hparams.get("in_chans", 3), *to_2tuple(hparams["img_size"]))}
    data_config.update({k: tuple(hparams[k]) for k in ("mean", "std") if hparams.get(k) is not None})
    return export_model(model, out_dir, head=head, data_config=data_config)

"""Lightning callback: export the best checkpoint when training ends."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Union

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from .checkpoint import export_checkpoint

__all__ = ["ExportBestCallback"]


class ExportBestCallback(pl.Callback):
    """At the end of ``fit``, export the ``ModelCheckpoint``'s best (else last) checkpoint.

    ``dirpath`` defaults to ``<trainer.default_root_dir>/export`` (the run directory); ``head=False`` drops the
    classifier.
    The exported path is kept in ``export_dir``.
    """

    def __init__(self, dirpath: Optional[Union[str, Path]] = None, head: bool = True):
        self.dirpath, self.head = dirpath, head
        self.export_dir: Optional[Path] = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        ckpt_cb = trainer.checkpoint_callback
        ckpt = (ckpt_cb.best_model_path or ckpt_cb.last_model_path) if isinstance(ckpt_cb, ModelCheckpoint) else None
        if not ckpt:
            rank_zero_warn(
                "ExportBestCallback: no checkpoint was saved, nothing to export; "
                "enable a ModelCheckpoint callback (trainer.enable_checkpointing=true)"
            )
            return
        out = Path(self.dirpath) if self.dirpath else Path(trainer.default_root_dir) / "export"
        self.export_dir = export_checkpoint(ckpt, out, head=self.head)
        rank_zero_info(f"exported {ckpt} -> {self.export_dir}")

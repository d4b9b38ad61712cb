"""What a checkpoint must carry besides weights, optimiser and schedule for a resumed run to equal an
uninterrupted one: the random generators (dropout, drop-path, mixup draw from them), the part of the
epoch's training metrics already accumulated when it stopped mid-epoch, and the training loader's position
(:class:`~vitzoo.data.sampling.ResumableLoader`).
"""

from __future__ import annotations

import random
from typing import Any, Dict, Optional

import lightning as L
import numpy as np
import torch
from torchmetrics import Metric

from ..data.sampling import ResumableLoader

__all__ = ["ExactResume", "random_states", "set_random_states"]


def random_states() -> Dict[str, Any]:
    """The state of every global generator: Python's, NumPy's, torch's CPU and CUDA ones (tensors and
    Python numbers only, so a ``weights_only`` load reads them)."""
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": pos, "has_gauss": has_gauss, "gauss": gauss},
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else [],
    }


def set_random_states(states: Dict[str, Any]) -> None:
    """Put back what :func:`random_states` returned."""
    random.setstate(states["python"])
    numpy = states["numpy"]
    np.random.set_state(
        ("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"], numpy["gauss"])
    )
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class ExactResume(L.LightningModule):
    """A LightningModule base whose checkpoints carry the random generators, the position of a
    :class:`ResumableLoader` and, saved mid-epoch, the state of the ``train``-prefixed torchmetrics (the
    epoch's accumulation so far); all put back when training starts, after Lightning and the data have set
    themselves up, just before the first resumed batch is drawn."""

    def _train_metrics(self) -> Dict[str, Metric]:
        return {name: m for name, m in self.named_modules() if isinstance(m, Metric) and name.startswith("train")}

    def _train_loader(self) -> Optional[ResumableLoader]:
        """The training loader if it is resumable: a :class:`ResumableLoader`, or another loader with its
        ``mid_epoch``, ``state_dict`` and ``load_state_dict`` (``data=shards``' litdata loader)."""
        loader = self.trainer.train_dataloader if self._trainer is not None else None
        return loader if isinstance(loader, ResumableLoader) or hasattr(loader, "mid_epoch") else None

    def on_save_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        checkpoint["random_states"] = random_states()
        loader = self._train_loader()
        if loader is None:
            return
        checkpoint["train_loader"] = loader.state_dict()
        if loader.mid_epoch():  # after the epoch's last batch, its metrics are the finished epoch's
            checkpoint["train_metric_states"] = {
                name: {
                    "state": {k: v.clone() if torch.is_tensor(v) else list(v) for k, v in m.metric_state.items()},
                    "updates": m._update_count,
                }
                for name, m in self._train_metrics().items()
            }

    def on_load_checkpoint(self, checkpoint: Dict[str, Any]) -> None:
        keys = ("random_states", "train_metric_states", "train_loader")
        self._resume_states = {key: checkpoint.get(key) for key in keys}

    def on_train_start(self) -> None:
        saved = getattr(self, "_resume_states", None)
        if saved is None:
            return
        del self._resume_states
        if saved["random_states"] is not None:
            set_random_states(saved["random_states"])
        loader = self._train_loader()
        if saved["train_loader"] is not None and loader is not None:
            loader.load_state_dict(saved["train_loader"])
        metrics = self._train_metrics()
        for name, entry in (saved["train_metric_states"] or {}).items():
            if name in metrics:
                for key, value in entry["state"].items():
                    setattr(metrics[name], key, value.to(self.device) if torch.is_tensor(value) else value)
                metrics[name]._update_count = entry["updates"]

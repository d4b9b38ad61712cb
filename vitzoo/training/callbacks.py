"""Training callbacks of the zoo."""

from __future__ import annotations

from typing import Any, Dict, Optional

import lightning as L
import torch

from vitzoo.diagnostics import attention_entropy

__all__ = ["AttentionEntropy"]


class AttentionEntropy(L.Callback):
    """Log each attention layer's mean normalised entropy (H / log n) at init and after every validation epoch.

    Measured on the first ``num_images`` val images (the same ones every time; at native resolution those of the
    first one's size), logged as
    ``entropy/<layer name>``; 1 means uniform attention, 0 one-hot. The values of the untrained
    network go to the logger at step 0 as ``entropy_init/<layer name>`` and are kept in
    ``initial`` (saved in checkpoints, so a resumed run still knows them).
    """

    def __init__(self, num_images: int = 32, max_queries: Optional[int] = 256):
        self.num_images, self.max_queries = num_images, max_queries
        self.initial: Dict[str, float] = {}
        self._images: Optional[torch.Tensor] = None

    def _measure(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Dict[str, float]:
        if self._images is None:
            if trainer.datamodule.val_dataset is None:
                trainer.datamodule.setup("validate")
            dataset = trainer.datamodule.val_dataset
            images = [dataset[i][0] for i in range(min(self.num_images, len(dataset)))]
            self._images = torch.stack([image for image in images if image.shape == images[0].shape])
        return attention_entropy(pl_module.model, self._images.to(pl_module.device), self.max_queries)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.initial or trainer.global_step > 0:
            return
        self.initial = self._measure(trainer, pl_module)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({f"entropy_init/{name}": value for name, value in self.initial.items()}, step=0)

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        entropy = self._measure(trainer, pl_module)
        pl_module.log_dict({f"entropy/{name}": value for name, value in entropy.items()}, sync_dist=True)

    def state_dict(self) -> Dict[str, Any]:
        return {"initial": dict(self.initial)}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.initial = dict(state_dict.get("initial", {}))

"""Training callbacks of the zoo."""
from __future__ import annotations

from typing import Optional

import lightning as L
import torch

from vitzoo.diagnostics import attention_entropy

__all__ = ["AttentionEntropy"]


class AttentionEntropy(L.Callback):
    """Log each attention layer's mean normalised entropy (H / log n) after every validation epoch.

    Measured on the first ``num_images`` val images (the same ones every epoch), logged as
    ``entropy/<layer name>``; 1 means uniform attention, 0 one-hot.
    """

    def __init__(self, num_images: int = 32, max_queries: Optional[int] = 256):
        self.num_images, self.max_queries = num_images, max_queries
        self._images: Optional[torch.Tensor] = None

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        if self._images is None:
            dataset = trainer.datamodule.val_dataset
            self._images = torch.stack([dataset[i][0] for i in range(min(self.num_images, len(dataset)))])
        entropy = attention_entropy(pl_module.model, self._images.to(pl_module.device), self.max_queries)
        pl_module.log_dict({f"entropy/{name}": value for name, value in entropy.items()})

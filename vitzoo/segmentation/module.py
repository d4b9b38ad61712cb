"""LightningModule: fine-tune a backbone (usually an export) with ``MLPDecoder`` for semantic segmentation."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

import lightning as L
import torch
import torch.nn.functional as F
from timm.optim import param_groups_weight_decay
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassJaccardIndex

from vitzoo.attention import AttentionSpec
from vitzoo.training.optim import build_scheduler

from .model import SegmentationNet, create_backbone

__all__ = ["SegmentationModule"]


def _metrics(num_classes: int, ignore_index: int) -> MetricCollection:
    return MetricCollection({
        "miou": MulticlassJaccardIndex(num_classes, average="macro", ignore_index=ignore_index),
        "pixel_acc": MulticlassAccuracy(num_classes, average="micro", ignore_index=ignore_index),
    })


class SegmentationModule(L.LightningModule):
    """Per-pixel cross-entropy on ``(images in [0, 1], masks)`` batches; logs mIoU and pixel accuracy.

    ``backbone``: an export directory (``python -m vitzoo.export ... --no-head``) or an
    architecture name (then ``attention`` / ``model_kwargs`` apply). ``out_indices`` picks the
    feature levels (default: the backbone's own, e.g. 4 blocks spread over a ViT's depth). The
    backbone learns at ``lr * backbone_lr_ratio``; AdamW with warmup + cosine, stepped per batch.
    """

    def __init__(self, backbone: str, num_classes: int, attention: Optional[AttentionSpec] = None,
                 model_kwargs: Optional[Mapping[str, Any]] = None, out_indices: Optional[Sequence[int]] = None,
                 decoder_channels: int = 128, dropout: float = 0.1, lr: float = 1e-3, backbone_lr_ratio: float = 0.1,
                 weight_decay: float = 0.01, warmup_epochs: float = 1.0, min_lr_ratio: float = 0.01,
                 ignore_index: int = 255):
        super().__init__()
        self.save_hyperparameters()
        encoder = create_backbone(backbone, attention, out_indices, model_kwargs)
        self.net = SegmentationNet(encoder, num_classes, decoder_channels, dropout)
        self.val_metrics = _metrics(num_classes, ignore_index).clone(prefix="val/")
        self.test_metrics = _metrics(num_classes, ignore_index).clone(prefix="test/")

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def _loss(self, logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, masks, ignore_index=self.hparams.ignore_index)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, masks = batch
        loss = self._loss(self(images), masks)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(images))
        return loss

    def _eval_step(self, batch, metrics: MetricCollection, stage: str) -> None:
        images, masks = batch
        logits = self(images)
        self.log(f"{stage}/loss", self._loss(logits, masks), on_epoch=True, batch_size=len(images), sync_dist=True)
        metrics.update(logits, masks)
        self.log_dict(metrics, on_epoch=True, prog_bar=stage == "val")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics, "test")

    def configure_optimizers(self):
        hp = self.hparams
        groups = []
        for part, ratio in ((self.net.backbone, hp.backbone_lr_ratio), (self.net.decoder, 1.0)):
            groups += [{**g, "lr": hp.lr * ratio} for g in param_groups_weight_decay(part, hp.weight_decay)]
        optimizer = torch.optim.AdamW(groups, lr=hp.lr)
        total = int(self.trainer.estimated_stepping_batches)
        epochs = self.trainer.max_epochs
        if not epochs or epochs < 1:
            raise ValueError("the LR schedule is defined in epochs; set trainer.max_epochs (>= 1)")
        scheduler = build_scheduler(optimizer, total, round(hp.warmup_epochs * total / epochs), hp.min_lr_ratio)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

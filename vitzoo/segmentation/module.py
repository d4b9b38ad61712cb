"""LightningModule: fine-tune a backbone (usually an export) with ``MLPDecoder`` for semantic segmentation."""

from __future__ import annotations

import logging
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple, Union

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.optim import param_groups_weight_decay
from torchmetrics.classification import MulticlassConfusionMatrix

from vitzoo.attention import AttentionSpec
from vitzoo.options import SegmentationDataOptions, SegmentationOptions
from vitzoo.training.optim import build_scheduler

from .inference import sliding_window_probs
from .labels import check_class_names
from .losses import SegmentationLoss, balanced_class_weights
from .model import SegmentationNet, create_backbone
from .scores import format_scores, segmentation_scores

__all__ = ["SegmentationModule"]

log = logging.getLogger(__name__)


class SegmentationModule(L.LightningModule):
    """Per-pixel ``loss`` (``ce|dice|focal|lovasz|ce+dice``, ``SegmentationLoss``) on ``(images in [0, 1], masks)``
    batches, with ``class_weights`` (a list, or ``balanced``: inverse pixel frequency of the training masks, read
    from the data module's histogram at setup); the start-up log states both.

    ``backbone``: an export directory (``python -m vitzoo.export ... --no-head``) or an
    architecture name (then ``attention`` / ``model_kwargs`` apply). ``out_indices`` picks the
    feature levels (default: the backbone's own, e.g. 4 blocks spread over a ViT's depth); ``neck=simple_fpn``
    builds ViTDet's pyramid from a plain ViT's last level instead, ``decoder=unet`` decodes a pyramid's levels
    with smp's U-Net decoder up to stride 1 (``unet+stem``: a pixel stem at stride 2 too; ``SegmentationNet``). The
    backbone learns at ``lr * backbone_lr_ratio``; AdamW with warmup + cosine, stepped per batch.

    Validation and test take one image at its native size (``sliding_window_probs`` with ``window``, the
    training crop, ``overlap`` and ``flip``) and log ``segmentation_scores`` under ``val/`` / ``test/``: IoU and
    Dice per class named by ``class_names`` (``val/iou/<name>``), their means, pixel accuracy, and the same for
    predicting the majority class everywhere (``val/majority/...``). The end of ``fit`` logs the last
    validation's scores as one line (``format_scores``). The defaults of its options are
    :class:`~vitzoo.options.SegmentationOptions`'.
    """

    def __init__(
        self,
        backbone: str,
        num_classes: int,
        class_names: Optional[Sequence[str]] = None,
        attention: Optional[AttentionSpec] = SegmentationOptions.attention,
        model_kwargs: Optional[Mapping[str, Any]] = SegmentationOptions.model_kwargs,
        out_indices: Optional[Sequence[int]] = SegmentationOptions.out_indices,
        decoder_channels: int = SegmentationOptions.decoder_channels,
        dropout: float = SegmentationOptions.dropout,
        lr: float = SegmentationOptions.lr,
        backbone_lr_ratio: float = SegmentationOptions.backbone_lr_ratio,
        weight_decay: float = SegmentationOptions.weight_decay,
        warmup_epochs: float = SegmentationOptions.warmup_epochs,
        min_lr_ratio: float = SegmentationOptions.min_lr_ratio,
        ignore_index: int = SegmentationDataOptions.ignore_index,
        in_chans: int = SegmentationDataOptions.in_chans,
        window: Optional[Union[int, Sequence[int]]] = None,
        overlap: float = SegmentationOptions.overlap,
        flip: bool = SegmentationOptions.flip,
        loss: str = SegmentationOptions.loss,
        class_weights: Optional[Union[str, Sequence[float]]] = SegmentationOptions.class_weights,
        neck: Optional[str] = SegmentationOptions.neck,
        decoder: str = SegmentationOptions.decoder,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.class_names = check_class_names(class_names, num_classes)
        self.last_validation: Optional[Tuple[int, Dict[str, float]]] = None  # (epoch, scores), for on_fit_end
        balanced = class_weights == "balanced"
        self.criterion = SegmentationLoss(loss, num_classes, ignore_index, None if balanced else class_weights)
        encoder = create_backbone(backbone, attention, out_indices, model_kwargs, in_chans)
        self.net = SegmentationNet(encoder, num_classes, decoder_channels, dropout, neck, decoder)
        self.confusion = nn.ModuleDict(
            {stage: MulticlassConfusionMatrix(num_classes, ignore_index=ignore_index) for stage in ("val", "test")}
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def predict_probs(self, image: torch.Tensor) -> torch.Tensor:
        """(C, H, W) image of any size -> (num_classes, H, W) probabilities (``window``, ``overlap``, ``flip``)."""
        hp = self.hparams
        return sliding_window_probs(self.net, image, hp.window, hp.overlap, hp.flip)

    def setup(self, stage: str) -> None:
        if stage != "fit":
            return
        hp = self.hparams
        weights = "none"
        if hp.class_weights == "balanced":
            counts = getattr(getattr(self.trainer, "datamodule", None), "class_pixels", {}).get("train")
            if counts is None:
                raise ValueError(
                    "module.class_weights=balanced reads the training masks' histogram from a "
                    "SegmentationDataModule; train with one or give a list of weights"
                )
            values = balanced_class_weights(counts, hp.num_classes)
            self.criterion = SegmentationLoss(hp.loss, hp.num_classes, hp.ignore_index, values)
            weights = "balanced (inverse pixel frequency of the training masks): " + _named(values, self.class_names)
        elif hp.class_weights is not None:
            weights = _named(hp.class_weights, self.class_names)
        log.info("loss: %s, class weights %s", hp.loss, weights)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, masks = batch
        loss = self.criterion(self(images), masks)
        self.log("train/loss", loss, on_step=True, on_epoch=True, prog_bar=True, batch_size=len(images))
        return loss

    def _eval_step(self, batch, stage: str) -> None:
        images, masks = batch
        probs = torch.stack([self.predict_probs(image) for image in images])
        loss = F.nll_loss(probs.clamp_min(1e-8).log(), masks, ignore_index=self.hparams.ignore_index)
        self.log(f"{stage}/loss", loss, on_epoch=True, batch_size=len(images), sync_dist=True)
        self.confusion[stage].update(probs.argmax(1), masks)

    def _log_scores(self, stage: str) -> Dict[str, float]:
        scores = segmentation_scores(self.confusion[stage].compute(), self.class_names)
        self.confusion[stage].reset()
        self.log(f"{stage}/miou", scores["miou"], prog_bar=stage == "val")
        self.log_dict({f"{stage}/{name}": value for name, value in scores.items() if name != "miou"})
        return scores

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        scores = self._log_scores("val")
        if not self.trainer.sanity_checking:
            self.last_validation = self.current_epoch, scores

    def on_fit_end(self) -> None:
        if self.last_validation is not None and self.trainer.is_global_zero:
            epoch, scores = self.last_validation
            log.info("validation after epoch %d: %s", epoch, format_scores(scores))

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self._log_scores("test")

    def configure_optimizers(self):
        hp = self.hparams
        groups = []
        head = [m for m in (self.net.neck, self.net.decoder) if m is not None]
        for part, ratio in ((self.net.backbone, hp.backbone_lr_ratio), (nn.ModuleList(head), 1.0)):
            groups += [{**g, "lr": hp.lr * ratio} for g in param_groups_weight_decay(part, hp.weight_decay)]
        optimizer = torch.optim.AdamW(groups, lr=hp.lr)
        total = int(self.trainer.estimated_stepping_batches)
        epochs = self.trainer.max_epochs
        if not epochs or epochs < 1:
            raise ValueError("the LR schedule is defined in epochs; set trainer.max_epochs (>= 1)")
        scheduler = build_scheduler(optimizer, total, round(hp.warmup_epochs * total / epochs), hp.min_lr_ratio)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def _named(weights: Sequence[float], names: Sequence[str]) -> str:
    return ", ".join(f"{name} {float(w):.3g}" for name, w in zip(names, weights))

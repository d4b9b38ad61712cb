"""The LightningModule: a zoo model, AdamW + warmup/cosine, label smoothing, mixup/cutmix, top-1/top-5."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, List, Mapping, Optional, Sequence, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.data import Mixup
from timm.loss import SoftTargetCrossEntropy
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy

import vitzoo

from .optim import build_optimizer, build_scheduler, scaled_lr
from .options import ClassifierOptions, MixupOptions, OptimOptions, options_from
from .resume import ExactResume

__all__ = ["ImageClassifier", "build_model"]

log = logging.getLogger(__name__)


def build_model(hparams: Mapping[str, Any]) -> nn.Module:
    """The network described by a classifier's hyperparameters (also what a checkpoint stores)."""
    return vitzoo.create_model(
        hparams["arch"],
        attention=hparams["attention"],
        num_classes=hparams["num_classes"],
        img_size=hparams["img_size"],
        in_chans=hparams.get("in_chans", 3),
        **(hparams.get("model_kwargs") or {}),
    )


def _metrics(num_classes: int) -> MetricCollection:
    # validate_args=False: torchmetrics' per-batch label check (torch.unique) is a host sync every step; labels
    # are checked once per split by the data module, and cross_entropy rejects any out of range before this.
    return MetricCollection(
        {
            "acc1": MulticlassAccuracy(num_classes, top_k=1, average="micro", validate_args=False),
            "acc5": MulticlassAccuracy(num_classes, top_k=min(5, num_classes), average="micro", validate_args=False),
        }
    )


class ImageClassifier(ExactResume):
    """Image classification with any ``vitzoo.create_model`` architecture.

    All constructor arguments are plain Python values and are saved as hyperparameters, so a
    checkpoint alone rebuilds the network (:func:`build_model`) and its input pipeline
    (``img_size``, ``mean``, ``std``, and ``eval_transform``: the data's eval transform as
    :meth:`~vitzoo.data.ImageDataModule.eval_transform` gives it, which eval.py applies; None: not recorded).
    The recipe arguments are the fields of
    :class:`~vitzoo.options.ClassifierOptions` (their defaults and meaning): ``optim`` an
    :class:`~vitzoo.options.OptimOptions` or a mapping of its fields, ``mixup`` likewise a
    :class:`~vitzoo.options.MixupOptions`. ``compile`` wraps the network in ``torch.compile`` in place (state-dict
    keys do not change). Its checkpoints resume exactly (:class:`~vitzoo.training.resume.ExactResume`).
    """

    def __init__(
        self,
        arch: str,
        attention: Union[str, Mapping[str, Any]],
        num_classes: int,
        img_size: int,
        in_chans: int = 3,
        mean: Sequence[float] = (0.5, 0.5, 0.5),
        std: Sequence[float] = (0.5, 0.5, 0.5),
        model_kwargs: Optional[Mapping[str, Any]] = None,
        optim: Union[OptimOptions, Mapping[str, Any], None] = None,
        label_smoothing: float = ClassifierOptions.label_smoothing,
        mixup: Union[MixupOptions, Mapping[str, Any], None] = None,
        compile: bool = ClassifierOptions.compile,
        channels_last: bool = ClassifierOptions.channels_last,
        eval_transform: Optional[Mapping[str, Any]] = None,
    ):
        super().__init__()
        recipe = options_from(
            ClassifierOptions,
            "module",
            dict(
                optim=optim or {},
                label_smoothing=label_smoothing,
                mixup=mixup or {},
                compile=compile,
                channels_last=channels_last,
            ),
        )
        # plain values in the hyperparameters, so that a weights_only load reads the checkpoint
        optim, mixup = dataclasses.asdict(recipe.optim), dataclasses.asdict(recipe.mixup)
        label_smoothing, compile, channels_last = recipe.label_smoothing, recipe.compile, recipe.channels_last
        self.save_hyperparameters(logger=False)  # fit() logs them (train.py: the whole config instead)
        self.optim, mix = optim, mixup
        self.model = build_model(self.hparams)
        if channels_last:
            self.model.to(memory_format=torch.channels_last)
        self.mixup = None
        if mix["mixup_alpha"] > 0 or mix["cutmix_alpha"] > 0:
            self.mixup = Mixup(**mix, label_smoothing=label_smoothing, num_classes=num_classes)
            self.soft_ce = SoftTargetCrossEntropy()
        self.train_metrics = _metrics(num_classes).clone(prefix="train/")
        # the epoch's mean loss (training batches are all full: drop_last); "disable": no NaN check, a host sync
        self.train_loss = MeanMetric(nan_strategy="disable")
        self.val_metrics = _metrics(num_classes).clone(prefix="val/")
        self.test_metrics = _metrics(num_classes).clone(prefix="test/")
        if compile:
            self.model.compile()

    def forward(self, images: Union[torch.Tensor, List[torch.Tensor]]) -> torch.Tensor:
        """Logits of a batch tensor, or of a list of images of their own sizes (data.native_resolution)."""
        if isinstance(images, list):
            return self.model(images)
        if self.hparams.get("channels_last"):  # absent from checkpoints written before the option
            images = images.contiguous(memory_format=torch.channels_last)
        return self.model(images)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        if self.mixup is not None:
            if isinstance(images, list):
                raise ValueError(
                    "mixup / cutmix blend images of one size; with data.native_resolution=true set "
                    "module.mixup.mixup_alpha=0 and module.mixup.cutmix_alpha=0"
                )
            images, soft = self.mixup(images, labels)
            loss = self.soft_ce(self(images), soft)
        else:
            logits = self(images)
            loss = F.cross_entropy(logits, labels, label_smoothing=self.hparams.label_smoothing)
            self.train_metrics.update(logits.detach(), labels)
            self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        # not prog_bar: Lightning would read it as a number after every step, a host sync on a GPU
        # (ThrottledProgressBar shows train/loss_step at most once a second instead)
        self.log("train/loss_step", loss, on_step=True, on_epoch=False)
        self.train_loss.update(loss.detach())
        self.log("train/loss_epoch", self.train_loss, on_step=False, on_epoch=True)
        return loss

    def _eval_step(self, batch, metrics: MetricCollection, stage: str) -> None:
        images, labels = batch
        logits = self(images)
        self.log(
            f"{stage}/loss", F.cross_entropy(logits, labels), on_epoch=True, sync_dist=True, batch_size=len(labels)
        )
        metrics.update(logits, labels)
        self.log_dict(metrics, on_epoch=True, prog_bar=stage == "val")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.val_metrics, "val")

    def on_validation_epoch_end(self) -> None:
        # TensorBoard's HPARAMS tab shows "hp_metric" next to the run's configuration.
        self.log("hp_metric", self.val_metrics["acc1"].compute())

    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, self.test_metrics, "test")

    def global_batch(self) -> int:
        """Images per optimizer step over all processes: per-device batch x world size x accumulated batches."""
        trainer = self.trainer
        if trainer.datamodule is None:
            raise ValueError(
                "module.optim.lr_base_batch scales the LR by the data module's batch size; fit with "
                "a datamodule or set module.optim.lr_base_batch=null"
            )
        return trainer.datamodule.batch_size * trainer.world_size * trainer.accumulate_grad_batches

    def configure_optimizers(self):
        opt = self.optim
        lr = opt["lr"]
        if opt["lr_base_batch"] is not None:
            lr = scaled_lr(lr, self.global_batch(), opt["lr_base_batch"])
            log.info(
                "peak LR %g = module.optim.lr %g x global batch %d / lr_base_batch %d",
                lr,
                opt["lr"],
                self.global_batch(),
                opt["lr_base_batch"],
            )
        optimizer = build_optimizer(self.model, lr, opt["weight_decay"], opt["betas"], opt["layer_decay"], opt["fused"])
        total = int(self.trainer.estimated_stepping_batches)
        epochs = self.trainer.max_epochs
        if not epochs or epochs < 1:
            raise ValueError("the LR schedule is defined in epochs; set trainer.max_epochs (>= 1)")
        warmup = round(opt["warmup_epochs"] * total / epochs)
        scheduler = build_scheduler(optimizer, total, warmup, opt["min_lr_ratio"])
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

"""What train.py calls: compose objects from a Hydra config, fit, write metrics.json."""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import lightning as L
import torch
from lightning.pytorch.callbacks import ProgressBar
from omegaconf import DictConfig, OmegaConf

from vitzoo.data import ImageDataModule
from vitzoo.data.recipes import source_pretrained_cfg
from vitzoo.runtime import size_thread_pools
from vitzoo.utils import instantiate_config, write_json

from .callbacks import AttentionEntropy
from .console import quiet_lightning
from .evaluate import read_checkpoint, run_record
from .module import ImageClassifier
from .progress import closing_summary, console_is_terminal, opening_line
from .transfer import AttentionTransfer, initialise

__all__ = ["train", "build_classifier", "build_run"]

log = logging.getLogger(__name__)


def _instantiate_all(group: Optional[DictConfig]) -> List[Any]:
    """Every entry of a config group mapping that has a ``_target_`` (set an entry to null to drop it)."""
    return [instantiate_config(node) for node in (group or {}).values() if node is not None and "_target_" in node]


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def build_classifier(cfg: DictConfig, datamodule) -> ImageClassifier:
    """The LightningModule for ``cfg.model`` + ``cfg.module`` with the data's classes, size and statistics
    (attention transfer's when ``cfg.transfer`` is set: ``experiment=transfer``)."""
    model, transfer = _plain(cfg.model), _plain(cfg.get("transfer"))
    kwargs = dict(
        arch=model["arch"],
        attention=model["attention"],
        model_kwargs=model.get("kwargs") or {},
        num_classes=datamodule.num_classes,
        img_size=datamodule.img_size,
        in_chans=datamodule.in_chans,
        mean=list(datamodule.mean),
        std=list(datamodule.std),
        **_plain(cfg.module),
    )
    try:
        module = AttentionTransfer(transfer=transfer, **kwargs) if transfer else ImageClassifier(**kwargs)
    except ValueError as err:  # the library names create_model's arguments; the command line sets them here
        if "keyword argument" in str(err):
            raise ValueError(
                f"{err} (train.py: model.kwargs.<name>=..., +model.kwargs.<name>=... to add one)"
            ) from None
        raise
    if not cfg.get("ckpt_path"):  # resuming: the weights come from the checkpoint
        initialise(module, model.get("init_from"))
    return module


def build_run(cfg: DictConfig) -> Tuple[L.LightningDataModule, L.LightningModule]:
    """The data module and LightningModule of ``cfg``, seeded with ``cfg.seed`` first as :func:`train` builds them:
    what this returns is the network a run of ``cfg`` starts from, its randomly initialised parameters included
    (a mechanism's own ones after ``init_from``)."""
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = instantiate_config(cfg.data)
    if "_target_" in cfg.module:
        return datamodule, instantiate_config(cfg.module)
    module = build_classifier(cfg, datamodule)
    if isinstance(datamodule, ImageDataModule):  # the deit recipe's eval crop follows the weights' pretrained_cfg
        datamodule.pretrained_cfg = source_pretrained_cfg(cfg.model.get("init_from"), module.model)
    return datamodule, module


def _floats(metrics: Dict[str, torch.Tensor]) -> Dict[str, float]:
    return {name: float(value) for name, value in metrics.items()}


_MODEL_HPARAMS = ("arch", "attention", "model_kwargs", "num_classes", "img_size", "in_chans", "mean", "std")


def _canonical(value: Any) -> str:
    """One spelling per value (tuples and lists, config nodes and dicts alike), for comparisons."""
    return json.dumps(_plain(value), sort_keys=True, default=str)


def _run_overrides(ckpt_path: str) -> List[str]:
    """The command-line overrides the checkpoint's run was started with (its .hydra/overrides.yaml), if found."""
    path = run_record(ckpt_path, "overrides.yaml")
    found = OmegaConf.load(path) if path is not None else []
    return [o for o in found if isinstance(o, str) and not o.startswith("ckpt_path=")]


def _check_resume(checkpoint: Dict[str, Any], module: L.LightningModule, ckpt_path: str) -> None:
    """Resuming builds the network from this run's config: it must be the checkpoint's (same-shaped
    weights of another attention would load silently)."""
    saved = checkpoint.get("hyper_parameters") or {}
    differ = [
        f"{key}={saved[key]!r} (this run: {module.hparams[key]!r})"
        for key in _MODEL_HPARAMS
        if key in saved and key in module.hparams and _canonical(saved[key]) != _canonical(module.hparams[key])
    ]
    if differ:
        overrides = _run_overrides(ckpt_path)
        again = f": its run was started with '{' '.join(overrides)}'" if overrides else ""
        raise ValueError(
            f"ckpt_path={ckpt_path!r} was trained with {'; '.join(differ)}; resume with the model= and "
            f"data= options it was trained with{again}"
        )


def _check_unfinished(checkpoint: Dict[str, Any], trainer_cfg: DictConfig, ckpt_path: str) -> None:
    """Resuming a run that already reached its trainer.max_epochs / max_steps would train 0 steps and rewrite its
    metrics.json without the validation metrics: one line instead, saying how to train further."""
    epochs = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    done, step = epochs.get("processed", 0), checkpoint.get("global_step", 0)
    max_epochs, max_steps = trainer_cfg.get("max_epochs"), trainer_cfg.get("max_steps") or -1
    if max_steps > 0 and step >= max_steps:
        raise ValueError(
            f"ckpt_path={ckpt_path!r} is of a run that already took its trainer.max_steps={max_steps} "
            f"steps; nothing is left to train: to train it further, resume with a larger "
            f"trainer.max_steps (e.g. trainer.max_steps={2 * max_steps})"
        )
    if max_epochs is not None and max_epochs >= 0 and done >= max_epochs:
        raise ValueError(
            f"ckpt_path={ckpt_path!r} is of a run that already finished its {done} epoch(s) "
            f"(trainer.max_epochs={max_epochs}); nothing is left to train: to train it further, resume "
            f"with a larger trainer.max_epochs (e.g. trainer.max_epochs={done + max(1, done)})"
        )


def _build_trainer(cfg: DictConfig) -> L.Trainer:
    """``cfg.trainer`` with every callback and logger of the config, hyperparameters logged. Off a terminal
    the progress bar gives way to EpochLog's lines (unless ``trainer.enable_progress_bar`` is set)."""
    callbacks, bar = _instantiate_all(cfg.get("callbacks")), {}
    if not console_is_terminal() and cfg.trainer.get("enable_progress_bar") is None:
        callbacks, bar = [c for c in callbacks if not isinstance(c, ProgressBar)], {"enable_progress_bar": False}
    trainer = instantiate_config(
        cfg.trainer, callbacks=callbacks, logger=_instantiate_all(cfg.get("logger")) or False, **bar
    )
    for logger in trainer.loggers:
        logger.log_hyperparams({key: _plain(cfg.get(key)) for key in ("model", "module", "data", "trainer", "seed")})
    return trainer


def train(cfg: DictConfig) -> Dict[str, Any]:
    """Fit ``cfg`` (resuming from ``cfg.ckpt_path`` when set); returns the final metrics.

    The LightningModule is the classifier of ``cfg.model`` + ``cfg.module``, or, when ``cfg.module``
    has a ``_target_`` (``--config-name segment``), that module.

    Writes ``metrics.json`` (last val metrics, best checkpoint, attention entropy at init) to
    ``cfg.paths.output_dir``.
    """
    started = time.monotonic()
    quiet_lightning()
    threads = size_thread_pools()
    ckpt_path = cfg.get("ckpt_path")
    checkpoint = read_checkpoint(ckpt_path) if ckpt_path else None  # clear errors before Lightning's
    datamodule, module = build_run(cfg)
    if checkpoint is not None:  # another model's weights first: that resume could never run
        _check_resume(checkpoint, module, ckpt_path)
        _check_unfinished(checkpoint, cfg.trainer, ckpt_path)
    run_dir = Path(cfg.paths.output_dir)
    log.info(opening_line(run_dir, module, checkpoint, ckpt_path, threads, cfg.get("seed")))
    del checkpoint
    trainer = _build_trainer(cfg)
    with warnings.catch_warnings():
        if ckpt_path:  # resuming: in place, the checkpoint folder is the run's own (elsewhere it starts empty)
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path, weights_only=True)

    metrics: Dict[str, Any] = _floats(trainer.callback_metrics)
    metrics.update(global_step=trainer.global_step, epoch=trainer.current_epoch)
    for callback in trainer.callbacks:
        if isinstance(callback, AttentionEntropy):
            metrics.update({f"entropy_init/{name}": value for name, value in callback.initial.items()})
    best = trainer.checkpoint_callback
    if best is not None and best.best_model_path:
        metrics.update(best_ckpt=best.best_model_path, best_score=float(best.best_model_score))
    if trainer.is_global_zero:
        write_json(run_dir / "metrics.json", metrics)
        log.info(closing_summary(trainer, run_dir, time.monotonic() - started))
    return metrics

"""``vitzoo.training.fit``: train a classifier from plain Python (a model name or a LightningModule, a data module,
the option dataclasses) into a result with its metrics and checkpoints; train.py is a wrapper over it."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import lightning as L
from omegaconf import OmegaConf

from vitzoo.data import ImageDataModule
from vitzoo.data.recipes import source_pretrained_cfg
from vitzoo.options import ClassifierOptions, TransferOptions
from vitzoo.runtime import size_thread_pools
from vitzoo.utils import write_json

from .callbacks import AttentionEntropy
from .console import quiet_lightning
from .evaluate import read_checkpoint, run_record
from .module import ImageClassifier
from .options import options_from
from .progress import closing_summary, opening_line
from .transfer import AttentionTransfer, initialise

__all__ = ["fit", "FitResult", "build_classifier_for"]

log = logging.getLogger(__name__)
Attention = Union[str, Mapping[str, Any], Sequence[Any]]
_MODEL_HPARAMS = ("arch", "attention", "model_kwargs", "num_classes", "img_size", "in_chans", "mean", "std")


@dataclass
class FitResult:
    """What :func:`fit` trained: its final metrics (as ``metrics.json``), the folder it wrote, the checkpoints."""

    metrics: Dict[str, Any]
    out_dir: Path
    best_checkpoint: Optional[Path]  # the checkpoint callback's best (its monitor's), or None without one
    module: L.LightningModule


def build_classifier_for(
    data: Any,
    arch: str,
    attention: Attention = "softmax",
    *,
    model_kwargs: Optional[Mapping[str, Any]] = None,
    init_from: Optional[str] = None,
    options: Union[ClassifierOptions, Mapping[str, Any], None] = None,
    transfer: Union[TransferOptions, Mapping[str, Any], None] = None,
    resume: bool = False,
) -> ImageClassifier:
    """The classifier of ``arch`` with ``attention`` for ``data``'s classes, image size, channels and statistics,
    trained with ``options``; :class:`~vitzoo.training.transfer.AttentionTransfer` when ``transfer`` is given.
    Its weights start from ``init_from`` unless ``resume`` (a checkpoint will hold them)."""
    recipe = options_from(ClassifierOptions, "module", options)
    kwargs: Dict[str, Any] = dict(
        arch=arch,
        attention=attention,
        model_kwargs=dict(model_kwargs or {}),
        num_classes=data.num_classes,
        img_size=data.img_size,
        in_chans=data.in_chans,
        mean=list(data.mean),
        std=list(data.std),
        **dataclasses.asdict(recipe),  # plain values: the hyperparameters a weights_only load reads
    )
    if transfer is not None:
        module: ImageClassifier = AttentionTransfer(
            transfer=dataclasses.asdict(options_from(TransferOptions, "transfer", transfer)), **kwargs
        )
    else:
        module = ImageClassifier(**kwargs)
    if not resume:
        initialise(module, init_from)
    if isinstance(data, ImageDataModule):  # the deit recipe's eval crop follows the weights' pretrained_cfg
        data.pretrained_cfg = source_pretrained_cfg(init_from, module.model)
        # the constructor's argument, known once the model is built; checkpoints carry it to eval.py
        module.hparams["eval_transform"] = data.eval_transform()
    return module


def _canonical(value: Any) -> str:
    """One spelling per value (tuples and lists, config nodes and dicts alike), for comparisons."""
    plain = OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    return json.dumps(plain, sort_keys=True, default=str)


def _run_overrides(ckpt_path: str) -> List[str]:
    """The command-line overrides the checkpoint's run was started with (its .hydra/overrides.yaml), if found."""
    path = run_record(ckpt_path, "overrides.yaml")
    found = OmegaConf.load(path) if path is not None else []
    return [o for o in found if isinstance(o, str) and not o.startswith("ckpt_path=")]


def _check_resume(checkpoint: Dict[str, Any], module: L.LightningModule, ckpt_path: str) -> None:
    """Resuming builds the network anew: it must be the checkpoint's (same-shaped weights of another attention
    would load silently)."""
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


def _check_unfinished(checkpoint: Dict[str, Any], trainer: L.Trainer, ckpt_path: str) -> None:
    """Resuming a run that already reached its max_epochs / max_steps would train 0 steps and rewrite its
    metrics.json without the validation metrics: one line instead, saying how to train further."""
    epochs = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_progress", {}).get("current", {})
    done, step = epochs.get("processed", 0), checkpoint.get("global_step", 0)
    max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
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


def _trainer(out_dir: Path, trainer: Union[L.Trainer, Mapping[str, Any]]) -> L.Trainer:
    if isinstance(trainer, L.Trainer):
        return trainer
    if trainer.get("max_epochs") is None and trainer.get("max_steps") is None:
        raise ValueError("fit needs the run's length: pass trainer={'max_epochs': N} (Lightning Trainer arguments)")
    return L.Trainer(**{"default_root_dir": os.fspath(out_dir), "logger": False, **trainer})


def fit(
    model: Union[str, L.LightningModule],
    data: L.LightningDataModule,
    out_dir: Union[str, os.PathLike],
    *,
    trainer: Union[L.Trainer, Mapping[str, Any]],
    attention: Optional[Attention] = None,
    model_kwargs: Optional[Mapping[str, Any]] = None,
    init_from: Optional[str] = None,
    options: Union[ClassifierOptions, Mapping[str, Any], None] = None,
    transfer: Union[TransferOptions, Mapping[str, Any], None] = None,
    seed: Optional[int] = 0,
    ckpt_path: Optional[Union[str, os.PathLike]] = None,
    hparams: Optional[Mapping[str, Any]] = None,
) -> FitResult:
    """Train ``model`` on ``data``, writing into ``out_dir``; resume from ``ckpt_path`` when given.

    ``model``: an architecture of ``vitzoo.list_models()``, built for ``data`` by :func:`build_classifier_for`
    with ``attention`` (default softmax), ``model_kwargs``, ``init_from``, ``options`` (a
    :class:`~vitzoo.options.ClassifierOptions`: optimiser, mixup, label smoothing...) and ``transfer``; or a
    LightningModule, trained as it is. ``trainer``: a Lightning ``Trainer``, or its arguments (``max_epochs`` or
    ``max_steps`` among them; no logger unless given, checkpoints under ``out_dir``). ``seed`` seeds every RNG
    first (Lightning's ``seed_everything``, dataloader workers too; None: left as they are). ``hparams``: what the
    trainer's loggers record as the run's hyperparameters (default: the module's).
    Writes ``out_dir/metrics.json``: the last validation metrics, the best checkpoint and its score, and the
    attention entropy at initialisation when an :class:`~vitzoo.training.AttentionEntropy` callback ran.
    """
    started = time.monotonic()
    quiet_lightning()
    threads = size_thread_pools()
    ckpt_path = os.fspath(ckpt_path) if ckpt_path is not None else None
    checkpoint = read_checkpoint(ckpt_path) if ckpt_path else None  # clear errors before Lightning's
    if seed is not None:
        L.seed_everything(seed, workers=True, verbose=False)
    if isinstance(model, str):
        module = build_classifier_for(
            data,
            model,
            attention if attention is not None else "softmax",
            model_kwargs=model_kwargs,
            init_from=init_from,
            options=options,
            transfer=transfer,
            resume=checkpoint is not None,
        )
    else:
        builds = dict(attention=attention, model_kwargs=model_kwargs, init_from=init_from, options=options)
        given = [name for name, value in {**builds, "transfer": transfer}.items() if value is not None]
        if given:
            raise ValueError(f"fit got a built module and {given}, which build one: pass an architecture name")
        module = model
    out = Path(out_dir)
    run = _trainer(out, trainer)
    if checkpoint is not None:  # another model's weights first: that resume could never run
        _check_resume(checkpoint, module, ckpt_path)
        _check_unfinished(checkpoint, run, ckpt_path)
    log.info(opening_line(out, module, checkpoint, ckpt_path, threads, seed))
    del checkpoint
    for logger in run.loggers:
        logger.log_hyperparams(dict(hparams) if hparams is not None else dict(module.hparams))
    with warnings.catch_warnings():
        if ckpt_path:  # resuming: in place, the checkpoint folder is the run's own (elsewhere it starts empty)
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        run.fit(module, datamodule=data, ckpt_path=ckpt_path, weights_only=True)

    metrics: Dict[str, Any] = {name: float(value) for name, value in run.callback_metrics.items()}
    metrics.update(global_step=run.global_step, epoch=run.current_epoch)
    for callback in run.callbacks:
        if isinstance(callback, AttentionEntropy):
            metrics.update({f"entropy_init/{name}": value for name, value in callback.initial.items()})
    best = run.checkpoint_callback
    best_path = Path(best.best_model_path) if best is not None and best.best_model_path else None
    if best_path is not None:
        metrics.update(best_ckpt=best.best_model_path)
        if best.best_model_score is not None:
            metrics.update(best_score=float(best.best_model_score))
    if run.is_global_zero:
        write_json(out / "metrics.json", metrics)
        log.info(closing_summary(run, out, time.monotonic() - started))
    return FitResult(metrics, out, best_path, module)

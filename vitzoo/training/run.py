"""What train.py calls: the objects of a Hydra config (data, module, trainer with its callbacks and loggers),
fitted by :func:`~vitzoo.training.fit`."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import lightning as L
from lightning.pytorch.callbacks import ProgressBar
from omegaconf import DictConfig, OmegaConf

from vitzoo.utils import instantiate_config

from .console import quiet_lightning
from .fit import build_classifier_for, fit
from .module import ImageClassifier
from .progress import console_is_terminal

__all__ = ["train", "build_classifier", "build_run"]


def _instantiate_all(group: Optional[DictConfig]) -> List[Any]:
    """Every entry of a config group mapping that has a ``_target_`` (set an entry to null to drop it)."""
    return [instantiate_config(node) for node in (group or {}).values() if node is not None and "_target_" in node]


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node


def build_classifier(cfg: DictConfig, datamodule) -> ImageClassifier:
    """The LightningModule for ``cfg.model`` + ``cfg.module`` with the data's classes, size and statistics
    (attention transfer's when ``cfg.transfer`` is set: ``experiment=transfer``)."""
    model = _plain(cfg.model)
    try:
        return build_classifier_for(
            datamodule,
            model["arch"],
            model["attention"],
            model_kwargs=model.get("kwargs"),
            init_from=model.get("init_from"),
            options=_plain(cfg.module),
            transfer=_plain(cfg.get("transfer")),
            resume=bool(cfg.get("ckpt_path")),
        )
    except ValueError as err:  # the library names its arguments; the command line sets them here
        if "keyword argument" in str(err):
            raise ValueError(
                f"{err} (train.py: model.kwargs.<name>=..., +model.kwargs.<name>=... to add one)"
            ) from None
        if "pass init_from=" in str(err):
            raise ValueError(str(err).replace("pass init_from=", "pass model.init_from=")) from None
        raise


def build_run(cfg: DictConfig) -> Tuple[L.LightningDataModule, L.LightningModule]:
    """The data module and LightningModule of ``cfg``, seeded with ``cfg.seed`` first as :func:`train` builds them:
    what this returns is the network a run of ``cfg`` starts from, its randomly initialised parameters included
    (a mechanism's own ones after ``init_from``)."""
    if cfg.get("seed") is not None:
        L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule = instantiate_config(cfg.data)
    if "_target_" in cfg.module:
        return datamodule, instantiate_config(cfg.module)
    return datamodule, build_classifier(cfg, datamodule)


def _build_trainer(cfg: DictConfig) -> L.Trainer:
    """``cfg.trainer`` with every callback and logger of the config. Off a terminal the progress bar gives way
    to EpochLog's lines (unless ``trainer.enable_progress_bar`` is set)."""
    callbacks, bar = _instantiate_all(cfg.get("callbacks")), {}
    if not console_is_terminal() and cfg.trainer.get("enable_progress_bar") is None:
        callbacks, bar = [c for c in callbacks if not isinstance(c, ProgressBar)], {"enable_progress_bar": False}
    return instantiate_config(
        cfg.trainer, callbacks=callbacks, logger=_instantiate_all(cfg.get("logger")) or False, **bar
    )


def train(cfg: DictConfig) -> Dict[str, Any]:
    """Fit ``cfg`` through :func:`~vitzoo.training.fit` (resuming from ``cfg.ckpt_path`` when set); returns the
    final metrics, also written to ``cfg.paths.output_dir``/metrics.json.

    The LightningModule is the classifier of ``cfg.model`` + ``cfg.module``, or, when ``cfg.module``
    has a ``_target_`` (``--config-name segment``), that module. The loggers record the whole config.
    """
    quiet_lightning()  # before the trainer is built: its lines too
    datamodule, module = build_run(cfg)
    result = fit(
        module,
        datamodule,
        cfg.paths.output_dir,
        trainer=_build_trainer(cfg),
        seed=cfg.get("seed"),
        ckpt_path=cfg.get("ckpt_path"),
        hparams={key: _plain(cfg.get(key)) for key in ("model", "module", "data", "trainer", "seed")},
    )
    return result.metrics

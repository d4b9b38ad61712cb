"""The robustness benchmark from Python: ``evaluate(models, data, corruptions=..., adversarial=...)`` runs one sweep
over one or several models and returns a :class:`RobustnessResult`, which writes the files eval.py writes."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Subset

from vitzoo.attention.stack import describe
from vitzoo.options import RobustnessOptions, SweepOptions
from vitzoo.training import load_classifier
from vitzoo.training.options import options_from
from vitzoo.utils import write_json

from .adversarial import require_torchattacks
from .closing import file_lines, results_table
from .corruptions import CIFAR_MAX_SIDE
from .inputs import Inputs, inputs_of
from .plots import plot_results
from .report import log_tensorboard, summarize, write_results
from .source import released_files
from .sweep import CLEAN, Sweep, patch_multiple, resolution_size, run_pass, sweep_passes

__all__ = ["evaluate", "RobustnessResult", "Progress"]

log = logging.getLogger(__name__)
MEMORY_BUDGET_BYTES = 2 << 30  # a decoded val split up to this size is held in memory for the sweep
Loaded = Tuple[nn.Module, Dict[str, Any]]  # (network in eval mode, hyperparameters: img_size, mean, std, ...)


@dataclass
class RobustnessResult:
    """One sweep's records (checkpoint x test x level), per-checkpoint summary and what was evaluated."""

    records: List[dict]
    summary: Dict[str, dict]
    checkpoints: Dict[str, dict]
    baseline: Optional[str]
    data: str
    sweep: Sweep
    source: Dict[str, Any]

    @property
    def metrics(self) -> Dict[str, dict]:
        """Clean top-1 / top-5 / loss per checkpoint, with its path, architecture and attention."""
        keep = ("path", "arch", "attention")
        return {
            r["checkpoint"]: {
                **{k: r[k] for k in ("acc1", "acc5", "loss", "num_images")},
                **{("ckpt_path" if k == "path" else k): self.checkpoints[r["checkpoint"]][k] for k in keep},
            }
            for r in self.records
            if r["test"] == CLEAN
        }

    def table(self) -> List[str]:
        """The closing table's lines (eval.py logs them)."""
        sizes = {label: c["resolution_sizes"] for label, c in self.checkpoints.items()}
        return results_table(self.records, self.summary, self.baseline, self.data, self.sweep.resolutions, sizes)

    def write(self, out_dir: Union[str, os.PathLike], plots: bool = True, tensorboard: bool = True) -> List[str]:
        """``robustness.json`` / ``.csv``, ``metrics.json``, the plots and TensorBoard scalars into ``out_dir``;
        returns the lines that say where each went."""
        out = Path(out_dir)
        sweep = {f.name: getattr(self.sweep, f.name) for f in fields(Sweep)}
        write_results(
            self.records,
            self.summary,
            out,
            {
                "checkpoints": self.checkpoints,
                "baseline": self.baseline,
                "data": self.data,
                "sweep": sweep,
                **self.source,
            },
        )
        drawn = (
            plot_results(self.records, out, {lb: c["img_size"] for lb, c in self.checkpoints.items()}, self.data)
            if plots
            else []
        )
        board = out / "tensorboard" if tensorboard else None
        if board is not None:
            log_tensorboard(self.records, board)
        clean = self.metrics
        write_json(out / "metrics.json", next(iter(clean.values())) if len(clean) == 1 else clean)
        return file_lines(out, [out / "robustness.json", out / "robustness.csv", out / "metrics.json"], drawn, board)


def _unit_loaders(
    data: Callable[..., Any], channels: int, max_images: Optional[int]
) -> Callable[[int, Inputs], Iterable]:
    """``loader_at(size, inputs)``: the val split at ``size`` x ``size`` in [0, 1] (mean 0, std 1) through the
    transform of ``inputs``, cached per size and transform.

    A split that fits ``MEMORY_BUDGET_BYTES`` once decoded is decoded once (by the data module's
    workers) and then served from memory: every pass of the sweep reads the same images, and
    re-decoding them per pass in worker processes competed with the forward passes for the CPU.
    """
    cache: Dict[tuple, Iterable] = {}

    def loader_at(size: int, inputs: Inputs) -> Iterable:
        key = (size, inputs.data_kwargs, inputs.pretrained_cfg)
        if key not in cache:
            dm = inputs.data_module(data, img_size=size, mean=[0.0] * channels, std=[1.0] * channels)
            dm.prepare_data()
            dm.setup("validate")
            dataset = dm.val_dataset
            if max_images is not None:
                dataset = Subset(dataset, range(min(int(max_images), len(dataset))))
            decoded_bytes = len(dataset) * channels * size * size * 4
            in_memory = decoded_bytes <= MEMORY_BUDGET_BYTES
            loader = DataLoader(
                dataset,
                batch_size=dm.eval_batch_size,
                num_workers=dm.num_workers,
                persistent_workers=dm.num_workers > 0 and not in_memory,
            )
            cache[key] = list(loader) if in_memory else loader
        return cache[key]

    return loader_at


def _model_entry(model: nn.Module) -> Loaded:
    """A timm / vitzoo model's own description of its input (``pretrained_cfg``) as classifier hyperparameters."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if not cfg.get("input_size") or cfg.get("mean") is None:
        raise ValueError(
            "the model carries no pretrained_cfg (input_size, mean, std); pass a checkpoint path, or a "
            "model built by vitzoo.create_model / timm.create_model / vitzoo.export.load_exported"
        )
    args = getattr(model, "_model_args", {}) or {}
    size = args.get("img_size") or cfg["input_size"][-1]  # the size it was built for, else its config's
    return model.eval(), {
        "arch": cfg.get("architecture", type(model).__name__),
        "img_size": size[-1] if isinstance(size, (list, tuple)) else size,
        "attention": args.get("attention", "softmax"),
        "mean": list(cfg["mean"]),
        "std": list(cfg["std"]),
        "num_classes": model.num_classes,
    }


def _entries(models: Any) -> List[Tuple[Optional[str], str, Loaded]]:
    """(label or None, path or '', (model, hparams)) per model: checkpoint paths, modules, a list of them (or of
    (label or None, model) pairs) or a {label: model} mapping."""
    if models is None or (isinstance(models, (list, tuple, Mapping)) and not models):
        raise ValueError("no model given; pass a checkpoint path, a model, or a list / {label: ...} of them")
    items = (
        list(models.items())
        if isinstance(models, Mapping)
        else [m if isinstance(m, tuple) else (None, m) for m in (models if isinstance(models, list) else [models])]
    )
    paths = [os.path.abspath(m) for _, m in items if isinstance(m, (str, os.PathLike))]
    if len(set(paths)) != len(paths):
        raise ValueError(f"a checkpoint is listed twice: {paths}")
    return [
        (
            None if label is None else str(label),
            os.fspath(m) if isinstance(m, (str, os.PathLike)) else "",
            load_classifier(m) if isinstance(m, (str, os.PathLike)) else _model_entry(m),
        )
        for label, m in items
    ]


def _labels(entries: Sequence[Tuple[Optional[str], str, Loaded]]) -> List[str]:
    """Labels for unlabelled entries: the attention name (with the architecture when the architectures
    differ), then the run directory where that is ambiguous, then a number."""
    hparams = [hp for _, _, (_, hp) in entries]
    names = [describe(h["attention"]) for h in hparams]
    if len({h["arch"] for h in hparams}) > 1:
        names = [f"{h['arch']}/{n}" for h, n in zip(hparams, names)]
    runs = [Path(p).parent.parent.name if Path(p).parent.name == "checkpoints" else Path(p).stem for _, p, _ in entries]
    taken = [lb for lb, _, _ in entries if lb is not None]
    labels = [
        lb if lb is not None else (n if names.count(n) == 1 and n not in taken else f"{n} ({r})")
        for (lb, _, _), n, r in zip(entries, names, runs)
    ]
    return [lb if labels.count(lb) == 1 else f"{lb} #{i}" for i, lb in enumerate(labels)]


def _device(name: Union[str, torch.device]) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def evaluate(
    models: Any,
    data: Callable[..., Any],
    *,
    baseline: Optional[Union[str, int]] = None,
    device: Union[str, torch.device] = "cpu",
    out_dir: Optional[Union[str, os.PathLike]] = None,
    transform: Optional[Mapping[str, Any]] = None,
    **options: Any,
) -> RobustnessResult:
    """Run one robustness sweep over ``models`` on ``data``'s val split.

    ``models``: a checkpoint path written by train.py, a model (``vitzoo.create_model``, ``load_exported``: its
    ``pretrained_cfg`` gives the input size and normalisation), or a list / ``{label: ...}`` mapping of them.
    ``data``: a data module class or factory taking ``img_size``, ``mean`` and ``std`` (e.g.
    ``vitzoo.data.DigitsDataModule``). ``options`` are :class:`~vitzoo.options.RobustnessOptions`' fields, with
    their defaults: the sweep (``corruptions``, ``severities``, ``protocol``, ``logit_noise``, ``resolutions``,
    ``adversarial``, ``attack``, ``seed``), ``source="files"`` with ``root`` (the released -C files),
    ``max_images``, and what :meth:`RobustnessResult.write` writes (``plots``, ``tensorboard``) and ``progress``.
    ``baseline`` (a label, or an index into ``models``) adds mCE against it.
    Each checkpoint reads the val split through the eval transform it was trained with (its recipe and crop) and
    its mean / std; ``transform`` (``recipe``, ``crop_pct``, ``interpolation``, ``mean``, ``std``) wins over
    them for every model (:mod:`~vitzoo.robustness.inputs`); the first log line names what each reads.
    With ``out_dir`` the result also writes its files there (:meth:`RobustnessResult.write`).
    """
    opts = options_from(RobustnessOptions, "robustness", options)
    sweep = Sweep(**{f.name: getattr(opts, f.name) for f in fields(SweepOptions)})
    max_images, source, root = opts.max_images, opts.source, opts.root
    if sweep.adversarial and sweep.attack == "autoattack":
        require_torchattacks()  # one error naming the install, before anything is loaded or logged
    entries = _entries(models)
    labels = _labels(entries)
    if isinstance(baseline, int):
        baseline = labels[baseline]
    if baseline is not None and baseline not in labels:
        raise ValueError(f"baseline={baseline!r} is not one of the evaluated models {labels}; name one of them")
    inputs = [inputs_of(hp, transform or {}, data) for _, _, (_, hp) in entries]
    loaded = [(m, {**hp, "mean": list(i.mean), "std": list(i.std)}) for (_, _, (m, hp)), i in zip(entries, inputs)]
    dm = data(img_size=loaded[0][1]["img_size"])
    for label, (_, hp) in zip(labels, loaded):
        if hp["num_classes"] != dm.num_classes:
            raise ValueError(
                f"{label} has {hp['num_classes']} classes but the data has {dm.num_classes}; "
                f"pass the data it was trained on"
            )
    channels = {len(hp["mean"]) for _, hp in loaded}
    if len(channels) > 1:
        raise ValueError(f"the models take different channel counts {sorted(channels)}; evaluate them separately")
    sizes = {
        label: [resolution_size(hp["img_size"], r, patch_multiple(m)) for r in sweep.resolutions]
        for label, (m, hp) in zip(labels, loaded)
    }
    for label, (m, hp) in zip(labels, loaded):
        if len(set(sizes[label])) < len(sizes[label]):  # records are keyed by pixel size: one would hide another
            raise ValueError(
                f"resolutions={list(sweep.resolutions)} give the sizes {sizes[label]} px for {label} "
                f"(trained at {hp['img_size']}, inputs a multiple of {patch_multiple(m)}): drop the "
                f"factors that repeat a size"
            )
    files = released_files(
        source,
        root,
        sweep.corruptions,
        sweep.protocol,
        {label: hp["img_size"] for label, (_, hp) in zip(labels, loaded)},
        getattr(dm, "classes", None),
        dm.eval_batch_size,
        dm.num_workers,
        max_images,
    )
    loader_at = _unit_loaders(data, channels.pop(), max_images)
    where = torch.device(_device(device))
    name = _data_name(dm)
    passes = sweep_passes(sweep)
    log.info(
        "evaluating %s on the %s: %d pass(es) each%s; inputs: %s",
        ", ".join(labels),
        name,
        len(passes),
        f", into {Path(out_dir).resolve()}" if out_dir is not None else "",
        "; ".join(f"{label}: {i.note}" for label, i in zip(labels, inputs)),
    )
    if files is not None:
        log.info(
            "corruption passes read the released files under %s (%s layout, %dx%d px)",
            files.root.resolve(),
            files.layout,
            *files.image_size,
        )
    records: List[dict] = []
    with Progress(opts.progress, len(labels) * len(passes)) as advance:
        for label, (model, hp), reads in zip(labels, loaded, inputs):
            model.to(where)
            for step in passes:
                advance(f"{label}: {step}")
                metrics = run_pass(
                    model,
                    step,
                    sweep,
                    hp["img_size"],
                    hp["mean"],
                    hp["std"],
                    functools.partial(loader_at, inputs=reads),
                    where,
                    files.loader if files is not None else None,
                )
                records.append({"checkpoint": label, "test": step.test, **metrics})
            model.cpu()
    protocols = {
        label: files.protocol
        if files is not None
        else sweep.protocol or ("cifar" if hp["img_size"] <= CIFAR_MAX_SIDE else "imagenet")
        for label, (_, hp) in zip(labels, loaded)
    }
    checkpoints = {
        label: {
            "path": os.path.abspath(path) if path else None,
            "arch": hp["arch"],
            "attention": hp["attention"],
            "img_size": hp["img_size"],
            "resolution_sizes": sizes[label],
            "protocol": protocols[label],
        }
        for label, (_, path, (_, hp)) in zip(labels, entries)
    }
    summary = summarize(records, baseline, protocols)
    for label, s in summary.items():
        if s.get("attack_check", "ok") != "ok":
            log.warning(
                "%s: the adversarial attack looks broken (%s); do not report its PGD numbers", label, s["attack_check"]
            )
    result = RobustnessResult(
        records,
        summary,
        checkpoints,
        baseline,
        name,
        sweep,
        {
            "source": "files" if files is not None else "computed",
            "root": str(files.root.resolve()) if files is not None else None,
        },
    )
    if out_dir is not None:
        lines = result.write(out_dir, plots=opts.plots, tensorboard=opts.tensorboard)
        for line in [*result.table(), *lines]:
            log.info(line)
    return result


def _data_name(dm: Any) -> str:
    """The val split as titles and tables name it: its folder's name, or the data module's."""
    root = getattr(dm, "root", None)
    return f"{Path(str(root)).name} val split" if root else f"{type(dm).__name__.removesuffix('DataModule')} val split"


class Progress:
    """A Rich progress bar over the whole sweep (silent when disabled); ``with`` gives ``advance(description)``."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total, self.bar, self.task, self.started = enabled, total, None, None, False

    def __enter__(self) -> Callable[[str], None]:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self.bar = RichProgress(
                TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
            )
            self.bar.start()
            self.task = self.bar.add_task("robustness", total=self.total)
        return self.advance

    def advance(self, description: str) -> None:
        if self.bar is None:
            return
        if self.started:
            self.bar.advance(self.task)
        self.bar.update(self.task, description=description)
        self.started = True

    def __exit__(self, *exc) -> bool:
        if self.bar is not None:
            if exc[0] is None:
                self.bar.update(self.task, completed=self.total)
            self.bar.stop()
        return False

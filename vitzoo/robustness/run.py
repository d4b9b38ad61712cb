"""What eval.py calls: several checkpoints side by side through one robustness sweep.

Writes into the run directory: ``metrics.json`` (clean metrics), ``robustness.json`` (summary and
one record per checkpoint x test x level), ``robustness.csv``, PNG plots and TensorBoard scalars; logs
an opening line, then a table of the results and the paths of those files.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import torch
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader, Subset

from vitzoo.attention.stack import describe
from vitzoo.training import load_classifier, run_record
from vitzoo.utils import instantiate_config, write_json

from .adversarial import require_torchattacks
from .closing import file_lines, results_table
from .corruptions import CIFAR_MAX_SIDE
from .plots import plot_results
from .report import log_tensorboard, summarize, write_results
from .source import released_files
from .sweep import CLEAN, Sweep, patch_multiple, resolution_size, run_pass, sweep_passes

__all__ = ["evaluate_checkpoints", "checkpoint_entries", "derive_labels"]

SWEEP_KEYS = ("corruptions", "severities", "protocol", "logit_noise", "resolutions", "adversarial", "attack", "seed")
Entry = Tuple[Optional[str], str]  # (label or None, checkpoint path)
log = logging.getLogger(__name__)


def checkpoint_entries(spec: Any) -> List[Entry]:
    """``ckpt_path`` as (label, path) pairs: one path, a list of paths (label None), or {label: path}."""
    if OmegaConf.is_config(spec):
        spec = OmegaConf.to_container(spec, resolve=True)
    if not spec:
        raise ValueError("no checkpoint given; run eval.py ckpt_path=<run dir>/checkpoints/last.ckpt "
                         "(or ckpt_path=[a.ckpt,b.ckpt], or 'ckpt_path={softmax: a.ckpt, linear: b.ckpt}')")
    if isinstance(spec, Mapping):
        return [(str(k), os.fspath(v)) for k, v in spec.items()]
    paths = [os.fspath(spec)] if isinstance(spec, (str, os.PathLike)) else [os.fspath(p) for p in spec]
    if len({os.path.abspath(p) for p in paths}) != len(paths):
        raise ValueError(f"ckpt_path lists a checkpoint twice: {paths}")
    return [(None, p) for p in paths]


def derive_labels(entries: List[Entry], hparams: List[dict]) -> List[str]:
    """Labels for unlabelled entries: the attention name (with the architecture when the architectures
    differ), then the run directory where that is ambiguous, then a number."""
    names = [describe(h["attention"]) for h in hparams]
    if len({h["arch"] for h in hparams}) > 1:
        names = [f"{h['arch']}/{n}" for h, n in zip(hparams, names)]
    runs = [Path(p).parent.parent.name if Path(p).parent.name == "checkpoints" else Path(p).stem for _, p in entries]
    taken = [lb for lb, _ in entries if lb is not None]
    labels = [lb if lb is not None else (n if names.count(n) == 1 and n not in taken else f"{n} ({r})")
              for (lb, _), n, r in zip(entries, names, runs)]
    return [lb if labels.count(lb) == 1 else f"{lb} #{i}" for i, lb in enumerate(labels)]


def _with_baseline(entries: List[Entry], baseline: Optional[str]) -> Tuple[List[Entry], Optional[int]]:
    """Entries plus the baseline's index; a baseline path not among them is appended as 'baseline'."""
    if baseline is None:
        return entries, None
    for i, (label, path) in enumerate(entries):
        if baseline == label or os.path.abspath(baseline) == os.path.abspath(path):
            return entries, i
    if not os.path.isfile(baseline):
        labels = [lb for lb, _ in entries if lb is not None]
        raise ValueError(f"robustness.baseline={baseline!r} is neither a checkpoint label {labels} nor an "
                         f"existing .ckpt file; name one of the evaluated checkpoints or a checkpoint path")
    return [*entries, ("baseline", baseline)], len(entries)


MEMORY_BUDGET_BYTES = 2 << 30  # a decoded val split up to this size is held in memory for the sweep


def _unit_loaders(data_cfg: DictConfig, channels: int, max_images: Optional[int]) -> Callable[[int], Iterable]:
    """``loader_at(size)``: the val split at ``size`` x ``size`` in [0, 1] (mean 0, std 1), cached per size.

    A split that fits ``MEMORY_BUDGET_BYTES`` once decoded is decoded once (by the data module's
    workers) and then served from memory: every pass of the sweep reads the same images, and
    re-decoding them per pass in worker processes competed with the forward passes for the CPU.
    """
    cache: Dict[int, Iterable] = {}

    def loader_at(size: int) -> Iterable:
        if size not in cache:
            dm = instantiate_config(data_cfg, img_size=size, mean=[0.0] * channels, std=[1.0] * channels)
            dm.prepare_data()
            dm.setup("validate")
            dataset = dm.val_dataset
            if max_images is not None:
                dataset = Subset(dataset, range(min(int(max_images), len(dataset))))
            decoded_bytes = len(dataset) * channels * size * size * 4
            in_memory = decoded_bytes <= MEMORY_BUDGET_BYTES
            loader = DataLoader(dataset, batch_size=dm.eval_batch_size, num_workers=dm.num_workers,
                                persistent_workers=dm.num_workers > 0 and not in_memory)
            cache[size] = list(loader) if in_memory else loader
        return cache[size]

    return loader_at


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def _data_identity(data: Any) -> str:
    """What tells two data configs apart: the data module class and its root folder (if any)."""
    name = str(data.get("_target_")).rsplit(".", 1)[-1]
    return f"{name} at {data['root']}" if data.get("root") else name


def data_name(data: Any) -> str:
    """The val split as titles and tables name it: its folder's name, or the data module's."""
    name = str(data.get("_target_")).rsplit(".", 1)[-1].removesuffix("DataModule")
    return f"{Path(str(data['root'])).name} val split" if data.get("root") else f"{name} val split"


def _warn_if_trained_on_other_data(path: str, data: DictConfig) -> None:
    """The checkpoint's run recorded its data config: say so when this evaluation reads other data
    (same class count, so nothing else would notice; evaluating elsewhere on purpose stays possible)."""
    record = run_record(path, "config.yaml")
    trained = OmegaConf.load(record).get("data") if record is not None else None
    if trained is not None and _data_identity(trained) != _data_identity(data):
        log.warning("%s was trained on %s but is evaluated on %s: pass the data=... (and data.root) it was "
                    "trained with to evaluate it on its own data", path, _data_identity(trained), _data_identity(data))


def _check_img_size(img_size: Optional[int], entries: List[Entry], loaded: List[Tuple[Any, dict]]) -> None:
    """``data.img_size`` given to eval.py must be every checkpoint's own size: the checkpoint fixes it."""
    if img_size is None:
        return
    other = [f"{path} ({hp['img_size']} px)" for (_, path), (_, hp) in zip(entries, loaded)
             if hp["img_size"] != img_size]
    if other:
        raise ValueError(f"data.img_size={img_size}, but each checkpoint is evaluated at the size it was trained at: "
                         f"{', '.join(other)}; drop data.img_size, and measure other sizes with "
                         f"robustness.resolutions=[1.5,2.0] (factors of the training size)")


def evaluate_checkpoints(cfg: DictConfig) -> Dict[str, Any]:
    """Run ``cfg.robustness`` on every checkpoint of ``cfg.ckpt_path`` over the val split of ``cfg.data``."""
    rob = cfg.robustness
    sweep = Sweep(**{k: OmegaConf.to_object(rob[k]) if OmegaConf.is_config(rob[k]) else rob[k] for k in SWEEP_KEYS})
    if sweep.adversarial and sweep.attack == "autoattack":
        require_torchattacks()  # one error naming the install, before anything is loaded or logged
    entries, base_index = _with_baseline(checkpoint_entries(cfg.ckpt_path), rob.get("baseline"))
    loaded = [load_classifier(path) for _, path in entries]  # every checkpoint checked before the first pass
    _check_img_size(cfg.data.get("img_size"), entries, loaded)
    dm = instantiate_config(cfg.data, img_size=loaded[0][1]["img_size"])
    num_classes = dm.num_classes
    for (_, path), (_, hp) in zip(entries, loaded):
        if hp["num_classes"] != num_classes:
            raise ValueError(f"{path} has {hp['num_classes']} classes but the data has {num_classes}; "
                             f"pass the data=... it was trained on")
        _warn_if_trained_on_other_data(path, cfg.data)
    channels = {len(hp["mean"]) for _, hp in loaded}
    if len(channels) > 1:
        raise ValueError(f"the checkpoints take different channel counts {sorted(channels)}; evaluate them separately")
    labels = derive_labels(entries, [hp for _, hp in loaded])
    baseline = labels[base_index] if base_index is not None else None
    sizes = {label: [resolution_size(hp["img_size"], r, patch_multiple(m)) for r in sweep.resolutions]
             for label, (m, hp) in zip(labels, loaded)}
    for label, (m, hp) in zip(labels, loaded):
        if len(set(sizes[label])) < len(sizes[label]):  # records are keyed by pixel size: one would hide another
            raise ValueError(f"robustness.resolutions={list(sweep.resolutions)} give the sizes {sizes[label]} px for "
                             f"{label} (trained at {hp['img_size']}, inputs a multiple of {patch_multiple(m)}): drop "
                             f"the factors that repeat a size")
    files = released_files(rob.source, rob.root, sweep.corruptions, sweep.protocol,
                           {label: hp["img_size"] for label, (_, hp) in zip(labels, loaded)},
                           getattr(dm, "classes", None), dm.eval_batch_size, dm.num_workers, rob.get("max_images"))
    loader_at = _unit_loaders(cfg.data, channels.pop(), rob.get("max_images"))
    device = _device(cfg.device)

    passes = sweep_passes(sweep)
    out, data = Path(cfg.paths.output_dir), data_name(cfg.data)
    log.info("evaluating %s on the %s: %d pass(es) each, into %s", ", ".join(labels), data, len(passes),
             out.resolve())
    if files is not None:
        log.info("corruption passes read the released files under %s (%s layout, %dx%d px)", files.root.resolve(),
                 files.layout, *files.image_size)
    records: List[dict] = []
    with _Progress(rob.get("progress", True), len(labels) * len(passes)) as advance:
        for label, (model, hp) in zip(labels, loaded):
            model.to(device)
            for step in passes:
                advance(f"{label}: {step}")
                metrics = run_pass(model, step, sweep, hp["img_size"], hp["mean"], hp["std"], loader_at, device,
                                   files.loader if files is not None else None)
                records.append({"checkpoint": label, "test": step.test, **metrics})
            model.cpu()

    protocols = {label: files.protocol if files is not None else
                 sweep.protocol or ("cifar" if hp["img_size"] <= CIFAR_MAX_SIDE else "imagenet")
                 for label, (_, hp) in zip(labels, loaded)}
    checkpoints = {
        label: {"path": os.path.abspath(path), "arch": hp["arch"], "attention": hp["attention"],
                "img_size": hp["img_size"], "resolution_sizes": sizes[label], "protocol": protocols[label]}
        for label, (_, path), (_, hp) in zip(labels, entries, loaded)}
    summary = summarize(records, baseline, protocols)
    for label, s in summary.items():
        if s.get("attack_check", "ok") != "ok":
            log.warning("%s: the adversarial attack looks broken (%s); do not report its PGD numbers", label,
                        s["attack_check"])
    source = {"source": "files" if files is not None else "computed",
              "root": str(files.root.resolve()) if files is not None else None}
    write_results(records, summary, out, {"checkpoints": checkpoints, "baseline": baseline, "data": data,
                                          "sweep": {k: getattr(sweep, k) for k in SWEEP_KEYS}, **source})
    plots = plot_results(records, out, {lb: c["img_size"] for lb, c in checkpoints.items()}, data) \
        if rob.get("plots", True) else []
    tensorboard = out / "tensorboard" if rob.get("tensorboard", True) else None
    if tensorboard is not None:
        log_tensorboard(records, tensorboard)
    clean = {r["checkpoint"]: {**{k: r[k] for k in ("acc1", "acc5", "loss", "num_images")},
                               "ckpt_path": checkpoints[r["checkpoint"]]["path"],
                               "arch": checkpoints[r["checkpoint"]]["arch"],
                               "attention": checkpoints[r["checkpoint"]]["attention"]}
             for r in records if r["test"] == CLEAN}
    write_json(out / "metrics.json", next(iter(clean.values())) if len(clean) == 1 else clean)
    for line in [*results_table(records, summary, baseline, data, sweep.resolutions, sizes),
                 *file_lines(out, [out / "robustness.json", out / "robustness.csv", out / "metrics.json"], plots,
                             tensorboard)]:
        log.info(line)
    return {"summary": summary, "records": records, "metrics": clean, "checkpoints": checkpoints}


class _Progress:
    """A Rich progress bar over the whole sweep (silent when disabled); ``with`` gives ``advance(description)``."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total, self.bar, self.task, self.started = enabled, total, None, None, False

    def __enter__(self) -> Callable[[str], None]:
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description:<40}"), BarColumn(), MofNCompleteColumn(),
                                TimeElapsedColumn())
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

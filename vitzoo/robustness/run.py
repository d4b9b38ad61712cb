"""What eval.py calls: the robustness sweep of ``cfg.robustness`` over the checkpoints of ``cfg.ckpt_path``, through
:func:`vitzoo.robustness.evaluate` (which writes ``metrics.json``, ``robustness.json`` / ``.csv``, PNG plots and
TensorBoard scalars into the run directory and logs the results table and the paths of those files).
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import fields
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from omegaconf import DictConfig, OmegaConf

from vitzoo.options import SweepOptions
from vitzoo.training import read_checkpoint, run_record
from vitzoo.utils import instantiate_config

from .api import evaluate
from .inputs import FIELDS
from .sweep import Sweep

__all__ = ["evaluate_checkpoints", "checkpoint_entries", "given_transform"]

Entry = Tuple[Optional[str], str]  # (label or None, checkpoint path)
log = logging.getLogger(__name__)


def checkpoint_entries(spec: Any) -> List[Entry]:
    """``ckpt_path`` as (label, path) pairs: one path, a list of paths (label None), or {label: path}."""
    if OmegaConf.is_config(spec):
        spec = OmegaConf.to_container(spec, resolve=True)
    if not spec:
        raise ValueError(
            "no checkpoint given; run eval.py ckpt_path=<run dir>/checkpoints/last.ckpt "
            "(or ckpt_path=[a.ckpt,b.ckpt], or 'ckpt_path={softmax: a.ckpt, linear: b.ckpt}')"
        )
    if isinstance(spec, Mapping):
        return [(str(k), os.fspath(v)) for k, v in spec.items()]
    paths = [os.fspath(spec)] if isinstance(spec, (str, os.PathLike)) else [os.fspath(p) for p in spec]
    if len({os.path.abspath(p) for p in paths}) != len(paths):
        raise ValueError(f"ckpt_path lists a checkpoint twice: {paths}")
    return [(None, p) for p in paths]


def _with_baseline(entries: List[Entry], baseline: Optional[str]) -> Tuple[List[Entry], Optional[int]]:
    """Entries plus the baseline's index; a baseline path not among them is appended as 'baseline'."""
    if baseline is None:
        return entries, None
    for i, (label, path) in enumerate(entries):
        if baseline == label or os.path.abspath(baseline) == os.path.abspath(path):
            return entries, i
    if not os.path.isfile(baseline):
        labels = [lb for lb, _ in entries if lb is not None]
        raise ValueError(
            f"robustness.baseline={baseline!r} is neither a checkpoint label {labels} nor an "
            f"existing .ckpt file; name one of the evaluated checkpoints or a checkpoint path"
        )
    return [*entries, ("baseline", baseline)], len(entries)


def _data_identity(data: Any) -> str:
    """What tells two data configs apart: the data module class and its root folder (if any)."""
    name = str(data.get("_target_")).rsplit(".", 1)[-1]
    return f"{name} at {data['root']}" if data.get("root") else name


def _warn_if_trained_on_other_data(path: str, data: DictConfig) -> None:
    """The checkpoint's run recorded its data config: say so when this evaluation reads other data
    (same class count, so nothing else would notice; evaluating elsewhere on purpose stays possible)."""
    record = run_record(path, "config.yaml")
    trained = OmegaConf.load(record).get("data") if record is not None else None
    if trained is not None and _data_identity(trained) != _data_identity(data):
        log.warning(
            "%s was trained on %s but is evaluated on %s: pass the data=... (and data.root) it was "
            "trained with to evaluate it on its own data",
            path,
            _data_identity(trained),
            _data_identity(data),
        )


def _check_img_size(img_size: Optional[int], entries: List[Entry]) -> None:
    """``data.img_size`` given to eval.py must be every checkpoint's own size: the checkpoint fixes it."""
    if img_size is None:
        return
    sizes = [(read_checkpoint(path).get("hyper_parameters") or {}).get("img_size") for _, path in entries]
    other = [f"{path} ({size} px)" for (_, path), size in zip(entries, sizes) if size != img_size]
    if other:
        raise ValueError(
            f"data.img_size={img_size}, but each checkpoint is evaluated at the size it was trained at: "
            f"{', '.join(other)}; drop data.img_size, and measure other sizes with "
            f"robustness.resolutions=[1.5,2.0] (factors of the training size)"
        )


def given_transform(data: DictConfig, overrides: Sequence[str]) -> Dict[str, Any]:
    """The eval-transform fields of ``data`` (``data.recipe``, ``data.crop_pct``...) that ``overrides`` (the command
    line's, as Hydra records them) set: these win over each checkpoint's own."""
    named = {o.lstrip("+").partition("=")[0] for o in overrides}
    values = OmegaConf.to_container(data, resolve=True)
    return {k: values[k] for k in FIELDS if f"data.{k}" in named}


def evaluate_checkpoints(cfg: DictConfig, overrides: Sequence[str] = ()) -> Dict[str, Any]:
    """Run ``cfg.robustness`` on every checkpoint of ``cfg.ckpt_path`` over the val split of ``cfg.data``, each
    through the eval transform it was trained with but for the fields ``overrides`` (the command line) set."""
    options = OmegaConf.to_container(cfg.robustness, resolve=True)
    baseline = options.pop("baseline")
    Sweep(**{f.name: options[f.name] for f in fields(SweepOptions)})  # its one-line errors before any checkpoint
    entries, base_index = _with_baseline(checkpoint_entries(cfg.ckpt_path), baseline)
    _check_img_size(cfg.data.get("img_size"), entries)
    for _, path in entries:
        _warn_if_trained_on_other_data(path, cfg.data)
    data = functools.partial(instantiate_config, cfg.data)
    result = evaluate(
        entries,
        data,
        baseline=base_index,
        device=cfg.device,
        out_dir=cfg.paths.output_dir,
        transform=given_transform(cfg.data, overrides),
        **options,
    )
    return {
        "summary": result.summary,
        "records": result.records,
        "metrics": result.metrics,
        "checkpoints": result.checkpoints,
    }

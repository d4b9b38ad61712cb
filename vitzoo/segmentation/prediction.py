"""``vitzoo.segmentation.predict``: a segmentation checkpoint over images of any size -> mask PNGs (+ scores);
predict.py is its command line.

Masks are written in the training masks' own values (``LabelMap.to_source``: 0/255 in, 0/255 out), one
``<output>/<name>.png`` per image (TIFF stacks: one per page). With ``masks`` the predictions are scored
against them (``segmentation_scores``). Throughput (images/s) and peak memory are reported and written,
with the scores, to ``<output>/predict.json``.
"""

from __future__ import annotations

import logging
import resource
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from vitzoo.options import PredictOptions
from vitzoo.training import read_checkpoint
from vitzoo.training.options import options_from
from vitzoo.training.console import quiet_lightning
from vitzoo.utils import write_json

from .files import Sample, expand_pages, list_images, mask_stem, pair_samples
from .inference import sliding_window_probs
from .io import read_image, read_mask, write_mask
from .labels import LabelMap
from .module import SegmentationModule
from .scores import segmentation_scores

__all__ = ["load_segmenter", "predict"]

log = logging.getLogger(__name__)


def load_segmenter(ckpt_path: str) -> Tuple[SegmentationModule, Dict[str, Any]]:
    """(module in eval mode, the data module's hyperparameters) from a ``--config-name segment`` checkpoint.
    The backbone's export directory named in the checkpoint must still exist (it holds the architecture)."""
    checkpoint = read_checkpoint(ckpt_path)
    hparams = checkpoint.get("hyper_parameters") or {}
    if "backbone" not in hparams:
        raise ValueError(
            f"ckpt_path={ckpt_path!r} is not a segmentation checkpoint; pass one written by "
            f"`python train.py --config-name segment ...` (<run dir>/checkpoints/*.ckpt)"
        )
    module = SegmentationModule(**hparams)
    module.load_state_dict(checkpoint["state_dict"])
    return module.eval(), dict(checkpoint.get("datamodule_hyper_parameters") or {})


def _samples(masks_at: Optional[str], images: List[Path], data: Dict[str, Any]) -> List[Sample]:
    if masks_at is None:
        return [s for image in images for s in expand_pages(image, None)]
    suffix, masks = data.get("mask_suffix", ""), list_images(masks_at)
    stems = {image.stem for image in images}
    # masks of images not asked for are left out; when none matches, pairing names the unpaired files
    ours = [m for m in masks if mask_stem(m, suffix) in stems]
    return pair_samples(images, ours or masks, suffix)


def _device(name: str) -> torch.device:
    return torch.device("cuda" if name == "auto" and torch.cuda.is_available() else "cpu" if name == "auto" else name)


def _peak_memory_mib(device: torch.device) -> Tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "GPU memory allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process resident memory"


@torch.no_grad()
def predict(ckpt_path: str, input: str, output: str, **options: Any) -> Dict[str, Any]:
    """Segment ``input`` (a folder of images, one image or TIFF stack, or a glob) into ``output``; returns the
    summary written to ``<output>/predict.json`` (images/s, peak memory, and ``scores`` when ``masks`` is given).

    ``options`` are :class:`~vitzoo.options.PredictOptions`' fields, with their defaults: ``masks`` to score
    against, ``window`` / ``overlap`` / ``flip`` (None: the checkpoint's; ``module.window`` = the training crop),
    ``probs`` (also write ``<name>_probs.npy``), ``batch_size`` windows per forward pass, ``device``.
    """
    opts = options_from(PredictOptions, "predict", options)
    masks, probs, batch_size = opts.masks, opts.probs, opts.batch_size
    quiet_lightning()
    images = list_images(input)  # before the model: a wrong input costs no loading
    module, data = load_segmenter(ckpt_path)
    hp = module.hparams
    labels = LabelMap(hp.num_classes, hp.ignore_index, data.get("mask_values"), data.get("binary_threshold"))
    in_chans = data.get("in_chans", hp.in_chans)
    window = opts.window if opts.window is not None else hp.window
    overlap = opts.overlap if opts.overlap is not None else hp.overlap
    flip = opts.flip if opts.flip is not None else hp.flip
    samples = _samples(masks, images, data)
    device = _device(opts.device)
    module.to(device)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    confusion = torch.zeros(hp.num_classes, hp.num_classes, dtype=torch.int64)
    start = time.perf_counter()
    for sample in samples:
        image = torch.from_numpy(read_image(sample, in_chans)).permute(2, 0, 1).to(device)
        class_probs = sliding_window_probs(module.net, image, window, overlap, flip, batch_size)
        classes = class_probs.argmax(0).cpu()
        write_mask(labels.to_source(classes.numpy()), out / f"{sample.name}.png")
        if probs:
            np.save(out / f"{sample.name}_probs.npy", class_probs.cpu().half().numpy())
        if sample.mask is not None:
            confusion += _confusion(labels(read_mask(sample), sample.mask), classes, labels, sample)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    memory, memory_kind = _peak_memory_mib(device)
    summary: Dict[str, Any] = {
        "images": len(samples),
        "seconds": seconds,
        "images_per_s": len(samples) / seconds,
        "device": str(device),
        "peak_memory_mib": memory,
        "peak_memory_kind": memory_kind,
        "window": window,
        "overlap": overlap,
        "flip": flip,
        "output": str(out),
    }
    if masks is not None:
        summary["scores"] = segmentation_scores(confusion, module.class_names)
    write_json(out / "predict.json", summary)
    return summary


def _confusion(truth: np.ndarray, classes: torch.Tensor, labels: LabelMap, sample: Sample) -> torch.Tensor:
    if truth.shape != tuple(classes.shape):
        raise ValueError(
            f"{sample.mask} is {truth.shape[1]}x{truth.shape[0]} but its image {sample.image.name} is "
            f"{classes.shape[1]}x{classes.shape[0]}; masks must match their image's size"
        )
    truth = torch.from_numpy(truth)
    valid = truth != labels.ignore_index
    n = labels.num_classes
    return torch.bincount(truth[valid] * n + classes[valid], minlength=n * n).view(n, n)

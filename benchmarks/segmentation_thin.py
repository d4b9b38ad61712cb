"""Thin structures, side by side: vitzoo exports (ViTs, pyramids) under vitzoo's and smp's decoders against smp's
U-Net (ResNet-18, from scratch).

Every row trains on the same generated thin-wall set (``vitzoo.segmentation.thin``; walls = the object, class
1) for the same number of steps, with the same crops, batches (one seeded loader order), optimizer (AdamW,
warmup + cosine) and learning rate, then segments held-out 512 px images at their native size in sliding
windows of the crop size (overlap 0.25) and one 1024 px image for the prediction rate. A row is
``name=model,neck,loss,weights``; model is

* ``unet``: smp's U-Net on a ResNet-18 from random weights;
* an export directory (``python -m vitzoo.export ... --no-head``): vitzoo's SegmentationNet, SegFormer's MLP
  decoder over a pyramid's four levels, or over a plain ViT's ``simple_fpn``;
* ``smp-unet:<export dir>`` or ``smp-fpn:<export dir>``: smp's Unet or FPN decoder over the export through timm's
  universal encoder (``tu-local-dir:<export dir>``, the export's weights and attention), for pyramid exports;
  ``smp-unet+stem:<export dir>`` adds two 3x3 convolutions of the pixels as the U-Net's stride-2 level;

neck ``simple_fpn`` or ``none`` (smp rows: ``none``), loss one of ``module.loss``'s, weights ``balanced`` or ``none``.
Each row runs in its own subprocess, so its peak resident memory (VmHWM) is its own.

    python benchmarks/segmentation_thin.py --data data/thin --rows \\
        "linear+fpn=exports/lin,simple_fpn,ce+dice,balanced" "unet=unet,none,ce+dice,balanced" \\
        "pvt unet=smp-unet:exports/pvt_lin,none,ce+dice,balanced" \\
        --steps 150 --crop 128 --out docs/segmentation/thin_cpu

Runs of the same rows under other seeds (``--seed``) merge into one table of each row's mean and every seed's
value, the first row's beside each (``--merge run0.json run1.json --out merged``).

Columns: wall IoU and Dice on the held-out images, the same for "interior everywhere" (the majority baseline),
training images/s (forward, loss, backward and optimizer step; data loading left out), 1024 px prediction
images/s, and the peak resident memory of the row's process; below them, what intensity alone reaches (the
best global threshold of the blurred image, fitted on the training images).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import numpy as np
import torch
import torch.nn as nn

from vitzoo.segmentation import (
    SegmentationDataModule,
    SegmentationNet,
    create_backbone,
    segmentation_scores,
    sliding_window_probs,
)
from vitzoo.export import check_export
from vitzoo.runtime import cpu_model
from vitzoo.segmentation.decoder import pixel_stem
from vitzoo.segmentation.losses import LOSSES, SegmentationLoss, balanced_class_weights
from vitzoo.segmentation.thin import WALL, make_thin_dataset
from vitzoo.training.optim import build_scheduler

sys.path.insert(0, str(Path(__file__).parent))
from memory import status_mib  # noqa: E402

CLASSES = ["interior", "wall"]
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


SMP_DECODERS = {"smp-unet": ("Unet", 0), "smp-unet+stem": ("Unet", 32), "smp-fpn": ("FPN", 0)}  # smp class, stem
NECKS = ("simple_fpn", "none")
WEIGHTS = ("balanced", "none")
MODELS = "unet, an export directory, or smp-unet|smp-unet+stem|smp-fpn:<export dir>"


class PixelStem(nn.Module):
    """smp's universal encoder over a pyramid, its empty stride-2 level (the pyramid starts at stride 4) filled by
    vitzoo's ``pixel_stem`` (two 3x3 convolutions of the pixels, as a ResNet's first conv fills it), so the U-Net's
    stride-2 block sees where a thin structure lies: ``module.decoder=unet+stem``'s decoder, through smp's encoder."""

    def __init__(self, encoder: nn.Module, channels: int):
        super().__init__()
        self.encoder = encoder
        self.stem = pixel_stem(encoder.out_channels[0], channels)
        self.out_channels = [encoder.out_channels[0], channels, *encoder.out_channels[2:]]
        self.output_stride = encoder.output_stride

    def forward(self, images: torch.Tensor) -> List[torch.Tensor]:
        features = self.encoder(images)
        return [features[0], self.stem(images), *features[2:]]


class SmpNet(nn.Module):
    """An smp decoder (``Unet``, ``FPN``) over ``resnet18`` from random weights, or over a vitzoo export through
    timm's universal encoder (``tu-local-dir:<export>``: its weights and attention loaded, its four levels at
    strides 4-32), with ``stem`` channels of :class:`PixelStem` at stride 2 (U-Net only); images in [0, 1]
    normalised with the encoder's statistics (ImageNet's for the ResNet)."""

    stride = 32

    def __init__(self, decoder: str, encoder: str, num_classes: int = 2, stem: int = 0):
        super().__init__()
        import segmentation_models_pytorch as smp
        from segmentation_models_pytorch.base.initialization import initialize_decoder

        export = encoder != "resnet18"
        if export:
            check_export(encoder)
            encoder = f"tu-local-dir:{Path(encoder).resolve()}"
        self.net = getattr(smp, decoder)(encoder, encoder_weights=True if export else None, classes=num_classes)
        cfg = self.net.encoder.model.pretrained_cfg if export else dict(mean=IMAGENET_MEAN, std=IMAGENET_STD)
        if stem:  # the same decoder, built for the stem's channels at stride 2
            self.net.encoder = PixelStem(self.net.encoder, stem)
            self.net.decoder = type(self.net.decoder)(self.net.encoder.out_channels, (256, 128, 64, 32, 16), 5)
            initialize_decoder(self.net.decoder)
        self.register_buffer("mean", torch.tensor(cfg["mean"]).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(cfg["std"]).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net((images - self.mean) / self.std)


def parse_row(spec: str) -> Dict[str, str]:
    """``name=model,neck,loss,weights`` -> its fields; a malformed row is one ValueError line naming the fix (an
    export directory is looked for when its row starts, so a run may name one that an earlier row's time brings)."""
    name, eq, rest = spec.partition("=")
    fields = rest.split(",")
    if not eq or not name or len(fields) != 4:
        raise ValueError(f"row {spec!r}: write name=model,neck,loss,weights (model {MODELS})")
    row = dict(zip(("row", "model", "neck", "loss", "weights"), [name, *fields]))
    prefix, colon, _ = row["model"].partition(":")
    if colon and prefix not in SMP_DECODERS:
        raise ValueError(f"row {name!r}: model {row['model']!r} is none of: {MODELS}")
    if (row["model"] == "unet" or colon) and row["neck"] != "none":
        raise ValueError(f"row {name!r}: smp decoders build their own pyramid; give neck none, not {row['neck']}")
    for field, choices in (("neck", NECKS), ("loss", LOSSES), ("weights", WEIGHTS)):
        if row[field] not in choices:
            raise ValueError(f"row {name!r}: {field} {row[field]!r}; choose one of {'|'.join(choices)}")
    return row


def build(model: str, neck: str, channels: int) -> nn.Module:
    """The network of a parsed row: smp's U-Net on a ResNet-18, an smp decoder over an export, or vitzoo's
    SegmentationNet (SegFormer's MLP decoder) over an export's levels or its ``simple_fpn``."""
    if model == "unet":
        return SmpNet("Unet", "resnet18", len(CLASSES))
    prefix, colon, encoder = model.partition(":")
    if colon:
        if not Path(encoder).is_dir():
            raise ValueError(f"{encoder!r} is no export directory; pass the output of `python -m vitzoo.export`")
        decoder, stem = SMP_DECODERS[prefix]
        return SmpNet(decoder, encoder, len(CLASSES), stem)
    return SegmentationNet(create_backbone(model), len(CLASSES), channels, neck=None if neck == "none" else neck)


def _image(path: Path) -> torch.Tensor:
    from PIL import Image

    return torch.from_numpy(np.asarray(Image.open(path), np.float32) / 255).expand(3, -1, -1).contiguous()


def _scores(net: nn.Module, root: Path, window: int) -> Dict[str, float]:
    from PIL import Image

    confusion = torch.zeros(2, 2, dtype=torch.int64)
    for path in sorted((root / "image").iterdir()):
        classes = sliding_window_probs(net, _image(path), window, 0.25).argmax(0)
        truth = torch.from_numpy((np.asarray(Image.open(root / "label" / path.name)) == WALL).astype(np.int64))
        confusion += torch.bincount(truth.flatten() * 2 + classes.flatten(), minlength=4).view(2, 2)
    return segmentation_scores(confusion, CLASSES)


def run_row(args: argparse.Namespace, spec: str) -> Dict[str, float]:
    """Train and measure one row (in this process)."""
    row = parse_row(spec)
    model, neck, loss, weights = row["model"], row["neck"], row["loss"], row["weights"]
    torch.manual_seed(args.seed)
    dm = SegmentationDataModule(
        str(args.data / "train"),
        num_classes=2,
        class_names=CLASSES,
        img_size=args.crop,
        batch_size=args.batch,
        num_workers=0,
        mask_values={0: 1, 255: 0},
        repeats=1000,
        val_fraction=0.1,
        seed=args.seed,
    )
    dm.setup()
    class_weights = balanced_class_weights(dm.class_pixels["train"], 2) if weights == "balanced" else None
    criterion = SegmentationLoss(loss, 2, 255, class_weights)
    net = build(model, neck, args.decoder_channels)
    optimizer = torch.optim.AdamW(net.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = build_scheduler(optimizer, args.steps, args.steps // 10, 0.01)
    rss_before = status_mib("VmRSS")
    torch.manual_seed(args.seed)  # the same crops and batch order for every row
    batches, seconds, losses = iter(dm.train_dataloader()), 0.0, []
    net.train()
    for _ in range(args.steps):
        images, masks = next(batches)
        start = time.perf_counter()
        loss_value = criterion(net(images), masks)
        optimizer.zero_grad(set_to_none=True)
        loss_value.backward()
        optimizer.step()
        scheduler.step()
        seconds += time.perf_counter() - start
        losses.append(loss_value.item())
    net.eval()
    with torch.no_grad():
        scores = _scores(net, args.data / "test", args.crop)
        big = sorted((args.data / "big" / "image").iterdir())
        start = time.perf_counter()
        for path in big:
            sliding_window_probs(net, _image(path), args.crop, 0.25)
        predict_seconds = time.perf_counter() - start
    return {
        **row,
        "parameters_m": sum(p.numel() for p in net.parameters()) / 1e6,
        "iou_wall": scores["iou/wall"],
        "dice_wall": scores["dice/wall"],
        "majority_iou_wall": scores["majority/iou/wall"],
        "majority_dice_wall": scores["majority/dice/wall"],
        "miou": scores["miou"],
        "pixel_acc": scores["pixel_acc"],
        "majority_pixel_acc": scores["majority/pixel_acc"],
        "train_images_per_s": args.steps * args.batch / seconds,
        "train_seconds": seconds,
        "predict_1024_images_per_s": len(big) / predict_seconds,
        "peak_rss_mib": status_mib("VmHWM"),
        "rss_before_training_mib": rss_before,
        "first_loss": float(np.mean(losses[:5])),
        "last_loss": float(np.mean(losses[-5:])),
    }


def threshold_row(root: Path) -> Dict[str, float]:
    """The darkest pixels: the global threshold of the blurred image (sigma 1.5) with the best wall IoU on the
    training images, scored on the held-out ones (what intensity alone reaches)."""
    import cv2
    from PIL import Image

    def counts(part: str, thresholds: np.ndarray) -> np.ndarray:  # (thresholds, [TP, FP, FN])
        total = np.zeros((len(thresholds), 3))
        for path in sorted((root / part / "image").iterdir()):
            image = cv2.GaussianBlur(np.asarray(Image.open(path), np.float32), (0, 0), 1.5)
            wall = np.asarray(Image.open(root / part / "label" / path.name)) == WALL
            for i, t in enumerate(thresholds):
                dark = image < t
                total[i] += [(dark & wall).sum(), (dark & ~wall).sum(), (~dark & wall).sum()]
        return total

    thresholds = np.arange(40, 200, 5)
    tp, fp, fn = counts("train", thresholds).T
    best = thresholds[np.argmax(tp / (tp + fp + fn))]
    tp, fp, fn = counts("test", np.array([best]))[0]
    return {"threshold": float(best), "iou_wall": tp / (tp + fp + fn), "dice_wall": 2 * tp / (2 * tp + fp + fn)}


def make_data(root: Path, n: int, test: int, seed: int) -> None:
    """Training set (512 px), held-out 512 px test images and one 1024 px image, each its own seed."""
    for part, count, size, offset in (("train", n, 512, 0), ("test", test, 512, 1), ("big", 1, 1024, 2)):
        if not (root / part / "image").is_dir():
            make_thin_dataset(root / part, count, size, seed + 1000 * offset)


def table(rows: List[Dict[str, float]], dark: Dict[str, float]) -> str:
    head = (
        "| row | neck | loss, weights | wall IoU | wall Dice | train img/s | 1024 px predict img/s | "
        "peak RSS (GiB) | params (M) |\n|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = [
        f"| {r['row']} | {r['neck']} | {r['loss']}, {r['weights']} | {r['iou_wall']:.3f} | {r['dice_wall']:.3f} | "
        f"{r['train_images_per_s']:.2f} | {r['predict_1024_images_per_s']:.3f} | "
        f"{r['peak_rss_mib'] / 1024:.2f} | {r['parameters_m']:.2f} |"
        for r in rows
    ]
    base = rows[0]
    lines.append(
        f"| interior everywhere (majority) | | | {base['majority_iou_wall']:.3f} | "
        f"{base['majority_dice_wall']:.3f} | | | | |"
    )
    lines.append(
        f"| darkest pixels (blurred image < {dark['threshold']:.0f}, fitted on the training images) | | | "
        f"{dark['iou_wall']:.3f} | {dark['dice_wall']:.3f} | | | | |"
    )
    return head + "\n".join(lines)


def _spread(values: List[float], digits: int) -> str:
    """The mean, then each run's value: '0.690 (0.688 / 0.692)'."""
    each = " / ".join(f"{v:.{digits}f}" for v in values)
    return f"{np.mean(values):.{digits}f}" + (f" ({each})" if len(values) > 1 else "")


def merged_table(runs: List[dict]) -> str:
    """One row per row name over runs of the same rows (seeds): wall IoU, Dice and the rates as mean (each run), the
    first row's mean subtracted from the IoU and divided into the prediction rate (it is the baseline)."""
    names = [r["row"] for r in runs[0]["rows"]]
    by_name = {name: [next(r for r in run["rows"] if r["row"] == name) for run in runs] for name in names}

    def mean(name: str, key: str) -> float:
        return float(np.mean([r[key] for r in by_name[name]]))

    base = names[0]
    head = (
        f"| row | loss, weights | wall IoU | IoU - {base} | wall Dice | train img/s | 1024 px predict img/s | "
        f"predict vs {base} | peak RSS (GiB) | params (M) |\n|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for name in names:
        rows = by_name[name]
        lines.append(
            f"| {name} | {rows[0]['loss']}, {rows[0]['weights']} | {_spread([r['iou_wall'] for r in rows], 3)} | "
            f"{mean(name, 'iou_wall') - mean(base, 'iou_wall'):+.3f} | {_spread([r['dice_wall'] for r in rows], 3)} | "
            f"{_spread([r['train_images_per_s'] for r in rows], 2)} | "
            f"{_spread([r['predict_1024_images_per_s'] for r in rows], 3)} | "
            f"{mean(name, 'predict_1024_images_per_s') / mean(base, 'predict_1024_images_per_s'):.2f}x | "
            f"{max(r['peak_rss_mib'] for r in rows) / 1024:.2f} | {rows[0]['parameters_m']:.2f} |"
        )
    first, dark = by_name[base][0], runs[0]["darkest_pixels"]
    lines.append(
        f"| interior everywhere (majority) | | {first['majority_iou_wall']:.3f} | | {first['majority_dice_wall']:.3f} "
        "| | | | | |"
    )
    lines.append(
        f"| darkest pixels (blurred image < {dark['threshold']:.0f}, fitted on the training images) | | "
        f"{dark['iou_wall']:.3f} | | {dark['dice_wall']:.3f} | | | | | |"
    )
    return head + "\n".join(lines)


def merge(paths: List[Path], out: Optional[Path]) -> str:
    """The merged table of runs' ``--out`` JSON files (the same rows, in the same order), written to <out>.md and
    <out>.json when ``out`` is given; a run with other rows is one error naming them."""
    runs, names = [], []
    for path in paths:
        try:
            runs.append(json.loads(path.read_text()))
            names.append([r["row"] for r in runs[-1]["rows"]])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise SystemExit(f"{path}: not a run's --out .json file ({type(error).__name__}: {error})") from None
    for path, rows in zip(paths, names):
        if rows != names[0]:
            raise SystemExit(f"{path} holds rows {rows}, {paths[0]} {names[0]}: merge runs of the same rows")
    setups = "\n".join(f"- run {i + 1} ({path.name}): {run['setup']}" for i, (path, run) in enumerate(zip(paths, runs)))
    text = f"{len(runs)} runs of the same rows, each cell the mean (each run's value, in this order):\n{setups}\n\n"
    text += merged_table(runs) + "\n"
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.with_suffix(".md").write_text(text)
        out.with_suffix(".json").write_text(
            json.dumps({"runs": [p.name for p in paths], "merged": runs}, indent=1) + "\n"
        )
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("data/thin"), help="generated here when missing")
    parser.add_argument("--rows", nargs="+", help="name=model,neck,loss,weights (see the docstring)")
    parser.add_argument(
        "--merge", nargs="+", type=Path, help="runs' --out .json files (other seeds) to merge, no training"
    )
    parser.add_argument("--n", type=int, default=32, help="training images of 512 px (default 32)")
    parser.add_argument("--test", type=int, default=4, help="held-out 512 px images (default 4)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--crop", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--decoder-channels", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="write <out>.csv, <out>.md and <out>.json (after every row)")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # a row, run by the parent in a subprocess
    args = parser.parse_args()
    if args.only:
        print(json.dumps(run_row(args, args.only)))
        return
    if args.merge:
        if args.rows:
            parser.error("--merge merges finished runs and trains nothing: drop --rows, or run them without --merge")
        print(merge(args.merge, args.out), end="")
        return
    if not args.rows:
        parser.error("give --rows to run (or --merge to merge runs)")
    for spec in args.rows:
        try:
            parse_row(spec)
        except ValueError as error:
            parser.error(str(error))
    make_data(args.data, args.n, args.test, args.seed)
    dark, rows = threshold_row(args.data), []
    started_at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    for spec in args.rows:
        started = time.perf_counter()
        child = subprocess.run(
            [sys.executable, __file__, *sys.argv[1:], "--only", spec], capture_output=True, text=True
        )
        if child.returncode:
            sys.exit(f"row {spec!r} failed: {(child.stderr.strip().splitlines() or ['no output'])[-1]}")
        rows.append({**json.loads(child.stdout.strip().splitlines()[-1]), "load_average_1min": os.getloadavg()[0]})
        print(f"{spec}: {time.perf_counter() - started:.0f} s, wall IoU {rows[-1]['iou_wall']:.3f}", flush=True)
        if args.out:  # after every row: a run cut short keeps the rows it measured
            write(args.out, setup(args, started_at, rows), rows, dark)
    print(setup(args, started_at, rows) + "\n" + table(rows, dark))


def setup(args: argparse.Namespace, started_at: str, rows: List[Dict[str, float]]) -> str:
    """The machine, the budget and the load on the cores (the 1-minute load average after each row)."""
    loads = ", ".join(f"{r['load_average_1min']:.1f}" for r in rows)
    return (
        f"{cpu_model()}, {torch.get_num_threads()} threads, torch {torch.__version__}, {started_at}, "
        f"1-minute load average after each row {loads}; {args.steps} steps x batch {args.batch} of {args.crop} px "
        f"crops, {args.n} training images of 512 px, {args.test} held-out 512 px images, seed {args.seed}"
    )


def write(out: Path, machine: str, rows: List[Dict[str, float]], dark: Dict[str, float]) -> None:
    """<out>.csv, <out>.md and <out>.json."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    out.with_suffix(".md").write_text(machine + "\n\n" + table(rows, dark) + "\n")
    out.with_suffix(".json").write_text(
        json.dumps({"setup": machine, "rows": rows, "darkest_pixels": dark}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()

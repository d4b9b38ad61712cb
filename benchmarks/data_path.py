"""The two training data paths side by side: albumentations in DataLoader workers vs the device-resident
path (``data.device_cache``), on the same image folder, in one run.

For each path: the one-time cost (building the decoded cache; reading it back on a later run) and the
rate at which it hands augmented, normalised training batches to the training loop (img/s, no model),
plus the CPU time it spends per image. The device path runs on ``--device`` (CPU tensors here; CUDA on a
GPU machine, where it never touches the CPU per batch).

    python benchmarks/data_path.py --data ../shared/data/cifar10-train-jpg.tar.gz
    python benchmarks/data_path.py --data <tree> --device cuda --batch-size 512
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

from zoo_data import resolve_data  # noqa: E402  (a sibling module: the zoo's tar.gz / folder handling)

from vitzoo.data import ImageFolderDataModule  # noqa: E402
from vitzoo.data.device_data import DeviceBatches  # noqa: E402
from vitzoo.data.transforms import CROP_PADDING, HFLIP  # noqa: E402
from vitzoo.models.default_cfg import CIFAR_MEAN, CIFAR_STD  # noqa: E402


def folder_module(data: str, img_size: int, batch_size: int, device_cache: bool, **kwargs) -> ImageFolderDataModule:
    """The image folder (or CIFAR .tar.gz) ``data`` as a set-up data module (CIFAR-10 statistics, 10% val)."""
    dm = ImageFolderDataModule(
        str(resolve_data(Path(data))),
        img_size=img_size,
        batch_size=batch_size,
        val_fraction=0.1,
        device_cache=device_cache,
        mean=CIFAR_MEAN,
        std=CIFAR_STD,
        **kwargs,
    )
    dm.setup("fit")
    return dm


def device_batches(dm: ImageFolderDataModule, device) -> DeviceBatches:
    """Training batches of ``dm``'s decoded split on ``device`` (basic policy: pad-crop and flip)."""
    return DeviceBatches(
        *dm.device_splits["train"],
        dm.batch_size,
        dm.mean,
        dm.std,
        train=True,
        device=device,
        crop_padding=CROP_PADDING,
        hflip=HFLIP,
    )


def endless(loader):
    """The batches of ``loader``, epoch after epoch."""
    return itertools.chain.from_iterable(itertools.repeat(loader))


def _cpu_seconds() -> float:
    """CPU time of this process and of its live children (DataLoader workers), from /proc."""
    total, tick = time.process_time(), os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == os.getpid():  # ppid
            total += (int(fields[11]) + int(fields[12])) / tick  # utime + stime
    return total


def _rate(loader, batches: int, device: torch.device):
    """(img/s, CPU seconds per 1,000 images) over ``batches`` batches after one warm-up batch."""
    it = endless(loader)
    next(it)
    count, wall, cpu = 0, time.perf_counter(), _cpu_seconds()
    for _ in range(batches):
        x, _ = next(it)
        x = x.to(device, non_blocking=True)
        count += len(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter() - wall, _cpu_seconds() - cpu
    return count / wall, 1000 * cpu / count


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="image folder (train/<class>/*) or the CIFAR .tar.gz")
    p.add_argument("--img-size", type=int, default=32)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--batches", type=int, default=100)
    p.add_argument("--workers", type=int, default=1, help="albumentations path: DataLoader workers")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    shutil.rmtree(resolve_data(Path(args.data)) / ".vitzoo-cache", ignore_errors=True)
    rows = []

    for workers in sorted({0, args.workers}):
        start = time.perf_counter()
        dm = folder_module(args.data, args.img_size, args.batch_size, False, num_workers=workers)
        setup_s = time.perf_counter() - start
        rate, cpu = _rate(dm.train_dataloader(), args.batches, device)
        rows.append((f"albumentations, {workers} worker(s)", f"{setup_s:.1f} s (file scan)", rate, cpu))

    for label in ("build", "read"):
        start = time.perf_counter()
        dm = folder_module(args.data, args.img_size, args.batch_size, True, num_workers=0)
        loader = device_batches(dm, device)
        setup_s = time.perf_counter() - start
        rate, cpu = _rate(loader, args.batches, device)
        rows.append((f"device path on {device.type}, cache {label}", f"{setup_s:.1f} s", rate, cpu))

    print(
        f"# {len(dm.device_splits['train'][1])} training images at {args.img_size} px, batch {args.batch_size}, "
        f"{args.batches} batches; torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print("| data path | one-time setup | img/s | CPU s per 1,000 img (workers included) | img/s vs the first row |")
    print("|---|---|---|---|---|")
    for name, setup, rate, cpu in rows:
        print(f"| {name} | {setup} | {rate:,.0f} | {cpu:.2f} | {rate / rows[0][2]:.1f}x |")


if __name__ == "__main__":
    main()

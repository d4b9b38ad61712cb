"""Training-loader throughput at ImageNet scale: the image folder (``data=imagefolder``) against its litdata shards
(``data=shards``), both with the DeiT recipe at 224 px, 1 and 2 loader workers, side by side in one run; and the
shard folder's size against the JPEGs'.

A folder of ``--images`` JPEGs of ImageNet's typical size (about 500 x 375, ``--classes`` classes) is generated
under ``--work`` (smooth shapes and gradients with mild noise, so that they compress like photographs), packed with
``python -m vitzoo.data.pack``'s function, and each loader is timed over ``--measure`` images after its first batch
(worker start-up excluded), ``--rounds`` times in alternation; the table gives the best round of each (the least
disturbed by other work on the machine). No model: images/s is what the loader hands the training loop.

    python benchmarks/loader_throughput.py --out docs/benchmarks/loader_cpu
"""

from __future__ import annotations

import argparse
import csv
import os
import time
from pathlib import Path

import cv2
import numpy as np

from vitzoo.data import ImageFolderDataModule
from vitzoo.data.pack import pack
from vitzoo.data.shards import ShardsDataModule


def photo(rng: np.random.Generator, h: int, w: int) -> np.ndarray:
    """A synthetic photograph: a colour gradient, a few filled ellipses and rectangles, mild sensor noise."""
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = (
        rng.uniform(0, 255, 3)
        + rng.uniform(-120, 120, 3) * (x / w)[..., None]
        + rng.uniform(-120, 120, 3) * (y / h)[..., None]
    )
    image = np.clip(base, 0, 255).astype(np.uint8)
    for _ in range(rng.integers(4, 10)):
        colour = tuple(int(c) for c in rng.integers(0, 256, 3))
        centre = (int(rng.integers(0, w)), int(rng.integers(0, h)))
        if rng.random() < 0.5:
            axes = (int(rng.integers(10, w // 3)), int(rng.integers(10, h // 3)))
            cv2.ellipse(image, centre, axes, float(rng.uniform(0, 180)), 0, 360, colour, -1)
        else:
            corner = (centre[0] + int(rng.integers(10, w // 3)), centre[1] + int(rng.integers(10, h // 3)))
            cv2.rectangle(image, centre, corner, colour, -1)
    image = cv2.GaussianBlur(image, (0, 0), 1.0)
    return np.clip(image + rng.normal(0, 12, image.shape), 0, 255).astype(np.uint8)


def generate(folder: Path, images: int, classes: int, seed: int = 0) -> None:
    """``folder/train/c<k>/<i>.jpg`` (quality 90), about ImageNet's typical size; kept when already there."""
    if (folder / "train").is_dir() and sum(1 for _ in (folder / "train").rglob("*.jpg")) == images:
        return
    rng = np.random.default_rng(seed)
    for i in range(images):
        target = folder / "train" / f"c{i % classes}" / f"{i}.jpg"
        target.parent.mkdir(parents=True, exist_ok=True)
        h, w = int(rng.integers(300, 450)), int(rng.integers(400, 560))
        cv2.imwrite(str(target), cv2.cvtColor(photo(rng, h, w), cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def rate(dm, measure: int) -> float:
    """Images per second the training loader of ``dm`` yields after its first batch, over ``measure`` images."""
    loader = dm.train_dataloader()
    batches = iter(loader)
    next(batches)
    seen, start = 0, time.perf_counter()
    for images, _ in batches:
        seen += len(images)
        if seen >= measure:
            break
    return seen / (time.perf_counter() - start)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default="/tmp/vitzoo-loader-bench", help="where the generated data goes")
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--measure", type=int, default=1024, help="images timed per loader and round")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None, help="write OUT.txt and OUT.csv")
    args = parser.parse_args(argv)

    work = Path(args.work)
    generate(work / "jpeg", args.images, args.classes)
    shards = work / f"shards-{args.images}"
    if not (shards / "vitzoo.json").is_file():
        pack(work / "jpeg", shards, val_fraction=0.1)
    jpeg_mb, shard_mb = folder_bytes(work / "jpeg") / 2**20, folder_bytes(shards) / 2**20

    common = dict(img_size=224, batch_size=args.batch_size, recipe="deit", aug=None)  # aug=None: DEIT_AUG as it is
    paths = {
        "imagefolder": lambda w: ImageFolderDataModule(str(work / "jpeg"), val_fraction=0.1, num_workers=w, **common),
        "shards": lambda w: ShardsDataModule(str(shards), num_workers=w, **common),
    }
    best = {}
    for _ in range(args.rounds):
        for workers in (int(w) for w in args.workers.split(",")):
            for name, make in paths.items():
                dm = make(workers)
                dm.setup("fit")
                best[name, workers] = max(best.get((name, workers), 0.0), rate(dm, args.measure))

    rows = [
        dict(path=name, workers=w, images_per_s=round(r, 1), vs_imagefolder=round(r / best["imagefolder", w], 2))
        for (name, w), r in sorted(best.items())
    ]
    lines = [
        f"Training loader, DeiT recipe at 224 px (RandomResizedCrop, flip, RandAugment m9, erasing 0.25), "
        f"batch {args.batch_size}, {args.images} generated JPEGs of about 500 x 375 px, best of {args.rounds} "
        f"rounds of {args.measure} images each; os.cpu_count()={os.cpu_count()}",
        "",
        f"{'path':<12} {'workers':>7} {'images/s':>9} {'vs folder':>9}",
    ]
    lines += [f"{r['path']:<12} {r['workers']:>7} {r['images_per_s']:>9.1f} {r['vs_imagefolder']:>9.2f}" for r in rows]
    lines += [
        "",
        f"size: JPEG folder {jpeg_mb:.1f} MiB ({jpeg_mb * 2**10 / args.images:.0f} KiB an image), shard "
        f"folder {shard_mb:.1f} MiB ({shard_mb / jpeg_mb:.3f} x: the files as they are, labels, indexes)",
    ]
    print("\n".join(lines))
    if args.out:
        Path(f"{args.out}.txt").write_text("\n".join(lines) + "\n")
        with open(f"{args.out}.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()

"""Corruption cost beside the zoo ViT's forward pass, and vitzoo's batched ops beside imagecorruptions.

    python benchmarks/corruption_speed.py --data ../shared/data/cifar10-train-jpg.tar.gz --threads 1

One run on ``--images`` CIFAR images (2,000: the first 200 of each class) at 32 px, in batches of ``--batch``:

1. every corruption (the 15 of CIFAR-10-C, then the 4 extra) at severities 1-5 with the CIFAR-10-C
   constants: images/s (over the five passes) and the time of one pass over the zoo ViT's forward time on
   the same images (``vit_cifar``, softmax attention, inference, the mean/std normalisation included): what
   a corruption adds to its pass of a 15 x 5 sweep;
2. vitzoo beside imagecorruptions 1.1.2 (numpy, one image at a time, as people run it) at severity 3 with
   the ImageNet-C constants it carries (vitzoo: ``protocol="imagenet"``), both on the first
   ``--reference-images`` of the same images, images/s. Needs imagecorruptions (``pip install --no-deps
   imagecorruptions==1.1.2 scikit-image``); it is loaded with the shims of tests/corruption_reference.py.

``--out`` also writes the rows as CSV.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import io
import os
import statistics
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]

import vitzoo  # noqa: E402
from vitzoo.models.default_cfg import CIFAR_MEAN, CIFAR_STD  # noqa: E402
from vitzoo.robustness import corrupt, list_corruptions  # noqa: E402
from vitzoo.runtime import cpu_model  # noqa: E402


def cifar_images(data: Path, count: int) -> torch.Tensor:
    """The first ``count // 10`` JPEGs (by name) of each class of a CIFAR-10 tree (train/<class>/*.jpg) or
    its .tar.gz, as (count, 3, 32, 32) float32 in [0, 1]."""
    per_class = count // 10
    if data.is_dir():
        files = {c.name: sorted(c.glob("*.jpg"))[:per_class] for c in sorted((data / "train").iterdir())}
        blobs = [f.read_bytes() for c in sorted(files) for f in files[c]]
    else:
        found: dict[str, list[tuple[str, bytes]]] = {}
        with tarfile.open(data) as tar:
            for member in tar:
                parts = member.name.split("/")
                if member.isfile() and member.name.endswith(".jpg") and len(parts) == 3:
                    found.setdefault(parts[1], []).append((parts[2], tar.extractfile(member).read()))
        blobs = [b for c in sorted(found) for _, b in sorted(found[c])[:per_class]]
    if len(blobs) != per_class * 10:
        raise SystemExit(f"--data {data}: found {len(blobs)} of the {per_class * 10} images asked for")
    arrays = [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in blobs]
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).float() / 255


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def corruption_pass(x: torch.Tensor, name: str, severity: int, protocol: str, batch: int) -> None:
    g = torch.Generator().manual_seed(severity)
    for chunk in x.split(batch):
        corrupt(chunk, name, severity, protocol=protocol, generator=g)


def forward_seconds(x: torch.Tensor, batch: int, repeats: int) -> float:
    """Median seconds of one inference pass of the zoo ViT over ``x`` (normalisation included)."""
    model = vitzoo.create_model("vit_cifar", attention="softmax", num_classes=10).eval()
    mean, std = torch.tensor(CIFAR_MEAN).view(1, 3, 1, 1), torch.tensor(CIFAR_STD).view(1, 3, 1, 1)

    def run():
        with torch.inference_mode():
            for chunk in x.split(batch):
                model((chunk - mean) / std)

    with torch.inference_mode():
        model((x[:batch] - mean) / std)  # warm-up
    return statistics.median(timed(run) for _ in range(repeats))


def reference_module():
    """imagecorruptions' corruption functions with tests/corruption_reference.py's shims, or None."""
    if importlib.util.find_spec("imagecorruptions") is None:
        return None
    sys.path.insert(0, str(ROOT / "tests"))
    import corruption_reference

    return corruption_reference.load()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, type=Path, help="CIFAR-10 JPEG tree (train/<class>/*.jpg) or its .tar.gz")
    p.add_argument("--images", type=int, default=2000)
    p.add_argument("--batch", type=int, default=500)
    p.add_argument("--reference-images", type=int, default=200)
    p.add_argument("--forward-repeats", type=int, default=3)
    p.add_argument("--corruptions", help="comma-separated names (default: all 19)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", type=Path, help="also write the rows to this CSV file")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    x = cifar_images(args.data, args.images)
    names = list_corruptions("benchmark") + list_corruptions("extra")
    if args.corruptions:
        unknown = sorted(set(args.corruptions.split(",")) - set(names))
        if unknown:
            raise SystemExit(f"--corruptions: unknown {unknown}; choose from {names}")
        names = [n for n in names if n in args.corruptions.split(",")]
    print(
        f"# {len(x)} CIFAR-10 images (32 px), batch {args.batch}; {cpu_model()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; torch {torch.__version__}, "
        f"{torch.get_num_threads()} thread(s)"
    )

    for name in names:  # build caches (frost images, glass schedules) outside the timings
        corrupt(x[:8], name, 3, protocol="cifar")
        corrupt(x[:8], name, 3, protocol="imagenet")
    fwd = forward_seconds(x, args.batch, args.forward_repeats)
    print(
        f"\nzoo ViT (vit_cifar, softmax) forward: {fwd:.2f} s for {len(x)} images = {len(x) / fwd:,.0f} img/s "
        f"(median of {args.forward_repeats})\n"
    )
    print("| corruption | vitzoo img/s (CIFAR-10-C, severities 1-5) | one pass / ViT forward |")
    print("|---|---|---|")
    rows = []
    for name in names:
        seconds = [timed(lambda: corruption_pass(x, name, s, "cifar", args.batch)) for s in range(1, 6)]
        per_pass = sum(seconds) / len(seconds)
        rows.append(
            {
                "corruption": name,
                "extra": name in list_corruptions("extra"),
                "vitzoo_cifar_img_s": len(x) / per_pass,
                "pass_over_forward": per_pass / fwd,
            }
        )
        print(f"| {name}{' (extra)' if rows[-1]['extra'] else ''} | {len(x) / per_pass:,.0f} | {per_pass / fwd:.3f} |")
    bench = [r for r in rows if not r["extra"]]
    total = sum(r["pass_over_forward"] for r in bench) * 5
    print(
        f"\nthe {len(bench)} x 5 sweep: corruptions {total:.1f} forward passes' time beside the {5 * len(bench)} "
        f"forward passes ({100 * total / (total + 5 * len(bench)):.0f}% of the sweep)"
    )

    ref = reference_module()
    if ref is None:
        print(
            "\nimagecorruptions is not installed: `pip install --no-deps imagecorruptions==1.1.2 scikit-image` "
            "for the comparison"
        )
    else:
        sub = x[: args.reference_images]
        u8 = [(im * 255).round().byte().permute(1, 2, 0).numpy() for im in sub]
        print(
            f"\n| corruption (severity 3, ImageNet-C constants, {len(sub)} images) | vitzoo img/s | "
            f"imagecorruptions img/s | vitzoo / imagecorruptions |"
        )
        print("|---|---|---|---|")
        for row in rows:
            name = row["corruption"]
            fn = getattr(ref, name)
            ours = timed(lambda: corruption_pass(sub, name, 3, "imagenet", args.batch))
            theirs = timed(lambda: [np.uint8(fn(Image.fromarray(im), 3)) for im in u8])
            row.update(vitzoo_imagenet_img_s=len(sub) / ours, imagecorruptions_img_s=len(sub) / theirs)
            print(f"| {name} | {len(sub) / ours:,.0f} | {len(sub) / theirs:,.0f} | {theirs / ours:.1f}x |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()

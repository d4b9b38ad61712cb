"""High-resolution feature extraction from exports: time and peak memory, linear vs softmax, side by side.

    python benchmarks/export_features.py                          # 1024 x 1024, patch 8 (16,384 tokens)
    python benchmarks/export_features.py --img-size 512 --reps 3

For each attention an export of the ``vit_cifar`` shape (192 wide, 9 blocks, 3 heads) with patch 8 is
written, then loaded the way a segmentation user does (``timm.create_model('local-dir:...',
features_only=True)``) in a fresh process, which times ``--reps`` forward passes of one image
(after a warm-up) and reports the peak resident memory above its level after loading the model
(``VmHWM``, reset via ``/proc/self/clear_refs``). The weights are random: cost does not depend on them.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from memory import status_mib  # a sibling module: scripts run from benchmarks/ see it

ATTENTIONS = ("linear", "softmax")


def worker(export_dir: str, img_size: int, reps: int) -> dict:
    import timm

    import vitzoo  # noqa: F401  (registers the architectures)

    model = timm.create_model(f"local-dir:{export_dir}", pretrained=True, features_only=True).eval()
    x = torch.randn(1, 3, img_size, img_size)
    with torch.inference_mode():
        maps = model(x)  # warm-up
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base = status_mib("VmRSS")
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            model(x)
            times.append(time.perf_counter() - start)
    return {"seconds": min(times), "peak_mb": status_mib("VmHWM") - base,
            "shapes": [list(m.shape) for m in maps]}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--img-size", type=int, default=1024)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.reps)))
        return
    import vitzoo
    from vitzoo.export import export_model

    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for att in ATTENTIONS:
            torch.manual_seed(0)
            model = vitzoo.create_model("vit_cifar", attention=att, patch_size=args.patch_size, num_classes=0)
            export_model(model, Path(tmp) / att, head=False)
            proc = subprocess.run([sys.executable, __file__, "--worker", str(Path(tmp) / att), str(args.img_size),
                                   "--reps", str(args.reps)], capture_output=True, text=True)
            if proc.returncode:
                raise SystemExit(f"{att} failed:\n{proc.stderr[-2000:]}")
            results[att] = json.loads(proc.stdout.strip().splitlines()[-1])
    tokens = (args.img_size // args.patch_size) ** 2
    print(f"# features_only from a local-dir export, vit_cifar shape, patch {args.patch_size}, {args.img_size}x"
          f"{args.img_size} ({tokens:,} tokens), batch 1, CPU {torch.get_num_threads()} threads, best of {args.reps}")
    print(f"feature maps: {results['linear']['shapes']}")
    print("| attention | seconds | peak MB above the loaded model |\n|---|---|---|")
    for att, r in results.items():
        print(f"| {att} | {r['seconds']:.2f} | {r['peak_mb']:.0f} |")
    print(f"softmax / linear time: {results['softmax']['seconds'] / results['linear']['seconds']:.1f}x")


if __name__ == "__main__":
    main()

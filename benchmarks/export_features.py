"""High-resolution feature extraction from exports: time and peak memory, linear vs softmax, side by side.

    python benchmarks/export_features.py                          # 1024 x 1024, patch 8 (16,384 tokens)
    python benchmarks/export_features.py --img-size 512 --reps 3
    python benchmarks/export_features.py --attentions linear softmax pola inline mlla rala lion
    python benchmarks/export_features.py --exports softmax=<teacher>/export linear=<student>/export

For each attention an export of the ``vit_cifar`` shape (192 wide, 9 blocks, 3 heads) with patch 8 is
written (or, with ``--exports``, the given export folders are used as they are, e.g. a trained softmax teacher
and the network converted from it), then loaded the way a segmentation user does (``timm.create_model(
'local-dir:...', features_only=True)``) in a fresh process, which times ``--reps`` forward passes of one image
(after a warm-up at ``--warmup-size``) and reports the peak resident memory above its level after loading the
model (``VmHWM``, reset via ``/proc/self/clear_refs``). Cost does not depend on the weights.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from memory import timed_passes  # a sibling module: scripts run from benchmarks/ see it

ATTENTIONS = ("linear", "softmax")


def worker(export_dir: str, img_size: int, reps: int, warmup_size: int) -> dict:
    import timm

    import vitzoo  # noqa: F401  (registers the architectures)

    model = timm.create_model(f"local-dir:{export_dir}", pretrained=True, features_only=True).eval()
    x = torch.randn(1, 3, img_size, img_size)
    with torch.inference_mode():
        model(torch.randn(1, 3, warmup_size, warmup_size))
        seconds, peak, maps = timed_passes(lambda: model(x), reps)
    return {"seconds": seconds, "peak_mb": peak, "shapes": [list(m.shape) for m in maps]}


def export_patch_size(export_dir: Path) -> int:
    return json.loads((export_dir / "config.json").read_text())["model_args"]["patch_size"]


def measure(exports: dict, args) -> dict:
    """Each export's worker result, one fresh process per export, one after the other."""
    results = {}
    for name, export_dir in exports.items():
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--worker",
                str(export_dir),
                str(args.img_size),
                "--reps",
                str(args.reps),
                "--warmup-size",
                str(args.warmup_size or args.img_size),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
        results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return results


def parse_exports(items: list) -> dict:
    exports = {}
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not (Path(folder) / "config.json").is_file():
            raise SystemExit(f"--exports {item!r}: give NAME=<export folder holding config.json>")
        exports[name] = Path(folder)
    if len({export_patch_size(d) for d in exports.values()}) != 1:
        raise SystemExit("--exports: the exports have different patch sizes; compare exports of one shape")
    return exports


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--img-size", type=int, default=1024)
    p.add_argument("--patch-size", type=int, default=8)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--warmup-size", type=int, default=None, help="the warm-up pass's image size (default --img-size)")
    p.add_argument(
        "--attentions",
        nargs="+",
        default=list(ATTENTIONS),
        metavar="NAME",
        help="registered mechanisms to export and time (default: linear softmax)",
    )
    p.add_argument(
        "--exports",
        nargs="+",
        metavar="NAME=DIR",
        help="time these export folders instead of random-weight vit_cifar exports",
    )
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.reps, args.warmup_size)))
        return
    if args.exports:
        exports = parse_exports(args.exports)
        patch, what = export_patch_size(next(iter(exports.values()))), "given exports"
        results = measure(exports, args)
    else:
        import vitzoo
        from vitzoo.export import export_model

        patch, what = args.patch_size, "vit_cifar shape, random weights"
        with tempfile.TemporaryDirectory() as tmp:
            for att in args.attentions:
                torch.manual_seed(0)
                model = vitzoo.create_model("vit_cifar", attention=att, patch_size=patch, num_classes=0)
                export_model(model, Path(tmp) / att, head=False)
            results = measure({att: Path(tmp) / att for att in args.attentions}, args)
    tokens = (args.img_size // patch) ** 2
    print(
        f"# features_only from a local-dir export ({what}), patch {patch}, {args.img_size}x{args.img_size} "
        f"({tokens:,} tokens), batch 1, CPU {torch.get_num_threads()} threads, best of {args.reps}"
    )
    print(f"feature maps: {next(iter(results.values()))['shapes']}")
    print("| export | seconds | img/s | peak MB above the loaded model |\n|---|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['seconds']:.2f} | {1 / r['seconds']:.3g} | {r['peak_mb']:.0f} |")
    first, *rest = results
    for name in rest:
        print(f"{first} / {name} time: {results[first]['seconds'] / results[name]['seconds']:.1f}x")


if __name__ == "__main__":
    main()

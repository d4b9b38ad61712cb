"""``python -m vitzoo.export CKPT OUT [--no-head] [--onnx] [--force]``: a training checkpoint -> a timm hub export
dir."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitzoo.errors import MissingDependency
from vitzoo.extras import require_extra


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m vitzoo.export",
        description="Export a Lightning checkpoint as model.safetensors + config.json (timm hub layout). "
        "Load it with `import vitzoo; timm.create_model('local-dir:OUT', pretrained=True)`.",
    )
    parser.add_argument("ckpt", help="training checkpoint (.ckpt) written by train.py")
    parser.add_argument("out", help="export directory to write (created if missing; must be empty unless --force)")
    parser.add_argument(
        "--no-head",
        dest="head",
        action="store_false",
        help="drop the classifier head (num_classes=0): a backbone for dense prediction",
    )
    parser.add_argument(
        "--onnx",
        action="store_true",
        help="also write OUT/model.onnx, one self-contained file (weights above 2 GiB beside it in model.onnx.data; "
        "dynamic batch axis, the training image size; vitzoo.export.onnx.export_onnx takes another); "
        "needs the onnx extra",
    )
    parser.add_argument(
        "--force",
        action="store_true",
        help="write into OUT even when it holds files (an existing export there is replaced)",
    )
    args = parser.parse_args(argv)
    ckpt, out = Path(args.ckpt), Path(args.out)
    if not ckpt.is_file():  # before Lightning and the pipeline load
        what = "is a folder" if ckpt.is_dir() else "does not exist"
        print(
            f"error: checkpoint {args.ckpt!r} {what}; pass a .ckpt written by train.py, e.g. "
            "logs/train/runs/<date>_<time>/checkpoints/last.ckpt",
            file=sys.stderr,
        )
        return 2
    if out.is_dir() and any(out.iterdir()) and not args.force:
        print(
            f"error: {out} is not empty; pass another folder, or --force to write the export into it "
            f"(replacing an export there)",
            file=sys.stderr,
        )
        return 2
    try:
        require_extra("train", "python -m vitzoo.export (a Lightning checkpoint)")
        if args.onnx:
            require_extra("onnx", "--onnx")
        from .checkpoint import export_checkpoint

        out = export_checkpoint(args.ckpt, out, head=args.head)
        if args.onnx:
            from .onnx import export_onnx

            print(f"wrote {export_onnx(out)}")
    except (ValueError, FileNotFoundError, MissingDependency) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"exported {args.ckpt} -> {out} (timm.create_model('local-dir:{out}', pretrained=True))")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""ONNX Runtime (CPU) vs eager PyTorch inference: vit_linear vs vit_softmax, one run, side by side.

    python benchmarks/onnx_cpu.py --img-size 1024 --patch-size 8 --repeats 3

Prints a table of the median seconds per batch and the ratio eager / onnxruntime; the ViT is vit_tiny
(random weights: the cost does not depend on them), exported with the dynamo ONNX exporter.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

import vitzoo


def _median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--img-size", type=int, default=1024)
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--arch", default="vit_tiny")
    args = parser.parse_args()
    import onnxruntime as ort

    x = torch.randn(args.batch, 3, args.img_size, args.img_size)
    print(
        f"{args.arch}, {args.img_size}x{args.img_size}, patch {args.patch_size}, batch {args.batch}, "
        f"{(args.img_size // args.patch_size) ** 2} tokens, torch threads {torch.get_num_threads()}"
    )
    print(f"{'attention':10s} {'eager s':>9s} {'onnxrt s':>9s} {'eager/ort':>9s} {'max |diff|':>10s}")
    for attention in ("linear", "softmax"):
        model = vitzoo.create_model(
            args.arch, attention=attention, img_size=args.img_size, patch_size=args.patch_size
        ).eval()
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.onnx"
            torch.onnx.export(model, (x,), str(path), dynamo=True, input_names=["images"])
            session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
            feed = {"images": x.numpy()}
            with torch.inference_mode():
                eager = _median_seconds(lambda: model(x), args.repeats)
                onnx = _median_seconds(lambda: session.run(None, feed), args.repeats)
                diff = (torch.from_numpy(session.run(None, feed)[0]) - model(x)).abs().max().item()
        print(f"{attention:10s} {eager:9.3f} {onnx:9.3f} {eager / onnx:9.2f} {diff:10.1e}")


if __name__ == "__main__":
    main()

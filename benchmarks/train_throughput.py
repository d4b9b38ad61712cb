"""Throughput: the zoo's ViT (``vit_softmax`` preset) vs timm's own ViT of the same shape, training or inference.

Both models take the same training step (forward, cross-entropy, backward, AdamW step), or with ``--inference``
the same eval-mode forward under ``torch.inference_mode``, on the same random batch; timings alternate between
the two (A B A B ...) so machine noise hits both alike. ``--attention`` adds zoo ViTs of the same shape with
other attention (``name`` or ``name:key=value,...``) to the same rotation. Prints a table of img/s and the ratio
to timm (1.00 = no overhead): of the medians, of the best rounds, and the median of the per-round ratios (steadier
on a busy machine).

    python benchmarks/train_throughput.py                       # vit_cifar shape, CPU, batch 64
    python benchmarks/train_throughput.py --threads 1 --clock process --rounds 15   # on a busy CPU
    python benchmarks/train_throughput.py --device cuda --precision bf16 --batch-size 256
    python benchmarks/train_throughput.py --arch vit_small --img-size 224 --csv out.csv
    python benchmarks/train_throughput.py --batch-size 128 --attention linear:impl=eager --attention linear:impl=torch
    python benchmarks/train_throughput.py --data ../shared/data/cifar10-train-jpg.tar.gz   # + both data paths
    python benchmarks/train_throughput.py --inference --arch vit_tiny --img-size 224 --batch-size 8 --steps 1 \
        --rounds 21 --attention softmax:rope=axial --timm vit_small_patch16_rope_224   # RoPE beside timm's RoPE ViT

``--data`` (an image folder or the CIFAR .tar.gz) adds two rows: the zoo ViT fed real, augmented batches
by the albumentations DataLoader (``--workers``) and by the device-resident path (``data.device_cache``),
so the table shows what each data path leaves of the fixed-batch rate. On CUDA a peak-memory column
(torch's max allocated, per row) is added.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import time

import torch
import timm
import torch.nn.functional as F
from timm.models.vision_transformer import VisionTransformer

import vitzoo
from vitzoo.models.vit import VIT_ARCHS


def attention_spec(text: str) -> dict:
    """``linear:impl=eager,feature_map=relu`` -> {"name": "linear", "impl": "eager", "feature_map": "relu"}."""
    name, _, options = text.partition(":")
    spec = {"name": name}
    for item in filter(None, options.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"{item!r} in {text!r} is not key=value; write e.g. linear:impl=eager")
        try:
            spec[key] = json.loads(value)
        except json.JSONDecodeError:
            spec[key] = value
    return spec


def build(arch: str, img_size: int, num_classes: int, extra_attention=(), extra_timm=()):
    shape = {k: v for k, v in VIT_ARCHS[arch].items() if k not in ("img_size", "num_classes")}
    zoo = vitzoo.create_model(arch, attention="softmax", img_size=img_size, num_classes=num_classes)
    ref = VisionTransformer(img_size=img_size, num_classes=num_classes, dynamic_img_size=True, **shape)
    n_zoo, n_ref = (sum(p.numel() for p in m.parameters()) for m in (zoo, ref))
    if n_zoo != n_ref:
        raise SystemExit(f"shapes differ: zoo has {n_zoo} parameters, timm {n_ref}")
    models = {"vitzoo vit_softmax": zoo, "timm VisionTransformer": ref}
    for spec in extra_attention:
        label = "vitzoo " + ",".join(str(v) for v in spec.values())
        models[label] = vitzoo.create_model(arch, attention=spec, img_size=img_size, num_classes=num_classes)
    for name in extra_timm:  # timm's own variant (e.g. its RoPE ViT) at the zoo's shape
        models[f"timm {name}"] = timm.create_model(name, img_size=img_size, num_classes=num_classes, **shape)
    return models, shape


def make_step(model, device, precision, inference=False):
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    if inference:
        model.eval()

        def forward(x, y):
            with (
                torch.inference_mode(),
                torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None),
            ):
                model(x)

        return forward
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")

    def step(x, y):
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()

    return step


def timed(step, batches, steps, device, clock) -> float:
    """img/s of ``steps`` steps on the batches ``batches()`` hands out."""
    if device.type == "cuda":
        torch.cuda.synchronize()
    start, images = clock(), 0
    for _ in range(steps):
        x, y = batches()
        step(x.to(device, non_blocking=True), y.to(device, non_blocking=True))
        images += len(x)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return images / (clock() - start)


def data_feeds(data: str, img_size: int, batch_size: int, workers: int, device) -> dict:
    """Endless training batches of the image folder ``data`` from each data path: {row label: next batch}."""
    from data_path import device_batches, endless, folder_module

    plain = folder_module(data, img_size, batch_size, False, num_workers=workers)
    cached = folder_module(data, img_size, batch_size, True, num_workers=0)
    return {
        f"albumentations, {workers} worker(s)": endless(plain.train_dataloader()).__next__,
        "device path": endless(device_batches(cached, device)).__next__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="vit_cifar", choices=sorted(VIT_ARCHS))
    parser.add_argument("--img-size", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--inference", action="store_true", help="time eval-mode forwards instead of training steps")
    parser.add_argument("--steps", type=int, default=5, help="steps per timing")
    parser.add_argument("--rounds", type=int, default=7, help="alternating timings per model (median reported)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    parser.add_argument("--compile", action="store_true", help="torch.compile both models")
    parser.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "process"],
        help="process = this process's CPU time: steadier on a shared CPU (use with --threads 1)",
    )
    parser.add_argument("--threads", type=int, help="torch.set_num_threads (CPU)")
    parser.add_argument(
        "--attention",
        type=attention_spec,
        action="append",
        default=[],
        help="also time a zoo ViT with this attention, e.g. linear:impl=torch (repeatable)",
    )
    parser.add_argument(
        "--timm",
        action="append",
        default=[],
        help="also time this timm model at the same shape, e.g. vit_small_patch16_rope_224 (repeatable)",
    )
    parser.add_argument("--data", help="image folder or CIFAR .tar.gz: add rows fed by both data paths")
    parser.add_argument("--workers", type=int, default=1, help="--data: DataLoader workers of the albumentations path")
    parser.add_argument("--csv", help="also write the table to this CSV file")
    args = parser.parse_args()

    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    clock = time.perf_counter if args.clock == "wall" else time.process_time
    torch.manual_seed(0)
    models, shape = build(args.arch, args.img_size, 10, args.attention, args.timm)
    x = torch.randn(args.batch_size, 3, args.img_size, args.img_size, device=device)
    y = torch.randint(0, 10, (args.batch_size,), device=device)
    feeds = {name: (model, lambda: (x, y)) for name, model in models.items()}
    if args.data:
        zoo = models["vitzoo vit_softmax"]
        for label, feed in data_feeds(args.data, args.img_size, args.batch_size, args.workers, device).items():
            feeds[f"vitzoo vit_softmax <- {label}"] = (zoo, feed)
    steps, peak, compiled = {}, {}, set()
    for name, (model, batches) in feeds.items():
        model.to(device).train()
        if args.compile and id(model) not in compiled:  # the data-path rows share the zoo model
            model.compile()
            compiled.add(id(model))
        steps[name] = make_step(model, device, args.precision, args.inference)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        for _ in range(args.warmup):
            steps[name](*(t.to(device) for t in batches()))
        if device.type == "cuda":
            peak[name] = torch.cuda.max_memory_allocated(device) / 2**20
    rates = {name: [] for name in feeds}
    for _ in range(args.rounds):
        for name, step in steps.items():
            rates[name].append(timed(step, feeds[name][1], args.steps, device, clock))

    ref_name = "timm VisionTransformer"
    ref = statistics.median(rates[ref_name])
    # Each round times both models back to back: the median of per-round ratios cancels slow drift.
    paired = {name: statistics.median(a / b for a, b in zip(values, rates[ref_name])) for name, values in rates.items()}
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    best = max(rates[ref_name])
    print(
        f"{args.arch} {shape}, img {args.img_size}, batch {args.batch_size}, {args.precision}, {where}, "
        f"{args.clock} clock, {'inference' if args.inference else 'training'}, {args.rounds} rounds"
    )
    rows = []
    for name, values in rates.items():
        med = statistics.median(values)
        rows.append(
            {
                "model": name,
                "img_per_s": round(med, 1),
                "min": round(min(values), 1),
                "max": round(max(values), 1),
                "ratio_vs_timm": round(med / ref, 3),
                "best_ratio_vs_timm": round(max(values) / best, 3),
                "paired_ratio_vs_timm": round(paired[name], 3),
                **({"peak_mb": round(peak[name])} if name in peak else {}),
            }
        )
    width = max(24, *(len(r["model"]) for r in rows))
    print(
        f"{'model':<{width}} {'img/s (median)':>15} {'min':>9} {'max':>9} {'ratio':>7} {'best ratio':>11} "
        f"{'paired ratio':>13}" + (f" {'peak MB':>8}" if peak else "")
    )
    for r in rows:
        print(
            f"{r['model']:<{width}} {r['img_per_s']:>15.1f} {r['min']:>9.1f} {r['max']:>9.1f} "
            f"{r['ratio_vs_timm']:>7.3f} {r['best_ratio_vs_timm']:>11.3f} {r['paired_ratio_vs_timm']:>13.3f}"
            + (f" {r['peak_mb']:>8}" if "peak_mb" in r else "")
        )
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()

"""The zoo's profile phase: parameters, forward FLOPs, training img/s and peak memory of each trained network.

Each checkpoint is profiled in a fresh process (so one network's peak memory is not another's):

    python benchmarks/zoo_profile.py <run dir>/checkpoints/last.ckpt --batch-size 128 --steps 10   # one JSON line
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

from memory import status_mib
from zoo_plan import ROOT, Run


def eager_twins(model) -> None:
    """Switch fused paths to their eager twins so FlopCounterMode sees every attention matmul."""
    from vitzoo.attention import SoftmaxAttention, ZooAttention

    for m in model.modules():
        if isinstance(m, SoftmaxAttention):
            m.fused = False
        elif isinstance(m, ZooAttention) and hasattr(m, "impl"):
            m.impl = "eager"


def hardware() -> str:
    """The CPU model and core count, and the GPU where torch sees one."""
    import torch

    from vitzoo.runtime import cpu_model

    cpu = cpu_model()
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} cores{gpu}"


def profile_one(ckpt: Path, batch_size: int, steps: int) -> Dict[str, float]:
    """Parameters, forward FLOPs per image, train img/s and peak train memory of a checkpoint's network."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from vitzoo.training import build_model, read_checkpoint

    hp = read_checkpoint(ckpt)["hyper_parameters"]
    base = status_mib("VmRSS")
    cuda = torch.cuda.is_available()  # on a GPU: bf16 autocast, peak = torch's max allocated
    device = torch.device("cuda" if cuda else "cpu")
    model = build_model(hp).to(device)
    params = sum(p.numel() for p in model.parameters())
    size = (batch_size, hp.get("in_chans", 3), hp["img_size"], hp["img_size"])
    x = torch.randn(size, device=device)
    y = torch.randint(0, hp["num_classes"], (batch_size,), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        with autocast:
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:  # two warm-up steps
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else status_mib("VmHWM") - base
    times.sort()
    model.eval()
    eager_twins(model)
    with FlopCounterMode(display=False) as counter:
        model(x[:1])
    return {
        "params": params,
        "flops_per_image": counter.get_total_flops(),
        "train_img_per_s": batch_size / times[len(times) // 2],
        "peak_train_mb": peak,
        "batch_size": batch_size,
        "torch": torch.__version__,
        "device": "cuda bf16" if cuda else "cpu fp32",
        "hardware": hardware(),
    }


def profile(runs: List[Run], batch_size: int, steps: int) -> None:
    """``profile.json`` in every trained run's dir that has none, each from a process of its own."""
    for run in runs:
        out = run.dir / "profile.json"
        if out.is_file() or not (run.dir / "metrics.json").is_file():
            continue
        cmd = [sys.executable, __file__, str(run.last_ckpt), "--batch-size", str(batch_size), "--steps", str(steps)]
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if result.returncode:
            raise SystemExit(f"profiling {run.name} failed:\n{result.stderr[-2000:]}")
        out.write_text(result.stdout.strip().splitlines()[-1] + "\n")
        print(f"[profile] {run.name}: {out.read_text().strip()}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("ckpt", type=Path, help="a trained run's checkpoint")
    p.add_argument("--batch-size", type=int, default=128, help="training batch size")
    p.add_argument("--steps", type=int, default=10, help="timed training steps")
    args = p.parse_args(argv)
    print(json.dumps(profile_one(args.ckpt, args.batch_size, args.steps)))


if __name__ == "__main__":
    main()

"""High-resolution inference of the published pyramids beside their softmax originals: images/s and peak memory at
224, 512 and 1024 px, and which path served each linear stage (docs/high-resolution.md).

    python benchmarks/pyramid_resolution.py                        # every pair, 224 / 512 / 1024
    python benchmarks/pyramid_resolution.py --sizes 224 512 --reps 2 --archs pvt_tiny flatten_pvt_tiny

Each architecture runs in a fresh process with its own attention (``vitzoo.create_model(arch)``, random weights:
cost does not depend on them), batch 1, eval, no grad: per size one warm-up pass, then ``--reps`` timed ones (the
best kept), and the peak resident memory above the level after the warm-up (``VmHWM``, reset through
``/proc/self/clear_refs``). A ratio compares a row with its softmax original at the same size, measured in this run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from typing import Dict, List

import torch

from vitzoo.runtime import cpu_model

from memory import timed_passes  # a sibling module: scripts run from benchmarks/ see it

PAIRS = {  # softmax original: the published linear forms of it
    "pvt_tiny": ["flatten_pvt_tiny", "agent_pvt_tiny", "inline_pvt_tiny", "pola_pvt_tiny"],
    "swin_tiny": ["flatten_swin_tiny", "agent_swin_tiny", "inline_swin_tiny", "pola_swin_tiny"],
    "pvt_v2_b0": [],
    "mlla_tiny": [],
    "ravlt_tiny": [],
}
ORIGINAL = {linear: softmax for softmax, linears in PAIRS.items() for linear in linears}


def _paths(model: torch.nn.Module, served: Dict[int, set]) -> List[str]:
    """Per stage: which path mixed its tokens in the last pass (from ``served``: tokens -> path names)."""
    from vitzoo.attention import LinearAttention, ZooAttention

    out = []
    for stage in ("layers", "stages"):
        if hasattr(model, stage):
            groups = [list(s.modules()) for s in getattr(model, stage)]
            break
    else:
        groups = [list(getattr(model, f"block{s}").modules()) for s in range(1, 5)]
    for modules in groups:
        layer = next(m for m in modules if isinstance(m, ZooAttention))
        name = type(layer).__name__.replace("Attention", "")
        if not isinstance(layer, LinearAttention) and not hasattr(layer, "impl"):
            out.append(name)
            continue
        h, w = layer.token_grid or (0, 0)
        if layer.window:  # a windowed layer mixes each window's tokens
            h, w = min(h, layer.window), min(w, layer.window)
        tokens = h * w
        out.append(f"{name}: {'/'.join(sorted(served.get(tokens, {'other'})))}")
    return out


def worker(arch: str, sizes: List[int], reps: int) -> dict:
    import vitzoo
    import vitzoo.kernels.torch_linear as torch_linear

    served: Dict[int, set] = defaultdict(set)
    steps = torch_linear._steps

    def spy(q, *args):  # records which steps the fused path took, by token count (the C++ kernel or torch ops)
        chosen = steps(q, *args)
        served[q.shape[-2]].add("C++ kernel" if type(chosen).__name__ == "_KernelSteps" else "torch ops")
        return chosen

    torch_linear._steps = spy
    model = vitzoo.create_model(arch).eval()
    rows = []
    for size in sizes:
        x = torch.randn(1, 3, size, size)
        with torch.inference_mode():
            model(x)
            served.clear()
            seconds, peak, _ = timed_passes(lambda: model(x), reps)
        rows.append(
            {
                "size": size,
                "img_s": 1 / seconds,
                "peak_mb": peak,
                "paths": _paths(model, served),
            }
        )
    return {"arch": arch, "rows": rows}


def run(arch: str, sizes: List[int], reps: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", arch, "--sizes", *map(str, sizes), "--reps", str(reps)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{arch} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: Dict[str, dict], sizes: List[int]) -> str:
    lines = [
        "| model | px | img/s | peak MB | img/s vs its softmax | memory vs its softmax | path per stage |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    by = {arch: {r["size"]: r for r in res["rows"]} for arch, res in results.items()}
    for arch in results:
        for size in sizes:
            r = by[arch][size]
            base = by.get(ORIGINAL.get(arch, ""), {}).get(size)
            speed = f"{r['img_s'] / base['img_s']:.2f}x" if base else "(baseline)"
            memory = f"{r['peak_mb'] / base['peak_mb']:.2f}x" if base and base["peak_mb"] > 0 else "-"
            lines.append(
                f"| `{arch}` | {size} | {r['img_s']:.2f} | {r['peak_mb']:.0f} | {speed} | {memory} | "
                f"{'; '.join(r['paths'])} |"
            )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 512, 1024])
    p.add_argument("--reps", type=int, default=5, help="timed passes per size after a warm-up, the best kept")
    p.add_argument("--archs", nargs="+", help="rows (default: every pair, originals first)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, args.sizes, args.reps)))
        return
    archs = args.archs or [a for softmax, linears in PAIRS.items() for a in (softmax, *linears)]
    results = {}
    for arch in archs:
        results[arch] = run(arch, args.sizes, args.reps)
        print(f"done {arch}", file=sys.stderr, flush=True)
    print(
        f"# pyramids at high resolution: batch 1, eval, best of {args.reps}, {cpu_model()}, {torch.get_num_threads()} "
        f"threads, torch {torch.__version__}, 1-minute load average {os.getloadavg()[0]:.1f} after the rows; peak MB = "
        "resident peak above the level after a warm-up pass"
    )
    print(table(results, args.sizes))


if __name__ == "__main__":
    main()

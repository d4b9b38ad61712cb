"""Phases a-c of a kit run: the CUDA tests, the kernel table, ViT-Tiny end to end. Each returns its steps and a
headline read from what they wrote; ``rehearse`` runs the same scripts on the CPU at tiny sizes."""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from .steps import Step, Steps


@dataclass
class Context:
    """What a phase needs: the interpreter to run, the results folder (archived), the command runner, the data."""

    rehearse: bool
    python: str
    results: Path
    steps: Steps
    data: Optional[Path] = None
    zoo_epochs: Optional[int] = None  # the zoo's epoch count (None: from the probe)
    zoo_presets: Optional[List[str]] = None  # the zoo's presets (None: all)


@dataclass
class Outcome:
    steps: List[Step]
    headline: str
    notes: str = ""


# -v: a line per test as it ends, so a run stopped at its deadline still tells what passed
PYTEST = ["-m", "pytest", "-p", "no:cacheprovider", "-v", "-rfE", "--continue-on-collection-errors"]
CUDA_WORKERS = ["-n", "8", "--dist", "load"]  # Triton compiles each kernel variant once per process: spread them
# the CPU-side tests of the kernels, attention and export, run there under the image's torch
CPU_SIDE = [
    "tests/test_kernels.py",
    "tests/test_attention_functional.py",
    "tests/test_attention_modules.py",
    "tests/test_export.py",
]


def _last_match(path: Optional[Path], pattern: str) -> str:
    if path is None or not path.is_file():
        return ""
    found = [line.strip() for line in path.read_text(errors="replace").splitlines() if re.search(pattern, line)]
    return found[-1] if found else ""


def tests(ctx: Context) -> Outcome:
    """a. ``pytest -m cuda`` over the suite, then the CPU-side tests of the kernels, attention and export."""
    py = ctx.python
    if ctx.rehearse:
        steps = [
            ctx.steps.run(
                "a-pytest-cuda", [py, *PYTEST, "-n", "0", "--noconftest", "-m", "cuda", "tests/test_kernels_cuda.py"]
            )
        ]
        steps.append(Step("a-pytest-cpu-side", None, 0.0, None, skipped="rehearsal: CI runs these tests"))
    else:
        steps = [
            ctx.steps.run(
                "a-pytest-cuda", [py, *PYTEST, *CUDA_WORKERS, "-m", "cuda", "tests/"], cap=0.7 * ctx.steps.left()
            )
        ]
        steps.append(ctx.steps.run("a-pytest-cpu-side", [py, *PYTEST, "-n", "4", "-m", "not slow", *CPU_SIDE]))
    headline = "; ".join(f"{s.name[2:]}: {pytest_result(s)}" for s in steps)
    failures = [
        line
        for s in steps
        if s.log
        for line in s.log.read_text(errors="replace").splitlines()
        if re.search(r"(^|\s)(FAILED|ERROR)(\s|$)", line)
    ]
    return Outcome(steps, headline, "\n".join(dict.fromkeys(failures[:80])))


def pytest_result(step: Step) -> str:
    """pytest's closing line, or (stopped before it) the count of tests reported so far."""
    closing = _last_match(step.log, r"\d+ (passed|failed|skipped|error|deselected)")
    if closing or step.log is None:
        return closing or step.status
    text = step.log.read_text(errors="replace")
    counts = ", ".join(
        f"{len(re.findall(rf' {word}( |$)', text, re.M))} {word.lower()}"
        for word in ("PASSED", "FAILED", "SKIPPED", "ERROR")
    )
    return f"{step.status} after {counts}"


# (tag, batch, heads, dtype): B*H = 32 and 64, bf16 and fp32, in order of value
KERNEL_RUNS = [
    ("bh32-bf16", 2, 16, "bf16"),
    ("bh32-fp32", 2, 16, "fp32"),
    ("bh64-bf16", 4, 16, "bf16"),
    ("bh64-fp32", 4, 16, "fp32"),
]
GPU_MECHANISMS = "linear_triton,softmax_flash,softmax_efficient,linear_eager,fla_chunk"


def kernels(ctx: Context) -> Outcome:
    """b. benchmarks/attention.py: the Triton path against SDPA's named backends, the eager formula and fla."""
    py, out = ctx.python, ctx.results / "kernels"
    steps = []
    if ctx.rehearse:
        runs = [
            (
                "cpu-tiny",
                [
                    "--device",
                    "cpu",
                    "--min-n",
                    "64",
                    "--max-n",
                    "128",
                    "--reps",
                    "1",
                    "--no-memory",
                    "--mechanisms",
                    "linear_torch,softmax_flash,softmax_efficient,linear_eager,fla_chunk",
                ],
            )
        ]
    else:
        runs = [
            (
                tag,
                [
                    "--device",
                    "cuda",
                    "--dtype",
                    dtype,
                    "--batch",
                    str(b),
                    "--heads",
                    str(h),
                    "--min-n",
                    "1024",
                    "--max-n",
                    "65536",
                    "--reps",
                    "3",
                    "--case-seconds",
                    "1",
                    "--mechanisms",
                    GPU_MECHANISMS,
                ],
            )
            for tag, b, h, dtype in KERNEL_RUNS
        ]
    for i, (tag, args) in enumerate(runs):
        argv = [
            py,
            "benchmarks/attention.py",
            *args,
            "--head-dim",
            "64",
            "--layout",
            "bnhd",
            "--out",
            out / tag,
            *(["--accuracy"] if i == 0 else []),
        ]
        steps.append(ctx.steps.run(f"b-{tag}", argv, stdout=out / tag / "table.txt"))
    notes = (
        (
            "rehearsal: linear_triton is CUDA-only here (tests/test_kernels.py runs the kernels under Triton's "
            "interpreter); no peak-memory pass (on CUDA it runs in-process)"
        )
        if ctx.rehearse
        else ""
    )
    return Outcome(steps, kernel_headline(out / runs[0][0]), notes)


def kernel_headline(folder: Path) -> str:
    """The fused path at 16,384 tokens (or the largest n run): fwd and fwd+bwd ms, fraction of the floor, SDPA
    flash's time over it; the accuracy pass's worst error in units of roundoff."""
    files = [p for p in folder.glob("attention_*.csv") if not p.stem.endswith(("_accuracy", "_e2e"))]
    if not files:
        return "no table written"
    rows = list(csv.DictReader(open(files[0])))
    fused = "linear_triton" if any(r["mechanism"] == "linear_triton" for r in rows) else "linear_torch"
    sizes = sorted({int(r["n"]) for r in rows if r["mechanism"] == fused})
    if not sizes:
        return f"{fused} did not run"
    n = 16384 if 16384 in sizes else sizes[-1]
    cell = {(r["mechanism"], r["mode"]): r for r in rows if int(r["n"]) == n}
    parts = [
        f"{fused} n={n} {rows[0]['dtype']} B*H={int(rows[0]['batch']) * int(rows[0]['heads'])}: "
        f"fwd {float(cell[(fused, 'fwd')]['ms']):.3f} ms, fwd+bwd {float(cell[(fused, 'fwd+bwd')]['ms']):.3f} ms "
        f"({float(cell[(fused, 'fwd+bwd')]['floor_fraction']):.0%} of the floor)"
    ]
    for m in ("softmax_flash", "fla_chunk"):
        if (m, "fwd+bwd") in cell:
            ratio = float(cell[(m, "fwd+bwd")]["ms"]) / float(cell[(fused, "fwd+bwd")]["ms"])
            parts.append(f"{m} fwd+bwd {ratio:.2f}x the fused path's time")
    acc = list(folder.glob("*_accuracy.csv"))
    if acc:
        arows = list(csv.DictReader(open(acc[0])))
        worst = max(arows, key=lambda r: float(r["unit_roundoffs"]))
        finite = all(r["finite"] == "True" for r in arows)
        parts.append(
            f"accuracy n={arows[0]['n']}: {'all finite' if finite else 'NOT FINITE'}, worst "
            f"{float(worst['unit_roundoffs']):.2f} roundoffs ({worst['dtype']} {worst['tensor']})"
        )
    return "; ".join(parts)


def end_to_end(ctx: Context) -> Outcome:
    """c. ViT-Tiny patch 8: vit_linear against vit_softmax, inference and a training step; compiled vs eager."""
    size = (
        ["--device", "cpu", "--e2e-img-size", "32", "--e2e-batch", "2", "--e2e-reps", "1", "--e2e-compile", "aot_eager"]
        if ctx.rehearse
        else [
            "--device",
            "cuda",
            "--dtype",
            "bf16",
            "--e2e-img-size",
            "1024",
            "--e2e-batch",
            "8",
            "--e2e-reps",
            "3",
            "--e2e-compile",
            "inductor",
        ]
    )
    out = ctx.results / "end_to_end"
    step = ctx.steps.run(
        "c-e2e", [ctx.python, "benchmarks/attention.py", "--e2e-only", *size, "--out", out], stdout=out / "table.txt"
    )
    table = out / "table.txt"
    lines = [_last_match(table, pattern) for pattern in (r"^inference: ", r"^train: ")]
    compiled = _last_match(table, r"compiled \(").strip("| ").split(" | ")  # mode | model | img/s | peak
    if len(compiled) > 2:
        lines.append(f"{compiled[1]}: {compiled[2]} img/s")
    return Outcome([step], "; ".join(line for line in lines if line) or step.status)

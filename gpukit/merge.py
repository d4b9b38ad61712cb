"""``python -m gpukit merge ARCHIVE``: a GPU run's results into the docs.

The kernel runs become ``docs/benchmarks/attention_cuda.{txt,csv,png}`` (the tables one after another under the
summary's environment lines, one CSV of every run, the B*H = 32 bf16 plot) with ``attention_cuda_accuracy.csv``
and ``attention_cuda_e2e.csv`` beside them; the zoo's result files join ``docs/zoo/gpu/`` through
``benchmarks/zoo.py --phases report --merge``. A rehearsal's archive holds CPU numbers and is refused.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from .layout import ROOT, SUMMARY
from .phases import KERNEL_RUNS


def kernel_docs(results: Path, dest: Path) -> list:
    """The kernel and end-to-end files of an unpacked archive into ``dest``; returns the files written."""
    summary = (results / SUMMARY).read_text().splitlines()
    env = [line for line in summary if line.startswith("- GPU:") or line.startswith("- torch")]
    tables, header, rows = [], None, []
    for tag, *_ in KERNEL_RUNS:
        folder = results / "kernels" / tag
        if (folder / "table.txt").is_file():
            tables += [f"\n## {tag}\n", (folder / "table.txt").read_text()]
        if (folder / "attention_cuda.csv").is_file():
            lines = (folder / "attention_cuda.csv").read_text().splitlines()
            header, rows = lines[0], rows + lines[1:]
    if header is None:
        raise SystemExit(
            f"{results}: no kernel table (kernels/<run>/attention_cuda.csv); the kernel phase did not "
            "finish a run, see summary.md"
        )
    dest.mkdir(parents=True, exist_ok=True)
    e2e = results / "end_to_end" / "table.txt"
    text = "\n".join(
        [
            "# attention on CUDA (python3 -m gpukit run)",
            *env,
            *tables,
            *(["\n## end to end\n", e2e.read_text()] if e2e.is_file() else []),
        ]
    )
    written = [dest / "attention_cuda.txt", dest / "attention_cuda.csv"]
    written[0].write_text(text)
    written[1].write_text("\n".join([header, *rows]) + "\n")
    for src, name in [
        (results / "kernels" / KERNEL_RUNS[0][0] / "attention_cuda.png", "attention_cuda.png"),
        (results / "kernels" / KERNEL_RUNS[0][0] / "attention_cuda_accuracy.csv", "attention_cuda_accuracy.csv"),
        (results / "end_to_end" / "attention_cuda_e2e.csv", "attention_cuda_e2e.csv"),
    ]:
        if src.is_file():
            shutil.copy2(src, dest / name)
            written.append(dest / name)
    return written


def main(args) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(args.archive) as tar:
            tar.extractall(tmp, filter="data")
        results = Path(tmp) / "results"
        if not (results / SUMMARY).is_file():
            raise SystemExit(f"{args.archive}: no results/{SUMMARY} inside; pass the gpukit-results.tar.gz a run left")
        if "rehearsal" in (results / SUMMARY).read_text().splitlines()[0]:
            raise SystemExit(f"{args.archive} is a rehearsal's (CPU numbers); merge the archive of a GPU run")
        for path in kernel_docs(results, Path(args.docs) / "benchmarks"):
            print(f"wrote {path}")
        per_run = results / "zoo" / "zoo-report" / "per-run"
        if not any(per_run.glob("*.json")):
            print("no zoo result files in the archive (the zoo phase finished no run)")
            return
        subprocess.run(
            [
                sys.executable,
                "benchmarks/zoo.py",
                "--budget",
                "gpu",
                "--phases",
                "report",
                "--merge",
                str(per_run),
                "--out",
                str(Path(args.docs) / "zoo" / "gpu"),
            ],
            cwd=ROOT,
            check=True,
        )

"""One ``train.py`` run as a benchmark step: its wall time, CPU time and metrics.json (shared by the
benchmark scripts that train; not a benchmark itself)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def train_once(
    overrides: Sequence[str], run_dir: Path, env: Optional[Dict[str, str]] = None
) -> Tuple[float, float, dict]:
    """(wall s, CPU s of the process and its children, metrics.json) of ``train.py <overrides>`` writing
    into ``run_dir``; its console output goes to ``run_dir``.out. A failed run stops the benchmark."""
    cmd = [sys.executable, str(ROOT / "train.py"), *overrides, f"hydra.run.dir={run_dir}"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    cpu, start = children_cpu(), time.perf_counter()
    with open(f"{run_dir}.out", "w") as out:
        proc = subprocess.run(
            cmd, cwd=ROOT, env=env if env is not None else dict(os.environ), stdout=out, stderr=subprocess.STDOUT
        )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"train.py failed ({' '.join(cmd)}); its output: {run_dir}.out")
    return wall, children_cpu() - cpu, json.loads((run_dir / "metrics.json").read_text())

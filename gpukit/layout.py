"""Where the kit lives and what travels: names shared by ``prepare`` (here) and ``run`` (there); stdlib only."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ".gpukit"  # git-ignored: wheels/, data/, manifest.json
DATA_NAME = "cifar10-train-jpg.tar.gz"
COMMAND = 'python3 -m gpukit run --out "$OUT"'
BUDGET_S, REHEARSAL_BUDGET_S = 530, 115  # a run's phases, install and closing included
TIME_LIMIT_S = 570  # the command's limit; a run ends by BUDGET_S
TRAVEL_LIMIT_MIB = 64  # the working tree and the named ignored paths together
SUMMARY, ARCHIVE = "summary.md", "gpukit-results.tar.gz"


def folder_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def repo_mib() -> float:
    """The size of what travels of the working tree: tracked files and untracked ones git does not ignore."""
    names = (
        subprocess.run(
            ["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True, check=True
        )
        .stdout.decode()
        .split("\0")
    )
    return sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file()) / 2**20

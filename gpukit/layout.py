"""Where the kit lives and what travels: names shared by ``prepare`` (here) and ``run`` (there); stdlib only."""
from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KIT = ".gpukit"  # git-ignored: wheels/, data/, manifest.json
DATA_NAME = "cifar10-train-jpg.tar.gz"
COMMAND = 'python3 -m gpukit run --out "$OUT"'
TIME_LIMIT_S = 570  # the command's limit; the kit's budgets end its phases by 540 s
TRAVEL_LIMIT_MIB = 64  # the working tree and the named ignored paths together
SUMMARY, ARCHIVE = "summary.md", "gpukit-results.tar.gz"


def folder_mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def repo_mib() -> float:
    """The size of what travels of the working tree: tracked files and untracked ones git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    return sum((ROOT / n).stat().st_size for n in names if n and (ROOT / n).is_file()) / 2**20

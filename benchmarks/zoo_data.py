"""The zoo's ``--data``: the CIFAR-10 JPEG tree (a folder holding ``train/<class>/*.jpg``) or its ``.tar.gz``."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path


def resolve_data(data: Path) -> Path:
    """A folder holding train/, or a .tar.gz of one (unpacked once under ~/.cache/vitzoo)."""
    data = data.expanduser().resolve()
    if data.is_dir():
        if not (data / "train").is_dir():
            raise SystemExit(f"--data {data} has no train/ folder; pass the CIFAR-10 JPEG tree or its .tar.gz")
        return data
    if not data.is_file() or not data.name.endswith((".tar.gz", ".tgz")):
        raise SystemExit(f"--data {data} is neither a folder holding train/ nor a .tar.gz of one")
    target = Path.home() / ".cache" / "vitzoo" / data.name.split(".")[0]
    if not (target / "train").is_dir():
        print(f"unpacking {data} -> {target}", flush=True)
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(data) as tar:
            tar.extractall(tmp, filter="data")
        if not (tmp / "train").is_dir():
            raise SystemExit(f"{data} holds no train/ folder at its top level")
        tmp.rename(target)
    return target

"""``python -m gpukit prepare``: fill the kit folder here, where the package registries answer.

Downloads the wheels the GPU machine lacks (``wheels.ROOTS`` and their missing requirements, followed until
none is left), copies the CIFAR-10 JPEG tar into the folder, writes ``manifest.json`` and prints the folder's
size, the one command to run on the GPU machine, the folder to send with it and the time limit to give it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import List

from . import wheels as W
from .layout import COMMAND, DATA_NAME, KIT, ROOT, TIME_LIMIT_S, TRAVEL_LIMIT_MIB, folder_mib, repo_mib

PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def _pip(args: List[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)


def download(spec: str, dest: Path) -> Path:
    """The cp312 manylinux (or pure-python) wheel of ``spec`` (``name==version`` or ``name<spec>``) into ``dest``;
    a distribution published only as source is built here into a pure-python wheel (refused if it is not one)."""
    before = set(dest.glob("*.whl"))
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    proc = _pip(
        [
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.12",
            "--implementation",
            "cp",
            *platforms,
            "-d",
            str(dest),
            spec,
        ]
    )
    if proc.returncode:
        with tempfile.TemporaryDirectory() as tmp:
            built = _pip(["wheel", "--no-deps", "-w", tmp, spec])
            made = list(Path(tmp).glob("*.whl"))
            if built.returncode or len(made) != 1 or not made[0].name.endswith("-none-any.whl"):
                raise SystemExit(
                    f"no cp312 manylinux or pure-python wheel for {spec}:\n{proc.stderr[-1500:]}{built.stderr[-1500:]}"
                )
            shutil.move(str(made[0]), dest / made[0].name)
    new = set(dest.glob("*.whl")) - before
    if len(new) != 1:
        raise SystemExit(f"pip left {len(new)} new wheels for {spec} in {dest}; expected one")
    return new.pop()


def fill(kit: Path, data: Path) -> dict:
    """Wheels and data into ``kit`` (emptied first); returns the manifest."""
    if not data.is_file():
        raise SystemExit(f"--data {data} is not a file; pass the CIFAR-10 JPEG tar (cifar10-train-jpg.tar.gz)")
    shutil.rmtree(kit, ignore_errors=True)
    (kit / "wheels").mkdir(parents=True)
    gpu, follow = W.gpu_packages(), {W.normalise(r.name) for r in W.ROOTS if r.follow}
    got = {}
    for root in W.ROOTS:
        got[W.normalise(root.name)] = download(f"{root.name}=={root.version}", kit / "wheels")
    while True:
        needed = W.missing(got.values(), gpu | set(got), follow)
        if not needed:
            break
        for req in needed:
            wheel = download(W.pin(req), kit / "wheels")
            got[W.normalise(req.name)] = wheel
            follow.add(W.normalise(req.name))  # a requirement's own requirements are followed too
    (kit / "data").mkdir()
    shutil.copy2(data, kit / "data" / DATA_NAME)
    manifest = {"wheels": sorted(p.name for p in got.values()), "data": [DATA_NAME], "roots": [r.name for r in W.ROOTS]}
    (kit / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def instructions(kit: Path) -> str:
    """What to run there, what to send with it and for how long; and the sizes against the travel limit."""
    kit_mib, tree_mib = folder_mib(kit), repo_mib()
    rel = kit.resolve().relative_to(ROOT)
    return "\n".join(
        [
            f"kit: {rel}/ {kit_mib:.1f} MiB; the working tree that travels with it {tree_mib:.1f} MiB; "
            f"together {kit_mib + tree_mib:.1f} of {TRAVEL_LIMIT_MIB} MiB",
            "on the GPU machine, in the repository root, one command:",
            f"    {COMMAND}",
            f"send with it (git-ignored, so named explicitly): {rel}",
            f"time limit: {TIME_LIMIT_S} s (the kit's phases end by themselves within 9 minutes)",
            "what comes back: $OUT/summary.md and $OUT/gpukit-results.tar.gz (docs/gpu.md: how to read and merge them)",
        ]
    )


def main(args) -> None:
    kit = (args.kit or ROOT / KIT).resolve()
    manifest = fill(kit, Path(args.data).expanduser().resolve())
    print(f"{len(manifest['wheels'])} wheels: {', '.join(manifest['wheels'])}")
    print(instructions(kit))
    if folder_mib(kit) + repo_mib() > TRAVEL_LIMIT_MIB:
        raise SystemExit(f"the kit and the working tree pass the {TRAVEL_LIMIT_MIB} MiB that can travel")

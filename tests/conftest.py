"""Shared test helpers: compose configs/ with overrides, run a script in a fresh interpreter, write an image folder.

The tiny training runs compose ``debug=tiny_vit`` (or ``debug=tiny_resnet``): configs/debug/, usable from the
command line too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping, Optional, Sequence

import cv2
import lightning as L
import numpy as np
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch.utils._python_dispatch import TorchDispatchMode

from vitzoo.options import register_configs

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
sys.path.append(
    str(ROOT / "benchmarks")
)  # the benchmark scripts' modules (zoo, zoo_results, ...), as they see each other

if os.environ.get("PYTEST_XDIST_WORKER"):
    # Each of pytest-xdist's workers (addopts: one a core) runs torch on one thread, its subprocesses too: threads
    # sharing a core with another worker's wait for each other (a digits run took 4x the CPU time on two threads).
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


# Files of 40 s or more, longest first: collected first, so that pytest-xdist's workers (addopts: --dist loadfile,
# files in collection order) start them first and a run does not end on one of them alone.
LONGEST_FIRST = (
    "test_zoo_harness.py",
    "test_deploy_onnx.py",
    "test_deploy_pyramids.py",
    "test_robustness.py",
    "test_configs.py",
    "test_deploy.py",
    "test_gpu_kit.py",
    "test_training.py",
    "test_packaging.py",
    "test_failed_starts.py",
)


def pytest_collection_modifyitems(items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the other files keep their order


ATTACKS = "needs torchattacks: pip install --no-deps torchattacks==3.5.1 (bash .ci/run installs it)"
register_configs()  # the option schemas configs/ builds on
QUIET = ["debug=quiet"]  # on the CPU, a log line every step, no progress bar (the tiny and digits runs include it)
# a Lightning Trainer's arguments for a test run on the CPU that writes no logs or checkpoints and prints no bar
QUIET_TRAINER = dict(
    accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False
)


def compose_config(output_dir: Path, overrides: Sequence[str] = (), name: str = "train") -> DictConfig:
    """configs/<name>.yaml composed with ``overrides``, writing into ``output_dir``."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(name, overrides=[*overrides, f"paths.output_dir={output_dir}"])


def run_python(
    *args, cwd: Path = ROOT, env: Optional[Mapping[str, str]] = None, timeout: float = 300, check: bool = False
) -> subprocess.CompletedProcess:
    """``python *args`` in a fresh interpreter from ``cwd`` (the repo root), stdout and stderr captured as text;
    ``check``: assert it exited 0, showing the end of its output."""
    proc = subprocess.run(
        [sys.executable, *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def write_image_folder(
    root: Path,
    classes: Sequence[str] = ("a", "b"),
    per_class: int = 4,
    size=(20, 20),
    split: str = "train",
    suffix: str = ".png",
    seed: int = 0,
) -> Path:
    """``root/<split>/<class>/<i><suffix>``: ``per_class`` uniform-noise RGB images of ``size`` (h, w) per class."""
    rng = np.random.default_rng(seed)
    for name in classes:
        (root / split / name).mkdir(parents=True)
        for i in range(per_class):
            cv2.imwrite(str(root / split / name / f"{i}{suffix}"), rng.integers(0, 256, (*size, 3), dtype=np.uint8))
    return root


class CrashAtStep(L.Callback):
    """Raise after optimizer step ``step``: a run that dies mid-epoch (used through +callbacks.crash)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash after step {self.step}")


# Ops whose answer the host must wait for on a GPU: a tensor read as a number, or an output sized by the data.
SYNC_OPS = {
    "_local_scalar_dense",
    "nonzero",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "masked_select",
    "bincount",
    "repeat_interleave",
}


class SyncOps(TorchDispatchMode):
    """Every aten op that would make the host wait for the device, with the training step it ran in."""

    def __init__(self):
        super().__init__()
        self.step, self.seen = -1, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNC_OPS:
            self.seen.append((self.step, func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))

"""Shared helpers for the training-pipeline tests: compose configs/ with overrides, fast settings."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Sequence

import lightning as L
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
sys.path.append(str(ROOT / "benchmarks"))  # the benchmark scripts' modules (zoo, zoo_results, ...), as they see each other

# A one-block, 32-wide ViT (or a 16-wide ResNet) on 16x16 random images: steps take milliseconds.
FAST_DATA = ["data=synthetic", "data.img_size=16", "data.num_train=64", "data.num_val=32", "data.batch_size=16"]
FAST_VIT = ["++model.kwargs.depth=1", "++model.kwargs.embed_dim=32", "++model.kwargs.num_heads=2"]
FAST_RESNET = ["++model.kwargs.channels=[16,32,64,128]", "++model.kwargs.stem_width=16"]
QUIET = ["callbacks.rich_progress_bar=null", "+trainer.enable_progress_bar=false",
         "trainer.enable_model_summary=false", "trainer.accelerator=cpu", "trainer.log_every_n_steps=1"]


def compose_config(output_dir: Path, overrides: Sequence[str] = (), name: str = "train") -> DictConfig:
    """configs/<name>.yaml composed with ``overrides``, writing into ``output_dir``."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(name, overrides=[*overrides, f"paths.output_dir={output_dir}"])


@pytest.fixture
def fast_overrides():
    return [*FAST_DATA, *FAST_VIT, *QUIET]


class CrashAtStep(L.Callback):
    """Raise after optimizer step ``step``: a run that dies mid-epoch (used through +callbacks.crash)."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise RuntimeError(f"simulated crash after step {self.step}")


# Ops whose answer the host must wait for on a GPU: a tensor read as a number, or an output sized by the data.
SYNC_OPS = {"_local_scalar_dense", "nonzero", "_unique2", "unique_dim", "unique_consecutive", "masked_select",
            "bincount", "repeat_interleave"}


class SyncOps(TorchDispatchMode):
    """Every aten op that would make the host wait for the device, with the training step it ran in."""

    def __init__(self):
        super().__init__()
        self.step, self.seen = -1, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in SYNC_OPS:
            self.seen.append((self.step, func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))

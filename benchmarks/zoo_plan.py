"""What the zoo runs: its rows (the model presets), its budgets and the run directory of each preset and seed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
CIFAR10_TRAIN_IMAGES = 50_000  # the --data tree's train/ (CIFAR-10); the val split is the recipe's fraction of it


def zoo_presets(model_dir: Path = ROOT / "configs" / "model") -> Tuple[Tuple[str, str], ...]:
    """(label in the table, Hydra model preset) for every preset in configs/model/: the ViTs (softmax
    first), then the non-local ResNets. A preset without its ``label:`` is an error naming the file."""
    import yaml

    rows = []
    for path in sorted(model_dir.glob("*.yaml")):
        label = (yaml.safe_load(path.read_text()) or {}).get("label")
        if not isinstance(label, str) or not label:
            raise SystemExit(f"{path}: add a `label:` line (the preset's row name in the zoo table)")
        rows.append((label, path.stem))
    return tuple(sorted(rows, key=lambda row: (row[1].startswith("nonlocal"), row[1] != "vit_softmax", row[1])))


PRESETS = zoo_presets()


@dataclass(frozen=True)
class Budget:
    """What differs between budgets; the recipe itself is ``configs/experiment/<experiment>.yaml``."""

    experiment: str
    vit_kwargs: Dict[str, object]
    resnet_kwargs: Dict[str, object]
    seeds: Dict[str, Tuple[int, ...]] = field(default_factory=dict)  # extra seeds per preset (default: seed 0)
    eval_images: Optional[int] = None  # val images for the robustness sweeps (None = all)
    robustness: str = "zoo"


BUDGETS = {
    # ~0.8M-parameter ViT, 2 epochs: all presets in about 2.5 h on a 2-core CPU.
    "cpu": Budget(
        "zoo_cpu",
        dict(embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0, drop_path_rate=0.0),
        dict(channels=[16, 32, 64, 128], stem_width=16),
        seeds={p: (0, 1) for p in ("vit_softmax", "vit_linear", "vit_softmax_rope")},
        eval_images=2000,
    ),
    # ViT-Tiny width (5.4M parameters at mlp_ratio 4), 50 epochs, one seed; a full-width ResNet-18.
    "gpu": Budget("zoo_gpu", dict(embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0, drop_path_rate=0.1), {}),
}


@dataclass(frozen=True)
class Run:
    label: str
    preset: str
    seed: int
    dir: Path

    @property
    def name(self) -> str:
        return f"{self.preset}-s{self.seed}"

    @property
    def last_ckpt(self) -> Path:
        return self.dir / "checkpoints" / "last.ckpt"

    @property
    def eval_key(self) -> str:
        """The run's checkpoint label in eval.py's records."""
        return f"{self.preset}_s{self.seed}"


def plan(budget: Budget, work: Path, only: Optional[Sequence[str]]) -> List[Run]:
    runs = []
    for label, preset in PRESETS:
        if only and preset not in only:
            continue
        for seed in budget.seeds.get(preset, (0,)):
            runs.append(Run(label, preset, seed, work / preset / f"seed{seed}"))
    return runs


def _hydra_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return str(value)


def model_overrides(budget: Budget, preset: str) -> List[str]:
    kwargs = budget.resnet_kwargs if preset.startswith("nonlocal") else budget.vit_kwargs
    return [f"++model.kwargs.{k}={_hydra_value(v)}" for k, v in kwargs.items()]


def recipe_path(budget: Budget) -> Path:
    return ROOT / "configs" / "experiment" / f"{budget.experiment}.yaml"


def val_images(budget: Budget) -> int:
    """The val split's size: the recipe's ``data.val_fraction`` of CIFAR-10's 50,000 training JPEGs (as the
    data module rounds it), which the result files do not record."""
    import yaml

    recipe = yaml.safe_load(recipe_path(budget).read_text())
    return math.ceil(recipe["data"]["val_fraction"] * CIFAR10_TRAIN_IMAGES)

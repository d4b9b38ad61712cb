"""What the zoo runs: its rows (the model presets), its budgets and the run directory of each preset and seed."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]
CIFAR10_TRAIN_IMAGES = 50_000  # the --data tree's train/ (CIFAR-10); the val split is the recipe's fraction of it


VIT_ZOO = ("vit_", "nonlocal_")  # the presets of the ViT budgets' rows: the ViTs and the non-local ResNets


def zoo_presets(model_dir: Path = ROOT / "configs" / "model") -> Tuple[Tuple[str, str], ...]:
    """(label in the table, Hydra model preset) for every preset in configs/model/: the ViTs (softmax first), the
    non-local ResNets, then the pyramids. A preset without its ``label:`` is an error naming the file."""
    import yaml

    rows = []
    for path in sorted(model_dir.glob("*.yaml")):
        label = (yaml.safe_load(path.read_text()) or {}).get("label")
        if not isinstance(label, str) or not label:
            raise SystemExit(f"{path}: add a `label:` line (the preset's row name in the zoo table)")
        rows.append((label, path.stem))
    family = {prefix: i for i, prefix in enumerate(VIT_ZOO)}
    return tuple(
        sorted(
            rows,
            key=lambda row: (family.get(row[1].split("_")[0] + "_", len(VIT_ZOO)), row[1] != "vit_softmax", row[1]),
        )
    )


PRESETS = zoo_presets()


@dataclass(frozen=True)
class Row:
    """One row of a budget's table: ``preset`` names it (and its result files); it trains ``model=<model>`` with
    ``overrides`` after the budget's model size; ``mechanism`` is the ViT preset whose attention it runs."""

    label: str
    preset: str
    model: str
    overrides: Tuple[str, ...] = ()
    mechanism: Optional[str] = None


def attention_override(preset: str, model_dir: Path = ROOT / "configs" / "model") -> str:
    """``++model.attention=<the ViT preset's attention block>`` as a Hydra override (the mechanism and its options
    as the preset spells them, without the ViT's shared keys)."""
    import yaml

    block = yaml.safe_load((model_dir / f"{preset}.yaml").read_text())["attention"]

    def literal(value) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return _hydra_value(value)

    return "++model.attention={" + ",".join(f"{k}:{literal(v)}" for k, v in block.items()) + "}"


# The pyramid budget's mechanisms: ViT presets whose attention runs in every stage of PVTv2-b0 (the ones attention
# transfer converts a softmax PVTv2-b0 into first: benchmarks/transfer_table.py --budget pyramid).
PYRAMID_MECHANISMS = (
    "vit_softmax",
    "vit_linear",
    "vit_focused_linear",
    "vit_pola",
    "vit_agent",
    "vit_inline",
    "vit_mlla",
    "vit_rala",
)
B0_SHAPE = dict(
    depths=[2, 2, 2, 2], drop_path_rate=0.0
)  # PVTv2-b0's depths; no drop-path in 2 epochs (as the cpu ViTs)


def pyramid_rows() -> Tuple[Row, ...]:
    """PVTv2-b0 with each mechanism in every stage (its own SR where the mechanism takes it), then MLLA-T's and
    RAVLT-T's own macro designs (their stems, merging, blocks and stage mix) at PVTv2-b0's depths and widths."""
    labels = dict((preset, label) for label, preset in PRESETS)
    b0 = [f"++model.kwargs.{k}={_hydra_value(v)}" for k, v in B0_SHAPE.items()]
    rows = [
        Row(labels[m], f"pvt_v2_b0_{m[len('vit_') :]}", "pvt_v2_b0", (attention_override(m), b0[1]), m)
        for m in PYRAMID_MECHANISMS
    ]
    rows.append(
        Row(
            "MLLA-T design, b0 size",
            "mlla_b0",
            "mlla_tiny",
            (*b0, "++model.kwargs.embed_dim=32", "++model.kwargs.num_heads=[1,2,4,8]"),
            "vit_mlla",
        )
    )
    # At the budget's lr 2e-3 RAVLT's design diverges once warm-up ends (stage 4's activations grow, the loss goes back
    # to chance: 11% val after epoch 1), with RALA or softmax in stages 3-4 alike; at 1e-3 it trains.
    rows.append(
        Row(
            "RAVLT-T design, b0 size, lr 1e-3",
            "ravlt_b0",
            "ravlt_tiny",
            (
                *b0,
                "++model.kwargs.embed_dims=[32,64,160,256]",
                "++model.kwargs.num_heads=[1,2,5,8]",
                "module.optim.lr=1e-3",
            ),
            "vit_rala",
        )
    )
    return tuple(rows)


@dataclass(frozen=True)
class Budget:
    """What differs between budgets; the recipe itself is ``configs/experiment/<experiment>.yaml``."""

    experiment: str
    vit_kwargs: Dict[str, object]
    resnet_kwargs: Dict[str, object]
    seeds: Dict[str, Tuple[int, ...]] = field(default_factory=dict)  # extra seeds per preset (default: seed 0)
    eval_images: Optional[int] = None  # val images for the robustness sweeps (None = all)
    robustness: str = "zoo"
    pyramid: bool = False  # rows: pyramid_rows() (else every ViT and non-local ResNet preset)
    beside: Optional[str] = None  # the budget whose rows of the same mechanism the table sets beside these


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
    # PVTv2-b0 (3.4M parameters) at 64 px, 2 epochs, the cpu budget's recipe otherwise; about 15 min a row.
    "pyramid": Budget(
        "zoo_pyramid",
        {},
        {},
        seeds={p: (0, 1) for p in ("pvt_v2_b0_softmax", "pvt_v2_b0_linear")},
        eval_images=2000,
        pyramid=True,
        beside="cpu",
    ),
}


def budget_rows(budget: Budget) -> Tuple[Row, ...]:
    """The budget's table rows, in table order."""
    if budget.pyramid:
        return pyramid_rows()
    return tuple(
        Row(label, preset, preset, tuple(model_overrides(budget, preset)))
        for label, preset in PRESETS
        if preset.startswith(VIT_ZOO)
    )


@dataclass(frozen=True)
class Run:
    row: Row
    seed: int
    dir: Path

    @property
    def label(self) -> str:
        return self.row.label

    @property
    def preset(self) -> str:
        return self.row.preset

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


def plan(budget: Budget, work: Path, only: Optional[Sequence[str]], seeds: Optional[Sequence[int]] = None) -> List[Run]:
    """The runs of the budget's rows (``only``: of these presets; ``seeds``: of these seeds), every row's first seed
    before any second one, so that a call stopped halfway has as many rows as it can."""
    rows = [row for row in budget_rows(budget) if not only or row.preset in only]
    runs = [
        Run(row, seed, work / row.preset / f"seed{seed}")
        for row in rows
        for seed in budget.seeds.get(row.preset, (0,))
        if seeds is None or seed in seeds
    ]
    if seeds is not None and not runs:
        offered = sorted({s for row in rows for s in budget.seeds.get(row.preset, (0,))})
        raise SystemExit(f"no run of these presets has seed(s) {sorted(seeds)}; their seeds are {offered}")
    return sorted(runs, key=lambda run: budget.seeds.get(run.preset, (0,)).index(run.seed))


def _hydra_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return str(value)


def model_overrides(budget: Budget, preset: str) -> List[str]:
    kwargs = budget.resnet_kwargs if preset.startswith("nonlocal") else budget.vit_kwargs
    return [f"++model.kwargs.{k}={_hydra_value(v)}" for k, v in kwargs.items()]


def recipe_path(budget: Budget) -> Path:
    return ROOT / "configs" / "experiment" / f"{budget.experiment}.yaml"


def compose(config: str, overrides: Sequence[str]):
    """``configs/<config>.yaml`` composed with ``overrides``, as train.py / eval.py would see it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from vitzoo.options import register_configs

    register_configs()  # the schemas configs/ builds on
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return hydra_compose(config, overrides=list(overrides))


def recipe_data(budget: Budget):
    """The ``data`` group of the budget's recipe, composed (a recipe may build on another)."""
    return compose("train", [f"experiment={budget.experiment}"]).data


def val_images(budget: Budget) -> int:
    """The val split's size: the recipe's ``data.val_fraction`` of CIFAR-10's 50,000 training JPEGs (as the
    data module rounds it), which the result files do not record."""
    return math.ceil(recipe_data(budget).val_fraction * CIFAR10_TRAIN_IMAGES)

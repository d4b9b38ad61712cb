"""The option dataclasses are the one place defaults are written for Python callers; the YAML the command line
composes spells the same values, and unknown or mistyped options are one line naming the valid ones."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from vitzoo.training import ImageClassifier
from vitzoo.training.options import MixupOptions, OptimOptions, TransferOptions, options_from

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


@pytest.mark.parametrize(
    "cls, yaml, key",
    [
        (OptimOptions, "module/default.yaml", "optim"),
        (MixupOptions, "module/default.yaml", "mixup"),
        (TransferOptions, "experiment/transfer.yaml", "transfer"),
    ],
)
def test_the_yaml_defaults_are_the_dataclass_defaults(cls, yaml, key):
    assert OmegaConf.to_container(OmegaConf.load(CONFIGS / yaml)[key]) == dataclasses.asdict(cls())


def test_options_from_takes_instances_mappings_and_none_and_names_bad_keys():
    assert options_from(OptimOptions, "module.optim", None) == OptimOptions()
    assert options_from(OptimOptions, "module.optim", {"lr": 2}).lr == 2
    given = MixupOptions(mixup_alpha=0.8)
    assert options_from(MixupOptions, "module.mixup", given) is given and given.active
    with pytest.raises(ValueError, match=r"module.optim has no option\(s\) \['lrate'\]; valid options: .*'lr'"):
        options_from(OptimOptions, "module.optim", {"lrate": 1.0})
    with pytest.raises(ValueError, match="module.optim.lr must be a number, got 'abc'"):
        options_from(OptimOptions, "module.optim", {"lr": "abc"})


def test_the_classifier_stores_plain_complete_options():
    module = ImageClassifier(
        "vit_cifar",
        "softmax",
        num_classes=10,
        img_size=16,
        optim=OptimOptions(lr=0.1),
        mixup={"cutmix_alpha": 1.0},
        model_kwargs=dict(depth=1, embed_dim=32, num_heads=2),
    )
    assert module.hparams.optim == {**dataclasses.asdict(OptimOptions()), "lr": 0.1}
    assert module.hparams.mixup["cutmix_alpha"] == 1.0 and module.mixup is not None

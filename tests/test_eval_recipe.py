"""eval.py reads its run's recipe: a checkpoint records the eval transform its data ran (the recipe and the deit
recipe's crop), eval.py evaluates through it with no flags, and a data flag on the command line wins and is named."""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils.data import DataLoader, Subset

import vitzoo
from conftest import QUIET_TRAINER, compose_config
from vitzoo.data import DigitsDataModule
from vitzoo.robustness import evaluate
from vitzoo.robustness.run import evaluate_checkpoints, given_transform
from vitzoo.training import build_classifier_for, fit, load_classifier, read_checkpoint
from vitzoo.training import evaluate as clean_evaluate

TINY = dict(depth=1, embed_dim=32, num_heads=2)
IMAGES = 64


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A digits classifier trained two steps with the deit recipe at crop_pct 0.5 (its val images: the centre)."""
    out = tmp_path_factory.mktemp("deit")
    trainer = dict(QUIET_TRAINER, enable_checkpointing=True, max_epochs=1, limit_train_batches=2, limit_val_batches=1)
    result = fit("vit_cifar", DigitsDataModule(recipe="deit", crop_pct=0.5), out, trainer=trainer, model_kwargs=TINY)
    return result.best_checkpoint


def _clean_loss(path, **data) -> float:
    """The clean loss of the checkpoint at ``path`` over the first val images of ``DigitsDataModule(**data)``
    (normalised with the checkpoint's statistics unless ``data`` gives its own)."""
    model, hp = load_classifier(path)
    dm = DigitsDataModule(img_size=hp["img_size"], **{"mean": hp["mean"], "std": hp["std"], **data})
    dm.setup("validate")
    return clean_evaluate(model, DataLoader(Subset(dm.val_dataset, range(IMAGES)), batch_size=IMAGES))["loss"]


def _eval(path, tmp_path, overrides, caplog):
    """eval.py's sweep of the clean pass over ``path`` with the command-line ``overrides``: (loss, start-up line)."""
    caplog.clear()
    base = [f"ckpt_path='{path}'", "robustness=clean", "robustness.progress=false", f"robustness.max_images={IMAGES}"]
    with caplog.at_level(logging.INFO, logger="vitzoo.robustness.api"):
        result = evaluate_checkpoints(compose_config(tmp_path, [*base, *overrides], name="eval"), overrides)
    start = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("evaluating "))
    return next(iter(result["metrics"].values()))["loss"], start


def test_a_classifier_records_the_eval_transform_its_data_runs():
    """The deit recipe's crop as resolved for the model (crop_pct given, interpolation from vit_cifar's
    pretrained_cfg), and the cifar recipe's name alone."""
    deit = build_classifier_for(DigitsDataModule(recipe="deit", crop_pct=0.5), "vit_cifar", model_kwargs=TINY)
    assert deit.hparams.eval_transform == {
        "recipe": "deit",
        "crop_pct": 0.5,
        "interpolation": "bicubic",
        "crop_mode": "center",
    }
    assert build_classifier_for(DigitsDataModule(), "vit_cifar", model_kwargs=TINY).hparams.eval_transform == {
        "recipe": "cifar"
    }


def test_eval_reads_the_checkpoints_recipe_with_no_flags(checkpoint, tmp_path, caplog):
    assert read_checkpoint(checkpoint)["hyper_parameters"]["eval_transform"]["crop_pct"] == 0.5
    loss, start = _eval(checkpoint, tmp_path, [], caplog)
    assert loss == pytest.approx(_clean_loss(checkpoint, recipe="deit", crop_pct=0.5), abs=1e-6)
    assert loss != pytest.approx(_clean_loss(checkpoint), abs=1e-4)  # the data config's cifar recipe
    assert start.endswith(
        "inputs: softmax: deit recipe (crop_pct 0.5, bicubic, center crop) as trained (its checkpoint's)"
    )


@pytest.mark.parametrize(
    "flag, data",
    [
        ("+data.crop_pct=1.0", dict(recipe="deit", crop_pct=1.0)),
        ("+data.recipe=cifar", dict(recipe="cifar")),
        ("+data.mean=[0.2,0.2,0.2]", dict(recipe="deit", crop_pct=0.5, mean=[0.2] * 3)),
    ],
)
def test_a_flag_on_the_command_line_wins_and_is_named(checkpoint, tmp_path, caplog, flag, data):
    loss, start = _eval(checkpoint, tmp_path, [flag], caplog)
    assert loss == pytest.approx(_clean_loss(checkpoint, **data), abs=1e-6)
    named = flag.lstrip("+").replace("[0.2,0.2,0.2]", "[0.2, 0.2, 0.2]")
    assert f"{named} given over its checkpoint's deit recipe (crop_pct 0.5, bicubic, center crop)" in start, start


def test_a_checkpoint_without_the_record_reads_the_data_config_and_says_so(checkpoint, tmp_path, caplog):
    old = torch.load(checkpoint, map_location="cpu", weights_only=True)
    del old["hyper_parameters"]["eval_transform"]
    torch.save(old, tmp_path / "old.ckpt")
    loss, start = _eval(tmp_path / "old.ckpt", tmp_path, [], caplog)
    assert loss == pytest.approx(_clean_loss(tmp_path / "old.ckpt"), abs=1e-6)
    assert "softmax: the data config's cifar recipe, as it records no eval transform" in start
    assert "pass data.recipe=... data.crop_pct=... data.interpolation=... as it was trained" in start


def test_only_the_fields_the_command_line_sets_are_given(tmp_path):
    cfg = compose_config(tmp_path, ["ckpt_path=x", "data=imagefolder", "data.root=r"], name="eval")
    assert given_transform(cfg.data, ["ckpt_path=x", "data=imagefolder", "data.root=r"]) == {}
    assert given_transform(cfg.data, ["data.recipe=deit", "++data.crop_pct=0.9"]) == {
        "recipe": cfg.data.recipe,
        "crop_pct": cfg.data.crop_pct,
    }


def test_an_unknown_transform_field_is_one_line_naming_the_valid_ones():
    model = vitzoo.create_model("vit_cifar", img_size=16, num_classes=10, **TINY)
    with pytest.raises(ValueError, match=r"transform has no option\(s\) \['crop'\]; valid options: \['crop_pct', "):
        evaluate(model, DigitsDataModule, transform={"crop": 1.0})

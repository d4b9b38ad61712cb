"""vitzoo.robustness.evaluate from plain Python (no Hydra): a model and a data module class in, a result that
writes eval.py's files out."""

from __future__ import annotations

import json

import pytest
import torch
from torch.utils.data import DataLoader, Subset

import vitzoo
from vitzoo.data import DigitsDataModule
from vitzoo.robustness import RobustnessResult, evaluate
from vitzoo.training import evaluate as clean_evaluate


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return vitzoo.create_model(
        "vit_cifar", attention="linear", img_size=16, num_classes=10, depth=1, embed_dim=32, num_heads=2
    ).eval()


def test_evaluate_runs_a_sweep_and_writes_eval_pys_files(model, tmp_path):
    result = evaluate(
        {"linear": model},
        DigitsDataModule,
        max_images=40,
        corruptions=["gaussian_noise", "frost"],
        severities=[1, 3],
        logit_noise=[0.5],
        adversarial=[2],
        out_dir=tmp_path,
    )
    assert isinstance(result, RobustnessResult)
    tests = [(r["test"], r.get("severity", r.get("level"))) for r in result.records]
    assert [t for t, _ in tests] == ["clean", *["gaussian_noise"] * 2, *["frost"] * 2, "logit_noise", "pgd_linf"]
    assert all(r["num_images"] == 40 for r in result.records)
    mean, std = model.pretrained_cfg["mean"], model.pretrained_cfg["std"]
    dm = DigitsDataModule(img_size=16, mean=mean, std=std)
    dm.setup("validate")
    expected = clean_evaluate(model, DataLoader(Subset(dm.val_dataset, range(40)), batch_size=40))
    assert result.metrics["linear"]["acc1"] == pytest.approx(expected["acc1"], abs=1e-6)
    assert {p.name for p in tmp_path.iterdir()} >= {
        "robustness.json",
        "robustness.csv",
        "metrics.json",
        "corruptions.png",
        "logit_noise.png",
        "adversarial.png",
    }
    saved = json.loads((tmp_path / "robustness.json").read_text())
    assert saved["records"] == json.loads(json.dumps(result.records)) and saved["data"] == "Digits val split"
    assert saved["sweep"]["adversarial"] == [2] and saved["checkpoints"]["linear"]["path"] is None
    assert any("robustness.json" in line for line in result.write(tmp_path / "again", plots=False, tensorboard=False))


def test_evaluate_names_its_valid_options(model):
    with pytest.raises(ValueError, match=r"robustness has no option\(s\) \['severity'\]; valid options: .*'sever"):
        evaluate(model, DigitsDataModule, severity=[1])
    with pytest.raises(ValueError, match=r"baseline='other' is not one of the evaluated models \['linear'\]"):
        evaluate(model, DigitsDataModule, baseline="other")

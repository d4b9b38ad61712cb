"""vitzoo.training.fit from plain Python: a model name, a data module and the option dataclasses, no Hydra."""

from __future__ import annotations

import json
import math

import pytest

from vitzoo.data import SyntheticDataModule
from vitzoo.options import ClassifierOptions, OptimOptions, TransferOptions
from vitzoo.training import FitResult, ImageClassifier, fit
from vitzoo.training.evaluate import read_checkpoint

TINY = dict(depth=1, embed_dim=32, num_heads=2)


def _data() -> SyntheticDataModule:
    return SyntheticDataModule(img_size=16, num_classes=4, num_train=32, num_val=16, batch_size=16)


def test_fit_trains_a_named_model_and_returns_metrics_and_checkpoint(tmp_path):
    result = fit(
        "vit_cifar",
        _data(),
        tmp_path,
        attention="linear",
        model_kwargs=TINY,
        options=ClassifierOptions(optim=OptimOptions(lr=3e-3), label_smoothing=0.1),
        trainer=dict(max_epochs=1, accelerator="cpu", enable_progress_bar=False, enable_model_summary=False),
    )
    assert isinstance(result, FitResult) and isinstance(result.module, ImageClassifier)
    assert result.metrics["global_step"] == 2 and math.isfinite(result.metrics["val/loss"])
    assert json.loads((tmp_path / "metrics.json").read_text()) == result.metrics
    saved = read_checkpoint(result.best_checkpoint)
    assert result.best_checkpoint.is_relative_to(tmp_path) and saved["hyper_parameters"]["attention"] == "linear"
    assert saved["hyper_parameters"]["optim"]["lr"] == 3e-3 and saved["hyper_parameters"]["label_smoothing"] == 0.1
    assert saved["hyper_parameters"]["num_classes"] == 4 and saved["hyper_parameters"]["img_size"] == 16


def test_fit_names_what_a_python_caller_gets_wrong(tmp_path):
    with pytest.raises(ValueError, match=r"^fit needs the run's length: pass trainer=\{'max_epochs': N\}"):
        fit("vit_cifar", _data(), tmp_path, model_kwargs=TINY, trainer={})
    with pytest.raises(ValueError, match=r"^module.optim has no option\(s\) \['lrate'\]; valid options"):
        fit("vit_cifar", _data(), tmp_path, options={"optim": {"lrate": 1}}, trainer={"max_epochs": 1})
    with pytest.raises(ValueError, match=r"stage 1 starts from a pretrained softmax ViT: pass init_from=<timm"):
        fit("vit_cifar", _data(), tmp_path, model_kwargs=TINY, transfer=TransferOptions(), trainer={"max_epochs": 1})
    module = ImageClassifier("vit_cifar", "softmax", num_classes=4, img_size=16, model_kwargs=TINY)
    with pytest.raises(ValueError, match=r"fit got a built module and \['attention'\], which build one"):
        fit(module, _data(), tmp_path, attention="linear", trainer={"max_epochs": 1})
    assert not any(tmp_path.iterdir())

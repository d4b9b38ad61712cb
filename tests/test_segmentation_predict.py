"""vitzoo.segmentation.predict: the plain-Python prediction API answers what the module's own inference answers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

from conftest import QUIET_TRAINER
from test_segmentation import export_dir  # noqa: F401  (the tiny linear-attention ViT export)
from vitzoo.segmentation import (
    SegmentationDataModule,
    SegmentationModule,
    load_segmenter,
    predict,
    sliding_window_probs,
)
from vitzoo.segmentation.thin import make_thin_dataset, thin_data_options


@pytest.fixture(scope="module")
def checkpoint(export_dir, tmp_path_factory) -> Path:  # noqa: F811
    """A --config-name segment style checkpoint: simple_fpn, ce+dice, balanced weights, two training steps."""
    tmp_path = tmp_path_factory.mktemp("seg")
    root = make_thin_dataset(tmp_path / "thin", n=5, size=64, seed=0)
    thin = thin_data_options()
    dm = SegmentationDataModule(str(root), img_size=32, batch_size=4, num_workers=0, **thin)
    module = SegmentationModule(
        str(export_dir),
        thin["num_classes"],
        class_names=thin["class_names"],
        decoder_channels=16,
        neck="simple_fpn",
        loss="ce+dice",
        class_weights="balanced",
        window=32,
    )
    trainer = L.Trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0, **QUIET_TRAINER)
    trainer.fit(module, datamodule=dm)
    trainer.save_checkpoint(tmp_path / "seg.ckpt")
    return tmp_path / "seg.ckpt"


def test_predict_writes_the_masks_the_module_computes(checkpoint, tmp_path):
    test = make_thin_dataset(tmp_path / "test", n=2, size=72, seed=9)  # no multiple of the window
    summary = predict(
        str(checkpoint), str(test / "image"), str(tmp_path / "out"), masks=str(test / "label"), overlap=0.5
    )
    loaded, data = load_segmenter(str(checkpoint))
    assert loaded.hparams.neck == "simple_fpn" and data["mask_values"] == {0: 1, 255: 0}
    confusion = np.zeros((2, 2), np.int64)
    for path in sorted((test / "image").iterdir()):
        image = torch.from_numpy(np.asarray(Image.open(path), np.float32) / 255).expand(3, -1, -1)
        with torch.no_grad():
            classes = sliding_window_probs(loaded.net, image, 32, overlap=0.5).argmax(0).numpy()
        written = np.asarray(Image.open(tmp_path / "out" / f"{path.stem}.png"))
        assert np.array_equal(written, np.where(classes == 1, 0, 255))  # walls written back as 0
        truth = (np.asarray(Image.open(test / "label" / path.name)) == 0).astype(np.int64)
        np.add.at(confusion, (truth.ravel(), classes.ravel()), 1)
    wall_iou = confusion[1, 1] / (confusion[1, 1] + confusion[0, 1] + confusion[1, 0])
    assert summary["images"] == 2 and summary["overlap"] == 0.5 and summary["window"] == 32
    assert summary["scores"]["iou/wall"] == pytest.approx(wall_iou)
    assert json.loads((tmp_path / "out" / "predict.json").read_text())["scores"] == summary["scores"]


@pytest.mark.slow
def test_predict_py_is_the_same_call(checkpoint, tmp_path):
    test = make_thin_dataset(tmp_path / "test", n=1, size=40, seed=3)
    expected = predict(str(checkpoint), str(test / "image"), str(tmp_path / "api"), masks=str(test / "label"))
    subprocess.run(
        [
            sys.executable,
            "predict.py",
            f"ckpt_path={checkpoint}",
            f"input={test / 'image'}",
            f"masks={test / 'label'}",
            f"output={tmp_path / 'cli'}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        check=True,
        cwd=Path(__file__).parents[1],
        capture_output=True,
    )
    assert (tmp_path / "cli" / "0000.png").read_bytes() == (tmp_path / "api" / "0000.png").read_bytes()
    assert json.loads((tmp_path / "cli" / "predict.json").read_text())["scores"] == expected["scores"]

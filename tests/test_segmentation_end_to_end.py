"""A user's own data set in its awkward real-world shape -> fine-tuned export -> predicted masks and a score.

The data set: grayscale ``.tif`` images in ``image/``, 0/255 ``.png`` masks in ``label/``, bright blobs
(foreground) on a noisy dark background, images of different sizes all larger than the training crop.
"""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import numpy as np
import pytest
from hydra.utils import instantiate
from PIL import Image

from conftest import QUIET, compose_config
from test_segmentation import export_dir  # noqa: F401  (the tiny linear-attention ViT export fixture)
from vitzoo.segmentation import predict
from vitzoo.training import train


def _blobs(rng: np.random.Generator, h: int, w: int):
    """(grayscale uint8 image, 0/255 mask) with 2-4 bright discs as foreground."""
    yy, xx = np.mgrid[:h, :w]
    fg = np.zeros((h, w), bool)
    for _ in range(int(rng.integers(2, 5))):
        cy, cx, r = rng.integers(0, h), rng.integers(0, w), rng.integers(5, 12)
        fg |= (yy - cy) ** 2 + (xx - cx) ** 2 < r**2
    image = np.where(fg, 190.0, 70.0) + rng.normal(0, 25, (h, w))
    return np.clip(image, 0, 255).astype(np.uint8), np.where(fg, 255, 0).astype(np.uint8)


def _write_set(root: Path, count: int, seed: int, sizes=(48, 72)) -> Path:
    (root / "image").mkdir(parents=True)
    (root / "label").mkdir()
    rng = np.random.default_rng(seed)
    for i in range(count):
        h, w = (int(s) for s in rng.integers(sizes[0], sizes[1] + 1, 2))
        image, mask = _blobs(rng, h, w)
        Image.fromarray(image).save(root / "image" / f"slice_{i:02d}.tif")  # grayscale, another extension
        Image.fromarray(mask).save(root / "label" / f"slice_{i:02d}.png")
    return root


@pytest.mark.slow
def test_awkward_folder_trains_from_an_export_and_predicts_full_size_masks(export_dir, tmp_path):  # noqa: F811
    root = _write_set(tmp_path / "membranes", count=20, seed=0)
    overrides = [
        f"data.root={root}",
        "data.num_classes=2",
        "data.mask_values={0: 0, 255: 1}",
        "data.class_names=[background,blob]",
        "data.img_size=32",
        "data.batch_size=8",
        "data.repeats=4",
        "data.num_workers=0",
        f"module.backbone={export_dir}",
        "module.lr=3e-3",
        "module.backbone_lr_ratio=1.0",
        "module.warmup_epochs=0.5",
        "trainer.max_epochs=3",
        *(f"+{q}" for q in QUIET),
        "trainer.log_every_n_steps=5",
    ]  # the segment config has no debug group
    cfg = compose_config(tmp_path / "run", overrides, name="segment")

    dm = instantiate(cfg.data)
    dm.setup()
    background, foreground, ignored = dm.class_pixels["train"]
    assert background > 0 and foreground > 0 and ignored == 0  # 255 is a class now, not ignore_index
    _, masks = next(iter(dm.train_dataloader()))
    assert {0, 1} <= set(masks.unique().tolist())  # training batches carry both classes

    L.seed_everything(cfg.seed)
    before = L.Trainer(logger=False, enable_progress_bar=False, enable_model_summary=False).validate(
        instantiate(cfg.module), datamodule=dm, verbose=False
    )[0]
    metrics = train(cfg)  # seeds the same way: starts from the same decoder
    assert metrics["val/iou/blob"] > before["val/iou/blob"] + 0.2 and metrics["val/iou/blob"] > 0.6, (before, metrics)
    assert metrics["val/pixel_acc"] > metrics["val/majority/pixel_acc"] == metrics["val/majority/iou/background"]
    assert metrics["val/dice/blob"] > metrics["val/majority/dice/blob"] == 0

    # predict on new, larger images (up to 3x the 32 px crop, sizes no multiple of the patch) and score them
    test = _write_set(tmp_path / "test", count=3, seed=1, sizes=(70, 98))
    summary = predict(metrics["best_ckpt"], str(test / "image"), str(tmp_path / "predicted"), masks=str(test / "label"))
    for image_path in sorted((test / "image").iterdir()):
        predicted = np.asarray(Image.open(tmp_path / "predicted" / f"{image_path.stem}.png"))
        assert predicted.shape == np.asarray(Image.open(image_path)).shape  # the input's size, not the crop's
        assert set(np.unique(predicted)) <= {0, 255}  # written in the masks' own values
    assert summary["images"] == 3 and summary["images_per_s"] > 0 and summary["peak_memory_mib"] > 0
    assert summary["scores"]["iou/blob"] > 0.6 and summary["scores"]["majority/iou/blob"] == 0
    assert json.loads((tmp_path / "predicted" / "predict.json").read_text())["scores"] == summary["scores"]

    # one file, scored against a folder holding other images' masks too; flip TTA and probability maps
    one = test / "image" / "slice_01.tif"
    single = predict(
        metrics["best_ckpt"], str(one), str(tmp_path / "one"), masks=str(test / "label"), flip=True, probs=True
    )
    probs = np.load(tmp_path / "one" / "slice_01_probs.npy")
    assert single["images"] == 1 and single["flip"] is True and probs.shape == (2, *Image.open(one).size[::-1])
    np.testing.assert_allclose(probs.astype(np.float32).sum(0), 1, atol=2e-3)
    sure = np.abs(probs[1].astype(np.float32) - 0.5) > 0.01  # float16 maps: ties may round either way
    assert np.array_equal(
        (np.asarray(Image.open(tmp_path / "one" / "slice_01.png")) // 255)[sure], probs.argmax(0)[sure]
    )

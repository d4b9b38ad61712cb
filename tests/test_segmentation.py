"""vitzoo.segmentation: shapes data, folder data module, and an export fine-tuned until it segments."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from PIL import Image
from torchmetrics.classification import MulticlassJaccardIndex

import vitzoo
from conftest import QUIET_TRAINER, compose_config
from vitzoo.export import export_model
from vitzoo.training import train
from vitzoo.segmentation import (
    SHAPE_CLASSES,
    LabelMap,
    SegmentationDataModule,
    SegmentationFolder,
    SegmentationModule,
    SegmentationNet,
    create_backbone,
    find_samples,
    make_shapes_dataset,
)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", attention="linear", depth=2, embed_dim=64, num_heads=2, img_size=32)
    return export_model(model, tmp_path_factory.mktemp("export"), head=False)


def test_shapes_masks_mark_the_drawn_shapes(tmp_path):
    root = make_shapes_dataset(tmp_path, num_images=6, size=(40, 70), seed=1)
    sizes = set()
    for image_path in sorted((root / "images").iterdir()):
        image = np.asarray(Image.open(image_path)).astype(float)
        mask = np.asarray(Image.open(root / "masks" / image_path.name))
        assert mask.shape == image.shape[:2] and set(np.unique(mask)) <= set(range(len(SHAPE_CLASSES)))
        sizes.add(mask.shape)
        for cls, channel in ((1, 0), (2, 1), (3, 2)):  # rectangles red, ellipses green, triangles blue
            if (mask == cls).sum() > 20:
                pixels = image[mask == cls]
                assert pixels[:, channel].mean() > pixels[:, [c for c in range(3) if c != channel]].mean() + 60
    assert len(sizes) > 1  # images of any size


def test_folder_yields_fixed_size_train_crops_and_native_size_val_images(tmp_path):
    root = make_shapes_dataset(tmp_path, num_images=10, seed=2)
    dm = SegmentationDataModule(
        root, num_classes=4, img_size=32, batch_size=4, val_fraction=0.3, num_workers=0, repeats=3
    )
    dm.setup()
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (7 * 3, 3)  # repeats: 3 passes over 7 images
    images, masks = next(iter(dm.train_dataloader()))
    assert images.shape == (4, 3, 32, 32) and images.dtype == torch.float32 and 0 <= images.min() <= images.max() <= 1
    assert masks.shape == (4, 32, 32) and masks.dtype == torch.long
    assert set(masks.unique().tolist()) <= {0, 1, 2, 3, 255}
    for (image, mask), sample in zip(dm.val_dataloader(), dm.val_dataset.samples):
        w, h = Image.open(sample.image).size
        assert image.shape == (1, 3, h, w) and mask.shape == (1, h, w)


def test_folder_bad_input_names_the_fix(tmp_path):
    root = make_shapes_dataset(tmp_path / "data", num_images=2)
    samples = find_samples(root)
    w, h = Image.open(root / "images" / "00000.png").size
    Image.fromarray(np.full((h, w), 9, np.uint8)).save(root / "masks" / "00000.png")
    with pytest.raises(ValueError, match=r"values \[9\] outside the classes 0..3 .*set data.num_classes"):
        SegmentationFolder(samples, LabelMap(4))[0]
    Image.fromarray(np.zeros((h + 1, w), np.uint8)).save(root / "masks" / "00000.png")
    with pytest.raises(ValueError, match="must match their image's size"):
        SegmentationFolder(samples, LabelMap(4))[0]
    Image.new("RGB", (w, h)).save(root / "masks" / "00000.png")
    with pytest.raises(ValueError, match="single-channel images"):
        SegmentationFolder(samples, LabelMap(4))[0]
    with pytest.raises(FileNotFoundError, match="none of the usual image folders.*data.images="):
        find_samples(tmp_path)


def test_backbone_choice_errors_name_the_fix(export_dir):
    with pytest.raises(ValueError, match="drop the attention option"):
        create_backbone(str(export_dir), attention="softmax")
    with pytest.raises(ValueError, match="neither an export directory nor an architecture"):
        create_backbone("vit_huge")
    net = SegmentationNet(create_backbone(f"local-dir:{export_dir}"), num_classes=3)
    with pytest.raises(ValueError, match="not divisible by the backbone stride 4.*data.img_size"):
        net(torch.rand(1, 3, 30, 32))
    pyramid = SegmentationNet(create_backbone("nonlocal_resnet18", "linear", out_indices=(1, 2, 3, 4)), 3)
    assert pyramid.stride == 32 and pyramid(torch.rand(1, 3, 64, 64)).shape == (1, 3, 64, 64)


def _miou(module: SegmentationModule, loader) -> float:
    metric = MulticlassJaccardIndex(4)
    was_training = module.training
    module.eval()
    with torch.no_grad():
        for images, masks in loader:  # one native-size image per batch, in sliding windows
            metric.update(module.predict_probs(images[0])[None], masks)
    module.train(was_training)
    return float(metric.compute())


@pytest.mark.slow  # 10 training epochs: about a minute on two CPU cores
def test_export_fine_tunes_to_segment_shapes(export_dir, tmp_path):
    """configs/segment_shapes.yaml on the export: mIoU from ~chance to well above it in 10 CPU epochs."""
    torch.manual_seed(0)
    cfg = compose_config(
        tmp_path,
        [
            f"data.root={tmp_path / 'shapes'}",
            "data.num_images=80",
            "data.img_size=32",
            f"module.backbone={export_dir}",
            "module.backbone_lr_ratio=1.0",
            "module.warmup_epochs=0.5",
        ],
        name="segment_shapes",
    )
    dm = instantiate(cfg.data)
    dm.prepare_data()
    dm.setup()
    module = instantiate(cfg.module)
    before = _miou(module, dm.val_dataloader())
    trainer = L.Trainer(max_epochs=10, **QUIET_TRAINER)
    trainer.fit(module, datamodule=dm)
    after = _miou(module, dm.val_dataloader())
    assert after > 0.6 and after > before + 0.4, (before, after)  # all-background scores ~0.2
    assert abs(float(trainer.callback_metrics["val/miou"]) - after) < 1e-5
    assert float(trainer.callback_metrics["val/pixel_acc"]) > 0.85
    # the module's checkpoint is plain data: it reloads with weights_only=True
    trainer.save_checkpoint(tmp_path / "seg.ckpt")
    reloaded = SegmentationModule.load_from_checkpoint(tmp_path / "seg.ckpt", weights_only=True)
    assert abs(_miou(reloaded, dm.val_dataloader()) - after) < 1e-6


def test_train_py_runs_the_segment_config(export_dir, tmp_path, caplog):
    """`python train.py --config-name segment_shapes module.backbone=<export>`: the same train() as classification;
    it records and logs IoU / Dice per named class beside the majority baseline."""
    cfg = compose_config(
        tmp_path,
        [
            f"data.root={tmp_path / 'shapes'}",
            "data.num_images=24",
            "data.img_size=32",
            f"module.backbone={export_dir}",
            "trainer.max_epochs=1",
            "trainer.accelerator=cpu",
            "callbacks.rich_progress_bar=null",
            "+trainer.enable_progress_bar=false",
            "data.class_names=[ground,box,oval,wedge]",
        ],
        name="segment_shapes",
    )
    with caplog.at_level(logging.INFO, logger="vitzoo"):
        metrics = train(cfg)
    assert 0.0 <= metrics["val/miou"] <= 1.0 and metrics["global_step"] > 0
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    recorded = json.loads((tmp_path / "metrics.json").read_text())
    names = ("ground", "box", "oval", "wedge")
    for key in ("miou", "mdice", "pixel_acc", *(f"{score}/{name}" for score in ("iou", "dice") for name in names)):
        assert 0.0 <= recorded[f"val/{key}"] <= 1.0 and 0.0 <= recorded[f"val/majority/{key}"] <= 1.0, key
    assert recorded["val/majority/iou/ground"] == recorded["val/majority/pixel_acc"] > 0.5  # background dominates
    closing = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("validation after epoch 0: "))
    shown = [
        f"{name} {recorded[f'val/iou/{name}']:.3f} / {recorded[f'val/dice/{name}']:.3f} "
        f"({recorded[f'val/majority/iou/{name}']:.3f} / {recorded[f'val/majority/dice/{name}']:.3f})"
        for name in names
    ]
    assert f"IoU / Dice (in brackets: ground everywhere): {', '.join(shown)}; mean " in closing
    accuracy = f"pixel accuracy {recorded['val/pixel_acc']:.3f} ({recorded['val/majority/pixel_acc']:.3f})"
    assert closing.endswith(accuracy)
    reloaded = SegmentationModule.load_from_checkpoint(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert reloaded.hparams.backbone == str(export_dir) and reloaded.class_names == names


def test_cifar_stem_resnet_export_segments_through_vitzoo(tmp_path):
    """smp rejects the CIFAR stem's stride-1..8 pyramid (docs/export.md); vitzoo's decoder takes any pyramid."""
    torch.manual_seed(0)
    export_model(
        vitzoo.create_model(
            "nonlocal_resnet18_cifar", attention="linear", num_classes=0, channels=[8, 16, 32, 64], stem_width=8
        ),
        tmp_path,
    )
    backbone = create_backbone(str(tmp_path), out_indices=(1, 2, 3, 4))
    assert backbone.feature_info.reduction() == [1, 2, 4, 8]
    net = SegmentationNet(backbone, num_classes=3).eval()
    with torch.no_grad():
        assert net(torch.rand(1, 3, 48, 64)).shape == (1, 3, 48, 64)

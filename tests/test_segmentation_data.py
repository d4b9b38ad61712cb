"""Segmentation data as users have it: folder layouts, pairing, TIFF stacks, label values, grayscale."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vitzoo
from vitzoo.export import export_model
from vitzoo.segmentation import (
    LabelMap,
    Sample,
    SegmentationDataModule,
    SegmentationFolder,
    SegmentationNet,
    create_backbone,
    find_samples,
)
from vitzoo.segmentation.io import read_image


def _save(path: Path, array: np.ndarray) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)
    return path


def _binary_set(root: Path, count: int = 5, size=(24, 32), image_ext=".tif", mask_dir="label", suffix="") -> Path:
    """Grayscale images and 0/255 masks whose foreground is the bright left half."""
    rng = np.random.default_rng(0)
    for i in range(count):
        mask = np.zeros(size, np.uint8)
        mask[:, : size[1] // 2] = 255
        image = np.where(mask > 0, 200, 50).astype(np.uint8) + rng.integers(0, 20, size, dtype=np.uint8)
        _save(root / "image" / f"s{i}{image_ext}", image)
        _save(root / mask_dir / f"s{i}{suffix}.png", mask)
    return root


def _stack(path: Path, pages) -> Path:
    images = [Image.fromarray(p) for p in pages]
    images[0].save(path, save_all=True, append_images=images[1:])
    return path


def test_stems_pair_across_extensions_in_the_usual_folder_names(tmp_path, monkeypatch):
    root = _binary_set(tmp_path, count=3, image_ext=".tif", mask_dir="label")
    samples = find_samples(root)
    assert [(s.image.name, s.mask.name, s.frame) for s in samples] == [
        (f"s{i}.tif", f"s{i}.png", None) for i in range(3)
    ]
    with_suffix = _binary_set(tmp_path / "b", count=2, image_ext=".jpg", mask_dir="gt", suffix="_mask")
    assert [s.mask.name for s in find_samples(with_suffix, mask_suffix="_mask")] == ["s0_mask.png", "s1_mask.png"]
    only_png = find_samples(with_suffix, images="image/*.jpg", masks=str(with_suffix / "gt"), mask_suffix="_mask")
    assert len(only_png) == 2  # a glob relative to root, an absolute folder
    (with_suffix / "image" / "notes.txt").write_text("not an image")
    assert len(find_samples(with_suffix, mask_suffix="_mask")) == 2  # a folder: its image files
    with pytest.raises(ValueError, match="notes.txt is not an image .* a glob such as"):
        find_samples(with_suffix, images="image/*", mask_suffix="_mask")
    monkeypatch.chdir(tmp_path)
    assert [s.image for s in find_samples("b", mask_suffix="_mask")] == [Path("b/image/s0.jpg"), Path("b/image/s1.jpg")]


def test_files_without_partner_are_named_or_skipped_with_a_warning(tmp_path, caplog):
    root = _binary_set(tmp_path, count=4)
    (root / "label" / "s1.png").unlink()
    _save(root / "label" / "orphan.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(
        FileNotFoundError,
        match=r"1 images without a mask \(s1.tif\); 1 masks without an image "
        r"\(orphan.png\).*data.unpaired=skip",
    ):
        find_samples(root)
    with caplog.at_level(logging.WARNING):
        samples = find_samples(root, unpaired="skip")
    assert [s.image.name for s in samples] == ["s0.tif", "s2.tif", "s3.tif"]
    assert "s1.tif" in caplog.text and "orphan.png" in caplog.text
    _save(root / "image" / "s0.png", np.zeros((4, 4), np.uint8))
    with pytest.raises(ValueError, match="s0.png and s0.tif are both images for 's0'"):
        find_samples(root, unpaired="skip")


def test_layout_errors_name_the_option(tmp_path):
    (tmp_path / "images").mkdir()
    (tmp_path / "img").mkdir()
    with pytest.raises(FileNotFoundError, match="several of the usual image folders.*data.images=<folder or glob>"):
        find_samples(tmp_path)
    with pytest.raises(FileNotFoundError, match="data.root='.*nowhere' is not a folder"):
        find_samples(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="holds no images"):
        find_samples(tmp_path, images="images", masks="img")


def test_tiff_stacks_split_into_pages(tmp_path):
    rng = np.random.default_rng(0)
    pages = [rng.integers(0, 256, (16, 20), dtype=np.uint8) for _ in range(3)]
    masks = [(p > 128).astype(np.uint8) * 255 for p in pages]
    _stack(tmp_path / "train-volume.tif", pages)
    _stack(tmp_path / "train-labels.tif", masks)
    samples = find_samples(tmp_path, images="train-volume.tif", masks="train-labels.tif")
    assert [(s.frame, s.name) for s in samples] == [
        (0, "train-volume_0000"),
        (1, "train-volume_0001"),
        (2, "train-volume_0002"),
    ]
    folder = SegmentationFolder(samples, LabelMap(2, mask_values={0: 0, 255: 1}), in_chans=1)
    for page, mask, (image, target) in zip(pages, masks, folder):
        torch.testing.assert_close(image[0], torch.from_numpy(page / 255).float())
        assert torch.equal(target, torch.from_numpy(mask // 255).long())
    _stack(tmp_path / "short-labels.tif", masks[:2])
    with pytest.raises(ValueError, match="train-volume.tif has 3 page.* short-labels.tif has 2"):
        find_samples(tmp_path, images="train-volume.tif", masks="short-labels.tif")


def test_label_map_maps_checks_and_writes_back():
    raw = np.array([[0, 255], [255, 0]])
    labels = LabelMap(2, mask_values={0: 0, 255: 1})
    assert labels(raw).tolist() == [[0, 1], [1, 0]] and labels.to_source(labels(raw)).tolist() == raw.tolist()
    with pytest.raises(ValueError, match=r"m.png holds values \[7\] that data.mask_values .* does not map"):
        labels(np.array([0, 7]), "m.png")
    with pytest.raises(
        ValueError,
        match=r"values \[255\] outside the classes 0..1 and ignore_index=254; for binary "
        r"masks map them to classes, the object to 1: data.mask_values='\{0: 0, "
        r"255: 1\}' if 255 marks the object \('\{0: 1, 255: 0\}' if 0 does",
    ):
        LabelMap(2, ignore_index=254)(raw)
    jpeg = LabelMap(2, binary_threshold=128)
    assert jpeg(np.array([3, 127, 128, 250])).tolist() == [0, 0, 1, 1]
    assert jpeg.to_source(np.array([0, 1])).tolist() == [0, 255]
    ignoring = LabelMap(3, mask_values={0: 0, 1: 255, 2: 1, 3: 2})
    assert ignoring(np.array([0, 1, 2, 3])).tolist() == [0, 255, 1, 2]
    for kwargs, message in (
        ({"num_classes": 1}, "needs 2 or more classes"),
        ({"num_classes": 4, "ignore_index": 3}, "ignore_index=3 is one of the 4 class indices"),
        ({"num_classes": 2, "mask_values": {0: 0, 255: 5}}, r"maps \{255: 5\} outside"),
        ({"num_classes": 3, "binary_threshold": 128}, "set data.num_classes=2"),
    ):
        with pytest.raises(ValueError, match=message):
            LabelMap(**kwargs)


def test_the_issue_case_0_255_masks_with_ignore_255_is_an_error_before_training(tmp_path):
    """0/255 masks, num_classes=2, default ignore_index=255: the whole of class 255 would be ignored."""
    root = _binary_set(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"data.num_classes=2 but the masks hold no pixel of class 1 .*50% of "
        r"the training pixels equal ignore_index=255.*mask_values='\{0: 0, 255: 1\}'",
    ):
        SegmentationDataModule(root, num_classes=2, num_workers=0).setup()
    with pytest.raises(
        ValueError,
        match=r"num_classes=256 but the masks hold no pixel of class 2..255 \(set "
        r"data.num_classes=2\)",
    ):
        SegmentationDataModule(
            root, num_classes=256, mask_values={0: 0, 255: 1}, ignore_index=256, num_workers=0
        ).setup()


def test_setup_logs_the_class_histogram_and_grayscale_replication(tmp_path, caplog):
    root = _binary_set(tmp_path)
    dm = SegmentationDataModule(
        root, num_classes=2, mask_values={0: 0, 255: 1}, img_size=16, batch_size=2, num_workers=0
    )
    with caplog.at_level(logging.INFO, logger="vitzoo.segmentation"):
        dm.setup()
    assert dm.class_pixels["train"].tolist() == [4 * 24 * 16, 4 * 24 * 16, 0]  # 4 train images, half foreground
    assert "training mask pixels: class_0 50.0%, class_1 50.0%, ignored 0.0%" in caplog.text
    assert "5 of 5 images are grayscale: replicated to 3 channels" in caplog.text
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 16, 16) and torch.equal(images[:, 0], images[:, 2])


def test_in_chans_1_reads_one_channel_and_sums_the_exported_patch_embedding(tmp_path):
    root = _binary_set(tmp_path / "data", count=2)
    dm = SegmentationDataModule(
        root, num_classes=2, mask_values={0: 0, 255: 1}, in_chans=1, img_size=16, val_fraction=0.5, num_workers=0
    )
    dm.setup()
    image, _ = dm.val_dataset[0]
    assert image.shape == (1, 24, 32)
    _save(tmp_path / "rgb.png", np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(ValueError, match="colour image .* data.in_chans=1; set data.in_chans=3"):
        read_image(Sample(tmp_path / "rgb.png"), in_chans=1)
    sixteen = _save(tmp_path / "16bit.png", np.array([[0, 65535]], np.uint16))
    assert read_image(Sample(sixteen), in_chans=1)[..., 0].tolist() == [[0.0, 1.0]]

    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", attention="linear", depth=1, embed_dim=32, num_heads=2, img_size=32)
    export = export_model(model, tmp_path / "export", head=False)
    net = SegmentationNet(create_backbone(str(export), in_chans=1), num_classes=2)
    conv = next(m for m in net.backbone.modules() if isinstance(m, torch.nn.Conv2d))
    torch.testing.assert_close(conv.weight[:, 0], model.patch_embed.proj.weight.sum(1))
    assert net.mean.flatten().tolist() == pytest.approx([sum(model.pretrained_cfg["mean"]) / 3])
    assert net(torch.rand(1, 1, 16, 16)).shape == (1, 2, 16, 16)


def test_data_module_options_are_checked(tmp_path):
    root = _binary_set(tmp_path)
    for kwargs, message in (
        ({"repeats": 0}, "data.repeats=0 must be an integer >= 1"),
        ({"rescale": (1.5, 1.0)}, r"data.rescale=\[1.5, 1.0\] must be \[low, high\]"),
        ({"val_fraction": 1.0}, r"data.val_fraction=1.0 must lie in \(0, 1\)"),
        ({"num_workers": "many"}, "num_workers must be an integer >= 0 or 'auto'"),
    ):
        with pytest.raises(ValueError, match=message):
            SegmentationDataModule(root, num_classes=2, **kwargs)
    with pytest.raises(ValueError, match="data.in_chans=2; use 3 .* or 1"):
        SegmentationDataModule(root, num_classes=2, mask_values={0: 0, 255: 1}, in_chans=2, num_workers=0).setup()


def test_a_folder_is_split_as_the_log_says_and_the_classes_are_named(tmp_path, caplog):
    """round(val_fraction * n) images held out: 30 images give 24 + 6, 24 images give 19 + 5."""
    for count, held_out in ((30, 6), (24, 5)):
        root = _binary_set(tmp_path / str(count), count=count, size=(8, 8))
        dm = SegmentationDataModule(
            root,
            num_classes=2,
            mask_values={0: 1, 255: 0},
            class_names=["interior", "membrane"],
            img_size=8,
            num_workers=0,
        )
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="vitzoo.segmentation"):
            dm.setup()
        assert (len(dm.train_dataset), len(dm.val_dataset)) == (count - held_out, held_out)
        assert (
            f"{count} images in {root}: {held_out} held out for validation (data.val_fraction=0.2, seed 0), "
            f"{count - held_out} training; training mask pixels: interior 50.0%, membrane 50.0%, ignored 0.0%"
            in caplog.text
        )

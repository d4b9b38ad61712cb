"""python -m vitzoo.segmentation.thin: thin cell walls, deterministic by seed, read by the segmentation data module."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from PIL import Image

from vitzoo.segmentation import SegmentationDataModule
from vitzoo.segmentation.thin import WALL, main, make_thin_dataset, thin_data_options


def _walls(root):
    return [np.asarray(Image.open(path)) == WALL for path in sorted((root / "label").iterdir())]


def test_generated_masks_are_thin_walls_under_dark_lines(tmp_path):
    root = main([str(tmp_path / "thin"), "--n", "3", "--size", "128", "--seed", "5"])
    for wall, path in zip(_walls(root), sorted((root / "image").iterdir())):
        image = np.asarray(Image.open(path)).astype(float)
        assert image.shape == wall.shape == (128, 128)  # grayscale, 8 bit
        assert 0.05 < wall.mean() < 0.35  # the object is a minority of the pixels
        pixels = wall.astype(np.uint8)
        assert cv2.erode(pixels, np.ones((3, 3), np.uint8)).mean() > 0.002  # walls >= 3 px wide in places...
        assert cv2.erode(pixels, np.ones((9, 9), np.uint8)).mean() < 0.002  # ...and almost none 9 px wide
        assert image[wall].mean() < image[~wall].mean() - 30  # walls are dark


def test_the_same_seed_writes_the_same_files(tmp_path):
    a, b, c = (
        make_thin_dataset(tmp_path / name, n=2, size=64, seed=seed) for name, seed in (("a", 0), ("b", 0), ("c", 1))
    )
    for folder in ("image", "label"):
        for name in ("0000.png", "0001.png"):
            assert (a / folder / name).read_bytes() == (b / folder / name).read_bytes()
    assert (a / "image" / "0000.png").read_bytes() != (c / "image" / "0000.png").read_bytes()
    with pytest.raises(ValueError, match="at least 1 image of at least 32 px"):
        make_thin_dataset(tmp_path / "d", n=0)


def test_the_folder_loads_through_the_segmentation_data_module(tmp_path):
    root = make_thin_dataset(tmp_path / "thin", n=5, size=96, seed=2)
    dm = SegmentationDataModule(str(root), img_size=64, batch_size=2, num_workers=0, **thin_data_options())
    dm.setup()
    interior, wall, ignored = dm.class_pixels["train"]
    expected = sum(w.sum() for w in _walls(root)) - dm.class_pixels["val"][1]
    assert wall == expected and ignored == 0 and interior > wall
    images, masks = next(iter(dm.train_dataloader()))
    assert images.shape == (2, 3, 64, 64) and set(masks.unique().tolist()) <= {0, 1, 255}


def _tiny_pyramid_export(path):
    """A PVTv2 of 8-64 channels and one block per stage with linear attention, exported without its head."""
    import vitzoo
    from vitzoo.export import export_model

    model = vitzoo.create_model(
        "pvt_v2_b0",
        attention="linear",
        num_classes=10,
        embed_dims=(8, 16, 32, 64),
        depths=(1, 1, 1, 1),
        num_heads=(1, 1, 2, 4),
    )
    return export_model(model, path, head=False)


def test_the_benchmark_trains_an_smp_decoder_over_a_pyramid_export(tmp_path):
    """benchmarks/segmentation_thin.py's ``smp-unet:<export>`` row: the export's weights reach smp's encoder, the
    row trains and fills its scores; a row with a neck or a path that is no export is one line naming the fix."""
    import argparse

    import segmentation_thin  # the benchmark script (tests/conftest.py puts benchmarks/ on the path)
    import torch
    from safetensors.torch import load_file

    export = _tiny_pyramid_export(tmp_path / "pvt")
    for part, n in (("train", 4), ("test", 1), ("big", 1)):
        make_thin_dataset(tmp_path / "thin" / part, n=n, size=64, seed=len(part))
    args = argparse.Namespace(data=tmp_path / "thin", steps=3, crop=32, batch=2, lr=1e-3, decoder_channels=8, seed=0)
    spec = f"pvt unet=smp-unet:{export},none,ce+dice,balanced"
    net = segmentation_thin.build(segmentation_thin.parse_row(spec)["model"], "none", 8)
    encoder, weights = net.net.encoder.model.state_dict(), load_file(export / "model.safetensors")
    assert torch.equal(
        encoder["stages_3.blocks.0.attn.in_proj.proj.weight"], weights["stages.3.blocks.0.attn.in_proj.proj.weight"]
    )
    row = segmentation_thin.run_row(args, spec)
    assert row["row"] == "pvt unet" and row["model"] == f"smp-unet:{export}"
    assert 0 <= row["iou_wall"] <= 1 and row["predict_1024_images_per_s"] > 0
    assert np.isfinite(row["first_loss"]) and np.isfinite(row["last_loss"])
    for bad, fix in (
        (f"x=smp-fpn:{export},simple_fpn,ce,none", "give neck none"),
        (f"x=smp-unit:{export},none,ce,none", "is none of: unet, an export directory"),
        (f"x={export},none,ce+dice,balance", "choose one of balanced|none"),
        ("x=unet,none,ce", "write name=model,neck,loss,weights"),
    ):
        with pytest.raises(ValueError, match=fix):
            segmentation_thin.parse_row(bad)
    with pytest.raises(ValueError, match="is no export directory"):
        segmentation_thin.build(f"smp-unet:{tmp_path / 'nowhere'}", "none", 8)


def test_the_benchmark_merges_seeds_into_means_beside_the_first_row(tmp_path):
    """``--merge``: runs of the same rows under two seeds become one table of means with each seed's value, the
    first row's IoU subtracted and its prediction rate divided; runs of other rows are one line naming both."""
    import json

    import segmentation_thin

    def run(seed, unet_iou, pvt_iou, unet_rate, pvt_rate):
        def row(name, iou, rate):
            return {
                "row": name, "loss": "dice", "weights": "balanced", "iou_wall": iou, "dice_wall": iou + 0.1,
                "train_images_per_s": 1.0, "predict_1024_images_per_s": rate, "peak_rss_mib": 1024.0 * (1 + seed),
                "parameters_m": 5.0, "majority_iou_wall": 0.0, "majority_dice_wall": 0.0,
            }  # fmt: skip

        path = tmp_path / f"seed{seed}.json"
        rows = [row("unet", unet_iou, unet_rate), row("pvt", pvt_iou, pvt_rate)]
        dark = {"threshold": 115.0, "iou_wall": 0.589, "dice_wall": 0.741}
        path.write_text(json.dumps({"setup": f"seed {seed}", "rows": rows, "darkest_pixels": dark}))
        return path

    paths = [run(0, 0.670, 0.690, 0.5, 0.6), run(1, 0.680, 0.700, 0.5, 0.4)]
    text = segmentation_thin.merge(paths, tmp_path / "merged")
    pvt = next(line for line in text.splitlines() if line.startswith("| pvt |")).split(" | ")
    assert pvt[2] == "0.695 (0.690 / 0.700)" and pvt[3] == "+0.020"  # mean IoU, then minus the U-Net's 0.675
    assert pvt[6] == "0.500 (0.600 / 0.400)" and pvt[7] == "1.00x"  # prediction rate over the U-Net's 0.5
    assert pvt[8] == "2.00"  # the highest peak of the seeds, GiB
    assert "| darkest pixels (blurred image < 115" in text and "seed 1" in text
    assert (tmp_path / "merged.md").read_text() == text
    other = tmp_path / "other.json"
    other.write_text(
        json.dumps({**json.loads(paths[1].read_text()), "rows": json.loads(paths[1].read_text())["rows"][:1]})
    )
    with pytest.raises(SystemExit, match="merge runs of the same rows"):
        segmentation_thin.merge([paths[0], other], None)
    for bad in (tmp_path / "missing.json", tmp_path / "merged.md"):
        with pytest.raises(SystemExit, match="not a run's --out .json file"):
            segmentation_thin.merge([paths[0], bad], None)

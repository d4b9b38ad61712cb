"""data.native_resolution: images keep their own sizes, a batch is a list the ViT runs as one padded batch."""

import math

import numpy as np
import pytest

import vitzoo
from conftest import QUIET, compose_config, write_image_folder
from vitzoo.data import ImageFolderDataModule
from vitzoo.data.native import fit_to_multiple
from vitzoo.training.run import train

SIZES = [(20, 12), (9, 30), (16, 16)]


def mixed_folder(root):
    for i, size in enumerate(SIZES):
        write_image_folder(root / f"part{i}", per_class=3, size=size, seed=i)
        for cls in ("a", "b"):
            target = root / "train" / cls
            target.mkdir(parents=True, exist_ok=True)
            for f in (root / f"part{i}" / "train" / cls).iterdir():
                f.rename(target / f"{i}-{f.name}")
    return root


@pytest.mark.parametrize("h,w", [(37, 50), (8, 3), (64, 16), (30, 30)])
def test_fit_to_multiple_scales_down_and_cuts_sides_to_multiples(h, w):
    out = fit_to_multiple(np.zeros((h, w, 3), np.uint8), max_side=32, multiple=4)
    assert out.shape[0] % 4 == 0 and out.shape[1] % 4 == 0 and max(out.shape[:2]) <= 32 and min(out.shape[:2]) >= 4
    if min(h, w) >= 8 and max(h, w) > 32:
        scaled = [s * 32 / max(h, w) for s in (h, w)]  # the aspect survives up to the crop to multiples
        assert all(-1 < s - o < 4 + 1 for s, o in zip(scaled, out.shape[:2]))


def native_batch(dm, size, multiple, max_side):
    """The first training batch of a native-resolution data module: a list of ``size`` images of more than one
    shape, each side a multiple of ``multiple`` and at most ``max_side``."""
    dm.setup("fit")
    images, labels = next(iter(dm.train_dataloader()))
    assert isinstance(images, list) and len(images) == len(labels) == size
    assert len({tuple(img.shape) for img in images}) > 1
    assert all(s % multiple == 0 and s <= max_side for img in images for s in img.shape[1:])
    return images


def test_native_batches_are_lists_of_own_sizes_the_vit_runs(tmp_path):
    dm = ImageFolderDataModule(
        mixed_folder(tmp_path),
        img_size=32,
        batch_size=6,
        num_workers=0,
        val_fraction=0.34,
        native_resolution=True,
        native_multiple=4,
    )
    images = native_batch(dm, size=6, multiple=4, max_side=32)
    model = vitzoo.create_model(
        "vit_cifar", attention="linear", img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=2
    )
    assert model(images).shape == (6, 2)


def test_native_resolution_refuses_what_it_cannot_serve(tmp_path):
    with pytest.raises(ValueError, match="data.recipe=cifar and data.device_cache=false"):
        ImageFolderDataModule(mixed_folder(tmp_path), native_resolution=True, recipe="deit")


def test_a_linear_vit_trains_one_epoch_at_native_resolution(tmp_path):
    root = mixed_folder(tmp_path / "data")
    cfg = compose_config(
        tmp_path / "run",
        [
            "model=vit_linear",
            "data=imagefolder",
            f"data.root={root}",
            "data.img_size=32",
            "data.native_resolution=true",
            "data.native_multiple=4",
            "data.batch_size=4",
            "data.num_workers=0",
            "data.val_fraction=0.34",
            "module.mixup.mixup_alpha=0",
            "module.mixup.cutmix_alpha=0",
            "+model.kwargs.depth=1",  # vit_cifar: patch 4
            "+model.kwargs.embed_dim=32",
            "+model.kwargs.num_heads=2",
            "trainer.max_epochs=1",
            *QUIET,
        ],
    )
    metrics = train(cfg)
    assert metrics["global_step"] >= 2 and math.isfinite(metrics["train/loss_epoch"])
    assert 0.0 <= metrics["val/acc1"] <= 1.0


def test_shards_serve_native_batches_too(tmp_path):
    from vitzoo.data.pack import pack
    from vitzoo.data.shards import ShardsDataModule

    pack(mixed_folder(tmp_path / "src"), tmp_path / "shards", val_fraction=0.34)
    dm = ShardsDataModule(
        str(tmp_path / "shards"),
        img_size=32,
        batch_size=6,
        num_workers=0,
        recipe="cifar",
        native_resolution=True,
        native_multiple=4,
    )
    native_batch(dm, size=6, multiple=4, max_side=32)

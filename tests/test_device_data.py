"""The device-resident data path (data.device_cache) on CPU tensors: the same images and augmentation
statistics as the albumentations path, determinism for a seed, the cache file, and a run that learns."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from conftest import SyncOps, compose_config, write_image_folder
from vitzoo.data import (
    DigitsDataModule,
    ImageFolderDataModule,
    SyntheticDataModule,
    build_eval_transform,
    build_train_transform,
)
from vitzoo.data.device_data import DeviceBatches, decode_split
from vitzoo.training import train

MEAN, STD = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)


def _albumentations(transform, image, draws):
    return torch.stack([transform(image=image)["image"] for _ in range(draws)])


def _device(image, draws, **kwargs):
    images = decode_split([image] * draws, image.shape[0])
    batches = DeviceBatches(images, [0] * draws, draws, MEAN, STD, train=True, seed=0, **kwargs)
    return next(iter(batches))[0]


def test_eval_batches_equal_the_albumentations_eval_transform():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (7, 8, 8, 3), dtype=np.uint8)  # resized to 16 as the digits are
    batches = DeviceBatches(decode_split(images, 16), list(range(7)), 3, MEAN, STD, train=False)
    got = torch.cat([x for x, _ in batches])
    assert [len(y) for _, y in batches] == [3, 3, 1]  # eval keeps the last partial batch
    reference = torch.stack([build_eval_transform(16, MEAN, STD)(image=im)["image"] for im in images])
    torch.testing.assert_close(got, reference, rtol=0, atol=1e-6)


def test_crop_statistics_match_the_albumentations_path():
    """A white image: the mean of each pixel over many crops is P(not padding); an off-by-one in the offsets
    moves the border pixels by ~0.3 normalised units."""
    white, draws = np.full((12, 12, 3), 255, np.uint8), 6000
    album = _albumentations(build_train_transform(12, MEAN, STD, crop_padding=2, hflip=False, seed=0), white, draws)
    device = _device(white, draws, crop_padding=2)
    torch.testing.assert_close(device.mean(0), album.mean(0), rtol=0, atol=0.12)
    torch.testing.assert_close(device.std(0), album.std(0), rtol=0, atol=0.12)
    assert (device.amax(0) == album.amax(0)).all() and (device.amin(0) == album.amin(0)).all()


def test_flip_statistics_match_the_albumentations_path():
    half, draws = np.zeros((8, 8, 3), np.uint8), 6000
    half[:, :4] = 255  # left half white: each column's mean is the flip rate
    album = _albumentations(build_train_transform(8, MEAN, STD, crop_padding=0, hflip=True, seed=0), half, draws)
    device = _device(half, draws, hflip=True)
    torch.testing.assert_close(device.mean(0), album.mean(0), rtol=0, atol=0.1)
    flipped = (device[:, 0, 0, 0] < 0).float().mean()  # the top-left pixel went black
    assert abs(flipped - 0.5) < 0.03


def test_a_seed_fixes_every_epoch_and_epochs_differ():
    images = decode_split(np.random.default_rng(0).integers(0, 256, (40, 8, 8, 3), dtype=np.uint8), 8)

    def epochs(seed):
        b = DeviceBatches(images, list(range(40)), 8, MEAN, STD, train=True, seed=seed, crop_padding=2, hflip=True)
        return [[(x.clone(), y.clone()) for x, y in b] for _ in range(2)]

    a, again, other = epochs(3), epochs(3), epochs(4)
    for (xa, ya), (xb, yb) in zip(a[0] + a[1], again[0] + again[1]):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not torch.equal(a[0][0][1], other[0][0][1])  # another seed, another order
    assert not torch.equal(torch.cat([y for _, y in a[0]]), torch.cat([y for _, y in a[1]]))  # a new epoch reshuffles
    assert sorted(torch.cat([y for _, y in a[0]]).tolist()) == list(range(40))  # every image once per epoch


def test_ddp_ranks_get_equal_disjoint_shares():
    images = decode_split(np.zeros((10, 4, 4, 3), np.uint8), 4)
    shares = [
        DeviceBatches(images, list(range(10)), 2, MEAN, STD, train=True, seed=1, rank=r, world_size=3) for r in range(3)
    ]
    labels = [torch.cat([y for _, y in s]).tolist() for s in shares]
    assert [len(s) for s in shares] == [1, 1, 1] and all(len(lab) == 2 for lab in labels)
    assert len(set(sum(labels, []))) == 6
    evals = [DeviceBatches(images, list(range(10)), 4, MEAN, STD, train=False, rank=r, world_size=3) for r in range(3)]
    seen = [torch.cat([y for _, y in e]).tolist() for e in evals]
    assert [len(s) for s in seen] == [4, 4, 4] and set(sum(seen, [])) == set(range(10))  # padded like DDP's sampler


def _module(root, **kwargs):
    return ImageFolderDataModule(
        str(root), img_size=16, val_fraction=0.25, batch_size=2, num_workers=0, device_cache=True, **kwargs
    )


def test_the_cache_is_built_once_then_reused_and_a_stale_or_broken_one_is_an_error(tmp_path):
    write_image_folder(tmp_path)
    dm = _module(tmp_path)
    dm.setup("fit")
    cache = tmp_path / ".vitzoo-cache" / "train-16px-val0.25-seed0.pt"
    assert cache.is_file()
    built = cache.stat().st_mtime_ns
    again = _module(tmp_path)
    again.setup("fit")
    assert cache.stat().st_mtime_ns == built  # read, not rebuilt
    assert torch.equal(again.device_splits["train"][0], dm.device_splits["train"][0])
    # The cached images are the albumentations path's eval images.
    plain = ImageFolderDataModule(
        str(tmp_path), img_size=16, val_fraction=0.25, batch_size=2, num_workers=0, mean=MEAN, std=STD
    )
    plain.setup("fit")
    cached = _module(tmp_path, mean=MEAN, std=STD)
    cached.setup("fit")
    assert cached.device_splits is not None
    torch.testing.assert_close(
        torch.cat([b for b, _ in cached.val_dataloader()]),
        torch.cat([b for b, _ in plain.val_dataloader()]),
        rtol=0,
        atol=1e-6,
    )

    cv2.imwrite(str(tmp_path / "train" / "a" / "0.png"), np.zeros((20, 20, 3), np.uint8))  # an image changes
    with pytest.raises(ValueError, match=r"built from other images.*delete it"):
        _module(tmp_path).setup("fit")
    cache.write_bytes(b"not a cache")
    with pytest.raises(ValueError, match=r"cannot read the decoded-image cache .*delete it"):
        _module(tmp_path).setup("fit")


@pytest.mark.parametrize(
    "aug, fix", [({"policy": "strong"}, "data.aug.policy=basic"), ({"gauss_noise": 0.1}, "data.aug.gauss_noise=0")]
)
def test_augmentations_only_albumentations_has_are_an_error(aug, fix):
    with pytest.raises(ValueError, match=fix):
        DigitsDataModule(device_cache=True, aug=aug)


def test_a_device_cache_that_is_not_a_bool_is_an_error():
    with pytest.raises(ValueError, match="set it to true, false or null"):
        DigitsDataModule(device_cache="maybe")


def test_workers_the_device_path_does_not_use_are_a_warning(caplog):
    DigitsDataModule(device_cache=True, num_workers=3)
    assert "data.num_workers=3 is not used" in caplog.text


def test_automatic_choice_is_off_without_cuda():
    dm = DigitsDataModule()
    assert dm.uses_device_cache() is False
    dm.setup("fit")
    assert isinstance(dm.train_dataloader(), torch.utils.data.DataLoader)


@pytest.mark.slow
def test_digits_train_on_the_device_path_and_learn(tmp_path):
    cfg = compose_config(tmp_path, ["model=vit_softmax", "debug=digits", "data.device_cache=true"])
    metrics = train(cfg)
    assert metrics["val/acc1"] > 0.6, metrics  # 10 classes: chance is 0.1
    assert metrics["global_step"] == 10 * (1437 // 32)  # 1,437 training digits, last partial batch dropped


def test_the_gpu_zoo_recipe_takes_the_device_path(tmp_path):
    """zoo_gpu asks for data.device_cache=true, so its augmentation must be one the device path has."""
    from hydra.utils import instantiate

    write_image_folder(tmp_path / "data", per_class=12)
    cfg = compose_config(
        tmp_path, ["experiment=zoo_gpu", "model=vit_softmax", f"data.root={tmp_path / 'data'}", "data.batch_size=4"]
    )
    dm = instantiate(cfg.data)
    assert dm.uses_device_cache() and cfg.module.mixup.mixup_alpha > 0
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 32, 32) and y.shape == (4,)


def test_a_validate_only_setup_decodes_nothing(tmp_path):
    write_image_folder(tmp_path)
    dm = _module(tmp_path)
    dm.setup("validate")
    assert dm.device_splits is None and not (tmp_path / ".vitzoo-cache").exists()
    assert len(torch.cat([y for _, y in dm.val_dataloader()])) == 2


def test_device_batches_ask_the_device_for_no_number():
    """Crop offsets, flips and the shuffle stay tensors: no op a GPU would make the host wait on, per batch."""
    dm = SyntheticDataModule(img_size=16, num_train=256, num_val=64, batch_size=32, device_cache=True)
    dm.setup("fit")
    loader, ops = dm.train_dataloader(), SyncOps()  # built once per fit
    with ops:
        for _epoch in range(2):
            batches = [y for _, y in loader]
    assert len(batches) == 8 and ops.seen == []

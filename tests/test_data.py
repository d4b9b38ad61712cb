"""Data modules and albumentations pipelines: splits, normalisation, augmentation seeding, clear errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import write_image_folder
from vitzoo.data import (
    CIFAR10DataModule,
    DigitsDataModule,
    ImageFolderDataModule,
    SyntheticDataModule,
    build_eval_transform,
    build_train_transform,
    digits_arrays,
)


def test_digits_split_is_stratified_disjoint_and_fixed():
    images, labels = digits_arrays()
    assert images.shape == (1797, 8, 8, 3) and images.dtype == np.uint8 and images.max() == 255
    dm = DigitsDataModule(batch_size=64)
    dm.setup("fit")
    train, val = dm.train_dataset, dm.val_dataset
    assert (len(train), len(val)) == (1437, 360)
    # Stratified: every class is ~20% of its digits in val.
    val_counts = np.bincount(val.labels, minlength=10)
    all_counts = np.bincount(labels, minlength=10)
    assert np.all(np.abs(val_counts / all_counts - 0.2) < 0.02)
    # The split partitions the set and is the same every time.
    assert len(train) + len(val) == len(labels)
    assert np.array_equal(np.bincount(train.labels) + val_counts, all_counts)
    again = DigitsDataModule()
    again.setup("fit")
    assert np.array_equal(again.val_dataset.images, val.images)


def test_digits_eval_images_are_normalised():
    dm = DigitsDataModule(img_size=16)
    dm.setup("validate")
    x = torch.stack([dm.val_dataset[i][0] for i in range(len(dm.val_dataset))])
    assert x.shape == (360, 3, 16, 16) and x.dtype == torch.float32
    assert abs(float(x.mean())) < 0.05 and abs(float(x.std()) - 1) < 0.05


def test_normalize_runs_before_to_tensor():
    mean, std = (0.1, 0.2, 0.3), (0.5, 0.25, 0.125)
    image = np.full((8, 8, 3), 200, np.uint8)
    out = build_eval_transform(8, mean, std)(image=image)["image"]
    expected = (200 / 255 - torch.tensor(mean)) / torch.tensor(std)
    assert out.shape == (3, 8, 8)
    torch.testing.assert_close(out[:, 0, 0], expected.float())


@pytest.mark.parametrize("policy", ["none", "basic", "strong"])
def test_train_policies_keep_shape(policy):
    tf = build_train_transform(16, (0.5,) * 3, (0.5,) * 3, policy=policy, gauss_noise=0.1, seed=0)
    assert tf(image=np.zeros((8, 8, 3), np.uint8))["image"].shape == (3, 16, 16)


def test_bad_augmentation_options_name_the_fix():
    with pytest.raises(ValueError, match="data.aug.policy"):
        build_train_transform(16, (0.5,) * 3, (0.5,) * 3, policy="fancy")
    with pytest.raises(ValueError, match="data.aug.gauss_noise"):
        build_train_transform(16, (0.5,) * 3, (0.5,) * 3, gauss_noise=2.0)


def test_gauss_noise_std_is_within_the_configured_range():
    image = np.full((64, 64, 3), 128, np.uint8)
    clean = build_train_transform(64, (0.0,) * 3, (1.0,) * 3, policy="none")(image=image)["image"]
    noisy_tf = build_train_transform(
        64, (0.0,) * 3, (1.0,) * 3, policy="none", gauss_noise=0.2, gauss_noise_p=1.0, seed=0
    )
    stds = [float((noisy_tf(image=image)["image"] - clean).std()) for _ in range(20)]
    assert max(stds) <= 0.2 * 1.1 and max(stds) > 0.05  # drawn in [0, 0.2], pixel units of [0, 1]


def _worker_batches(dm, epochs=1):
    dm.setup("fit")
    return [torch.cat([x for x, _ in dm.train_dataloader()]) for _ in range(epochs)]


def test_workers_augment_differently_and_reproducibly():
    # 8 copies of one image, batch 1, 2 workers: worker 0 makes items 0,2,4,6 and worker 1 items
    # 1,3,5,7. Without re-seeding both workers copy one albumentations RNG and augment alike.
    class Same(SyntheticDataModule):
        def load_split(self, split):
            images, labels = super().load_split(split)
            return np.repeat(images[:1], len(images), axis=0), labels

    def batches():
        torch.manual_seed(0)
        return _worker_batches(
            Same(
                img_size=16,
                num_train=8,
                num_val=2,
                batch_size=1,
                num_workers=2,
                aug=dict(policy="basic", crop_padding=4, hflip=True),
            )
        )[0]

    x = batches()
    assert not torch.equal(x[0::2], x[1::2]), "both workers produced the same augmentations"
    assert torch.equal(x, batches()), "augmentations are not reproducible under a fixed torch seed"


def test_synthetic_is_seeded():
    a, b = SyntheticDataModule(img_size=8, seed=3), SyntheticDataModule(img_size=8, seed=3)
    assert np.array_equal(a.load_split("train")[0], b.load_split("train")[0])
    assert not np.array_equal(a.load_split("train")[0], a.load_split("val")[0][:1])


def test_cifar_missing_offline_says_how_to_get_it(tmp_path):
    dm = CIFAR10DataModule(root=str(tmp_path), download=False)
    dm.prepare_data()
    with pytest.raises(FileNotFoundError, match="data.download=true.*data=imagefolder"):
        dm.setup("fit")


def test_imagefolder_val_fraction_split(tmp_path):
    write_image_folder(tmp_path, ["cat", "dog", "eel"], 10, size=(12, 10))
    dm = ImageFolderDataModule(root=str(tmp_path), img_size=16, val_fraction=0.2, batch_size=4)
    assert dm.num_classes == 3 and dm.classes == ["cat", "dog", "eel"]
    dm.setup("fit")
    train, val = dm.train_dataset, dm.val_dataset
    assert (len(train), len(val)) == (24, 6)
    assert set(train.images).isdisjoint(val.images)
    assert sorted(np.bincount(val.labels)) == [2, 2, 2]
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 16, 16)
    again = ImageFolderDataModule(root=str(tmp_path), val_fraction=0.2, batch_size=4)
    again.setup("fit")
    assert again.val_dataset.images == val.images


def test_imagefolder_uses_val_tree_when_present(tmp_path):
    write_image_folder(tmp_path, ["a", "b"], 4, size=(12, 10))
    write_image_folder(tmp_path, ["a", "b"], 2, size=(12, 10), split="val")
    dm = ImageFolderDataModule(root=str(tmp_path), batch_size=2)
    dm.setup("fit")
    assert (len(dm.train_dataset), len(dm.val_dataset)) == (8, 4)
    assert all("/val/" in p for p in dm.val_dataset.images)


def test_imagefolder_errors_name_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.root=.*train/<class>"):
        ImageFolderDataModule(root=str(tmp_path / "nowhere"))
    write_image_folder(tmp_path, ["a", "b"], 2, size=(12, 10))
    write_image_folder(tmp_path, ["a", "zebra"], 1, size=(12, 10), split="val")
    with pytest.raises(ValueError, match="zebra"):
        ImageFolderDataModule(root=str(tmp_path), batch_size=2).setup("fit")
    few = tmp_path / "few"
    write_image_folder(few, ["a", "b", "c"], 3, size=(12, 10))
    with pytest.raises(ValueError, match=r"leaves 1 for val .* change data.val_fraction"):
        ImageFolderDataModule(root=str(few), val_fraction=0.1, batch_size=2).setup("fit")
    ImageFolderDataModule(root=str(few), val_fraction=0.34, batch_size=2).setup("fit")  # 4 val, 5 train: fine


def test_batch_larger_than_train_set_is_a_clear_error():
    with pytest.raises(ValueError, match="lower data.batch_size"):
        SyntheticDataModule(img_size=8, num_train=4, batch_size=8).setup("fit")


@pytest.mark.parametrize("device_cache", [False, True])
def test_labels_outside_the_classes_are_one_error_at_setup(device_cache):
    """Checked once per split, so no per-batch check (a host sync on a GPU) is needed later."""

    class Mislabelled(SyntheticDataModule):
        def load_split(self, split):
            images, labels = super().load_split(split)
            labels[3] = 12
            return images, labels

    dm = Mislabelled(img_size=8, num_train=16, num_val=8, batch_size=4, device_cache=device_cache)
    with pytest.raises(ValueError, match=r"the train split has labels \[12\] outside 0..9 .*num_classes=10"):
        dm.setup("fit")
    SyntheticDataModule(img_size=8, num_train=16, num_val=8, batch_size=4, device_cache=device_cache).setup("fit")


def test_pin_memory_only_for_a_gpu_and_the_training_loader_resumes(monkeypatch):
    """pin_memory=true (the CIFAR and image-folder presets) pins nothing on a CPU run (torch would warn); the
    training loader's position comes back through its state_dict, batch for batch."""
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    dm = DigitsDataModule(img_size=16, batch_size=64, pin_memory=True)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert not loader.pin_memory and not dm.val_dataloader().pin_memory
    loader.sampler.set_epoch(3)
    epoch = list(loader)
    assert loader.state_dict() == {"epoch": 3, "batches_taken": len(epoch)} and not loader.mid_epoch()
    again = dm.train_dataloader()
    again.load_state_dict({"epoch": 3, "batches_taken": 5})
    rest = list(again)
    assert len(rest) == len(epoch) - 5 and again.state_dict()["batches_taken"] == len(epoch)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(rest, epoch[5:]))
    again.load_state_dict({"epoch": 3, "batches_taken": len(epoch)})  # a finished epoch: the next one, whole
    assert again.sampler.epoch == 4 and len(list(again)) == len(epoch)

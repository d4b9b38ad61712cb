"""vitzoo.robustness.released: CIFAR-10-C / CIFAR-100-C .npy files and ImageNet-C folders, read as released,
on tiny files in those layouts written here."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader

from vitzoo.robustness.released import CifarC, ImageNetC, released_corruptions, released_dataset

PER_SEVERITY = 4


def write_cifar_c(root, names=("fog", "gaussian_noise"), images=None, labels=None):
    """<name>.npy (5 x 4 images of 8 x 6 px): every pixel of image k of severity s is 10 s + k (+ 100 for the
    second corruption); labels.npy: 7 - k, repeated per severity. Given ``images`` (uint8 (5 x N, H, W, 3),
    severities one after the other) and their ``labels``, every corruption holds those instead."""
    root.mkdir(parents=True, exist_ok=True)
    for j, name in enumerate(names):
        if images is None:
            values = np.array([100 * j + 10 * s + k for s in range(1, 6) for k in range(PER_SEVERITY)], dtype=np.uint8)
            np.save(root / f"{name}.npy", np.broadcast_to(values[:, None, None, None], (len(values), 8, 6, 3)).copy())
        else:
            np.save(root / f"{name}.npy", images)
    np.save(
        root / "labels.npy",
        np.tile(np.arange(7, 7 - PER_SEVERITY, -1, dtype=np.uint8), 5) if labels is None else labels,
    )
    return root


def write_imagenet_c(
    root, classes=("n01440764", "n01443537", "n02102040"), names=("snow", "zoom_blur"), images=None, labels=None
):
    """<corruption>/<severity>/<class>/*.JPEG: two flat images per class, gray level 40 c + 10 s. Given ``images``
    (uint8 (5 x N, H, W, 3), severities one after the other) and their ``labels`` (indices into ``classes``),
    those instead, as lossless PNG files."""
    for name in names:
        for s in range(1, 6):
            for c, wnid in enumerate(classes):
                folder = root / name / str(s) / wnid
                folder.mkdir(parents=True)
                if images is None:
                    for k in range(2):
                        Image.new("RGB", (12, 10), (40 * c + 10 * s,) * 3).save(folder / f"ILSVRC_{k}.JPEG", quality=95)
            if images is not None:
                per = len(images) // 5
                for k in range(per):
                    i = (s - 1) * per + k
                    Image.fromarray(images[i]).save(root / name / str(s) / classes[labels[i]] / f"ILSVRC_{k:05d}.png")
    return root


@pytest.mark.parametrize("severity", [1, 3, 5])
def test_cifar_c_reads_one_severity_block_with_its_labels(tmp_path, severity):
    root = write_cifar_c(tmp_path / "CIFAR-10-C")
    data = released_dataset(root, "gaussian_noise", severity)
    assert isinstance(data, CifarC) and len(data) == PER_SEVERITY
    for k in range(PER_SEVERITY):
        image, label = data[k]
        assert image.shape == (3, 8, 6) and image.dtype == torch.float32
        assert torch.equal(image, torch.full((3, 8, 6), (100 + 10 * severity + k) / 255))
        assert label == 7 - k
    images, labels = next(iter(DataLoader(data, batch_size=PER_SEVERITY)))
    assert images.shape == (PER_SEVERITY, 3, 8, 6) and labels.tolist() == [7, 6, 5, 4]
    assert released_corruptions(root) == ["fog", "gaussian_noise"]


def test_imagenet_c_numbers_classes_in_sorted_order(tmp_path):
    root = write_imagenet_c(tmp_path / "ImageNet-C")
    data = released_dataset(root, "snow", 4)
    assert isinstance(data, ImageNetC) and len(data) == 6
    assert data.classes == ["n01440764", "n01443537", "n02102040"]
    for i in range(len(data)):
        image, label = data[i]
        assert image.shape == (3, 10, 12)
        assert (image * 255 - (40 * label + 40)).abs().max() <= 2  # JPEG of a flat image: within 2 levels
    assert [data[i][1] for i in range(6)] == [0, 0, 1, 1, 2, 2]
    assert released_corruptions(root) == ["snow", "zoom_blur"]


def test_imagenet_c_follows_a_given_class_order(tmp_path):
    root = write_imagenet_c(tmp_path / "ImageNet-C", classes=("n01443537", "n02102040"))
    order = ["n00000001", "n01443537", "n02102040"]  # the model's 3 classes; the files hold 2 of them
    data = ImageNetC(root, "zoom_blur", 2, classes=order)
    assert sorted({label for _, label in data.samples}) == [1, 2]
    with pytest.raises(ValueError, match=r"class folders not in the given classes: \['n02102040'\]"):
        ImageNetC(root, "zoom_blur", 2, classes=order[:2])


def test_released_files_bad_input_names_the_fix(tmp_path):
    cifar = write_cifar_c(tmp_path / "c")
    with pytest.raises(FileNotFoundError, match=r"snow.npy not found; .* holds \['fog', 'gaussian_noise'\]"):
        released_dataset(cifar, "snow", 1)
    with pytest.raises(ValueError, match=r"severity must be one of \[1, 2, 3, 4, 5\]"):
        released_dataset(cifar, "fog", 0)
    with pytest.raises(ValueError, match="unknown corruption 'rain'"):
        released_dataset(cifar, "rain", 1)
    with pytest.raises(ValueError, match="classes applies to ImageNet-C"):
        released_dataset(cifar, "fog", 1, classes=["a"])
    np.save(cifar / "labels.npy", np.zeros(7, dtype=np.uint8))
    with pytest.raises(ValueError, match="has 7 labels for the 20 images"):
        released_dataset(cifar, "fog", 1)
    np.save(cifar / "fog.npy", np.zeros((21, 8, 6, 3), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"uint8 \(5 x N, H, W, 3\)"):
        released_dataset(cifar, "fog", 1)
    with pytest.raises(FileNotFoundError, match="neither labels.npy"):
        released_dataset(tmp_path / "c" / "..", "fog", 1)
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        released_dataset(tmp_path / "missing", "fog", 1)
    imagenet = write_imagenet_c(tmp_path / "i")
    with pytest.raises(FileNotFoundError, match=r"fog/1 not found"):
        released_dataset(imagenet, "fog", 1)

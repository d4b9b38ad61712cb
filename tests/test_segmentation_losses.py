"""module.loss / module.class_weights: each loss trains, weights come from the masks' histogram, bad names fail."""

from __future__ import annotations

import logging

import lightning as L
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from conftest import QUIET_TRAINER
from test_segmentation import export_dir  # noqa: F401  (the tiny linear-attention ViT export)
from vitzoo.segmentation import SegmentationDataModule, SegmentationModule, make_shapes_dataset
from vitzoo.segmentation.losses import LOSSES, SegmentationLoss, balanced_class_weights


def _thin_lines(n: int = 4, size: int = 32, seed: int = 0):
    """(images (n, 1, size, size), masks (n, size, size)): 2 px dark lines (class 1, ~20%) on noise."""
    g = torch.Generator().manual_seed(seed)
    masks = torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for at in torch.randint(0, size - 2, (2,), generator=g).tolist():
            masks[i, at : at + 2] = 1
            masks[i, :, (at * 7) % (size - 2) : (at * 7) % (size - 2) + 2] = 1
    images = 0.7 - 0.4 * masks[:, None].float() + 0.1 * torch.randn(n, 1, size, size, generator=g)
    masks[0, :3, :3] = 255  # ignored pixels
    return images, masks


@pytest.mark.parametrize(
    "name,weights", [*((n, None) for n in LOSSES), ("ce", [1.0, 3.0]), ("ce+dice", [0.6, 2.5]), ("focal", [1.0, 3.0])]
)
def test_each_loss_decreases_on_a_tiny_set(name, weights):
    torch.manual_seed(0)
    images, masks = _thin_lines()
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 2, 3, padding=1))
    criterion = SegmentationLoss(name, 2, 255, weights)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        loss = criterion(net(images), masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-5:]) < 0.6 * np.mean(losses[:3]), losses
    assert (net(images).argmax(1) == masks)[masks != 255].float().mean() > 0.9  # and it segments


def test_weights_scale_the_terms_and_ignore_index_drops_pixels():
    logits, masks = torch.randn(2, 3, 6, 6, dtype=torch.float64), torch.randint(0, 3, (2, 6, 6))
    masks[0, 0] = 255
    weights = [0.5, 1.0, 4.0]
    valid = masks != 255
    nll = -logits.log_softmax(1).gather(1, masks.clamp_max(2)[:, None])[:, 0]
    w = torch.tensor(weights, dtype=torch.float64)[masks.clamp_max(2)]
    expected = (w * nll)[valid].sum() / w[valid].sum()  # torch's weighted mean, from the formula
    assert torch.allclose(SegmentationLoss("ce", 3, 255, weights)(logits, masks), expected.float(), atol=1e-6)
    probs = logits.softmax(1)
    one_hot = F.one_hot(masks.clamp_max(2), 3).permute(0, 3, 1, 2) * valid[:, None]
    p = probs * valid[:, None]
    dice = 2 * (p * one_hot).sum((0, 2, 3)) / (p + one_hot).sum((0, 2, 3))
    w = torch.tensor(weights, dtype=torch.float64)
    expected_dice = ((1 - dice) * w).sum() / w.sum()  # smp: the weighted mean over classes
    assert torch.allclose(SegmentationLoss("dice", 3, 255, weights)(logits, masks), expected_dice.float(), atol=1e-5)
    both = SegmentationLoss("ce+dice", 3, 255, weights)(logits, masks)
    assert torch.allclose(both, (expected + expected_dice).float(), atol=1e-5)


def test_balanced_weights_are_inverse_pixel_frequency():
    # 75% class 0, 25% class 1, none of class 2; the trailing entry (ignored pixels) does not count
    assert balanced_class_weights(np.array([300, 100, 0, 50]), 3) == pytest.approx([400 / 900, 400 / 300, 0.0])
    weights = balanced_class_weights(np.array([10, 10]), 2)
    assert weights == [1.0, 1.0]  # equally frequent classes: no reweighting


def test_bad_loss_options_name_the_choices():
    with pytest.raises(ValueError, match=r"module.loss='bce'; choose one of ce\|dice\|focal\|lovasz\|ce\+dice"):
        SegmentationLoss("bce")
    with pytest.raises(ValueError, match="module.class_weights='inverse'; use balanced"):
        SegmentationLoss("ce", 2, 255, "inverse")
    with pytest.raises(ValueError, match=r"needs 2 non-negative weights, one per class"):
        SegmentationLoss("dice", 2, 255, [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="module.loss=lovasz takes no class weights"):
        SegmentationLoss("lovasz", 2, 255, [1.0, 2.0])


def test_balanced_weights_come_from_the_training_masks_and_start_up_says_so(export_dir, tmp_path, caplog):  # noqa: F811
    root = make_shapes_dataset(tmp_path / "shapes", num_images=8, size=(32, 40), seed=3)
    dm = SegmentationDataModule(
        str(root), num_classes=4, img_size=32, batch_size=4, num_workers=0, class_names=["bg", "rect", "oval", "wedge"]
    )
    module = SegmentationModule(
        str(export_dir),
        4,
        class_names=["bg", "rect", "oval", "wedge"],
        loss="ce+dice",
        class_weights="balanced",
        decoder_channels=16,
    )
    with caplog.at_level(logging.INFO, logger="vitzoo"):
        L.Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=0, **QUIET_TRAINER).fit(module, datamodule=dm)
    counts = dm.class_pixels["train"]
    expected = counts[:4].sum() / (4 * counts[:4])
    assert module.criterion.weight.tolist() == pytest.approx(expected.tolist())
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("loss: "))
    assert line.startswith("loss: ce+dice, class weights balanced (inverse pixel frequency of the training masks): ")
    assert f"bg {expected[0]:.3g}, rect {expected[1]:.3g}" in line
    with pytest.raises(ValueError, match="class_weights=balanced reads the training masks' histogram"):
        L.Trainer(max_epochs=1, limit_train_batches=1, **QUIET_TRAINER).fit(
            SegmentationModule(str(export_dir), 4, class_weights="balanced", decoder_channels=16),
            train_dataloaders=dm.train_dataloader(),
        )

"""vitzoo's PGD and FGSM against torchattacks' (the reference) and against their definitions."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from vitzoo.robustness.adversarial import adversarial_accuracy, fgsm, pgd

EPS = 8 / 255


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 5)
    ).eval()


@pytest.fixture(scope="module")
def batch():
    g = torch.Generator().manual_seed(1)
    return torch.rand(6, 3, 12, 12, generator=g), torch.randint(0, 5, (6,), generator=g)


def test_pgd_stays_in_the_ball_and_the_image_range_and_raises_the_loss(model, batch):
    images, labels = batch
    adv = pgd(model, images, labels, EPS, 2.5 * EPS / 10, 10, torch.Generator().manual_seed(0))
    assert (adv - images).abs().max() <= EPS + 1e-7 and adv.min() >= 0 and adv.max() <= 1
    with torch.no_grad():
        clean, attacked = (F.cross_entropy(model(x), labels) for x in (images, adv))
    assert attacked > clean
    again = pgd(model, images, labels, EPS, 2.5 * EPS / 10, 10, torch.Generator().manual_seed(0))
    assert torch.equal(adv, again)  # the generator alone draws the start


def test_fgsm_is_one_signed_gradient_step(model, batch):
    images, labels = batch
    x = images.clone().requires_grad_(True)
    F.cross_entropy(model(x), labels).backward()
    torch.testing.assert_close(fgsm(model, images, labels, EPS), (images + EPS * x.grad.sign()).clamp(0, 1))


def test_pgd_and_fgsm_equal_torchattacks(model, batch):
    torchattacks = pytest.importorskip(
        "torchattacks", reason="the reference: pip install --no-deps torchattacks==3.5.1 (bash .ci/run installs it)"
    )
    images, labels = batch
    torch.manual_seed(3)  # torchattacks draws the random start from the global generator
    theirs = torchattacks.PGD(model, eps=EPS, alpha=EPS / 4, steps=10, random_start=True)(images, labels)
    ours = pgd(model, images, labels, EPS, EPS / 4, 10, torch.Generator().manual_seed(3))
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        fgsm(model, images, labels, EPS), torchattacks.FGSM(model, eps=EPS)(images, labels), rtol=0, atol=1e-6
    )


def test_adversarial_accuracy_counts_and_refuses_bad_options(model, batch):
    result = adversarial_accuracy(model, [batch, batch], [0.5] * 3, [0.5] * 3, EPS, torch.device("cpu"))
    assert result["num_images"] == 12 and 0 <= result["acc1"] <= result["fgsm_acc1"] + 1 / 12
    with pytest.raises(ValueError, match="eps must be > 0"):
        adversarial_accuracy(model, [batch], [0.5] * 3, [0.5] * 3, 0.0, torch.device("cpu"))
    with pytest.raises(ValueError, match="attack='apgd'; choose pgd"):
        adversarial_accuracy(model, [batch], [0.5] * 3, [0.5] * 3, EPS, torch.device("cpu"), attack="apgd")

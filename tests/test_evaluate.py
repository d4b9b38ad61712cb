"""vitzoo.training.evaluate against top-k accuracy and mean cross-entropy written from their definitions."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from vitzoo.training import evaluate


def test_evaluate_equals_the_definitions_over_uneven_batches():
    g = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 7)).train()
    batches = [(torch.randn(n, 3, 2, 2, generator=g), torch.randint(0, 7, (n,), generator=g)) for n in (5, 8, 3)]
    result = evaluate(model, batches)
    assert model.training  # put back as it was
    images, labels = (torch.cat(parts) for parts in zip(*batches))
    with torch.no_grad():
        logits = model(images).double()
    ranks = (logits > logits.gather(1, labels[:, None])).sum(1)  # classes scored above the true one
    assert result["num_images"] == 16
    assert result["acc1"] == pytest.approx((ranks == 0).double().mean().item(), abs=1e-7)
    assert result["acc5"] == pytest.approx((ranks < 5).double().mean().item(), abs=1e-7)
    assert result["loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-6)
    with pytest.raises(ValueError, match="yielded no images"):
        evaluate(model, [])

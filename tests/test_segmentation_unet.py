"""module.decoder=unet / unet+stem: smp's U-Net decoder over a pyramid's four levels (and a pixel stem), to stride 1."""

from __future__ import annotations

import pytest
import torch

import vitzoo
from vitzoo.segmentation import SegmentationNet, create_backbone
from vitzoo.segmentation.losses import SegmentationLoss

TINY = dict(embed_dims=(8, 16, 32, 64), depths=(1, 1, 1, 1), num_heads=(1, 1, 2, 4))  # a PVTv2 of 8-64 channels


def _lines(n: int = 2, size: int = 32):
    """Dark 1-2 px lines on bright noise, the lines class 1: an object a stride-4 decoder cannot place."""
    g = torch.Generator().manual_seed(0)
    images, masks = torch.rand(n, 3, size, size, generator=g) * 0.3 + 0.6, torch.zeros(n, size, size, dtype=torch.long)
    for i in range(n):
        for _ in range(2):
            r, c = torch.randint(2, size - 2, (2,), generator=g).tolist()
            images[i, :, r, :], masks[i, r, :] = 0.1, 1
            images[i, :, :, c], masks[i, :, c] = 0.1, 1
    return images, masks


def test_unet_decoder_with_its_stem_learns_one_pixel_lines_at_full_resolution():
    torch.manual_seed(0)
    net = SegmentationNet(create_backbone("pvt_v2_b0", "linear", model_kwargs=TINY), 2, decoder="unet+stem")
    images, masks = _lines()
    assert net(images).shape == (2, 2, 32, 32)
    criterion, optimizer = SegmentationLoss("ce+dice", 2, 255), torch.optim.AdamW(net.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = criterion(net(images), masks)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(p.grad is not None for p in net.decoder.stem.parameters())  # the pixels reach the decoder
    assert losses[-1] < 0.6 * losses[0]


def test_unet_decoder_refuses_levels_that_are_not_a_pyramid():
    vit = vitzoo.create_model("vit_cifar", features_only=True, depth=1, embed_dim=32, num_heads=1)
    with pytest.raises(ValueError, match=r"module.decoder=unet decodes a pyramid's levels at strides 4, 8, 16, 32"):
        SegmentationNet(vit, 2, decoder="unet")
    with pytest.raises(ValueError, match=r"module.decoder='fpn'; choose one of mlp\|unet\|unet\+stem"):
        SegmentationNet(vit, 2, decoder="fpn")


def test_segment_thin_config_builds_the_unet_decoder_over_a_pyramid_export(tmp_path):
    """--config-name segment_thin: the thin-structure settings over a pyramid export (smp's U-Net decoder with the
    pixel stem, Dice, the backbone at the full learning rate)."""
    from hydra.utils import instantiate

    from conftest import compose_config
    from vitzoo.export import export_model

    export = export_model(vitzoo.create_model("pvt_v2_b0", attention="linear", **TINY), tmp_path / "pvt", head=False)
    overrides = [f"module.backbone={export}", f"data.root={tmp_path}", "data.num_classes=2"]
    cfg = compose_config(tmp_path, overrides, "segment_thin")
    assert (cfg.data.img_size, cfg.module.loss, cfg.module.class_weights) == (96, "dice", "balanced")
    module = instantiate(cfg.module)
    assert module.hparams.decoder == "unet+stem" and module.net.decoder.stem is not None
    assert module.hparams.backbone_lr_ratio == 1.0
    assert module(torch.rand(1, 3, 64, 64)).shape == (1, 2, 64, 64)

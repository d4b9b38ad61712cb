"""module.neck=simple_fpn: ViTDet's pyramid from a plain ViT's last map, at native resolution in sliding windows."""

from __future__ import annotations

import pytest
import torch

import vitzoo
from test_segmentation import export_dir  # noqa: F401  (the tiny linear-attention ViT export, patch 4)
from vitzoo.segmentation import SegmentationNet, create_backbone, sliding_window_probs
from vitzoo.segmentation.neck import SimpleFeaturePyramid


@pytest.mark.parametrize("patch,size", [(4, 32), (16, 64), (8, 40)])
def test_pyramid_strides_follow_the_patch_size(patch, size):
    neck = SimpleFeaturePyramid(dim=64, patch_stride=patch, channels=24)
    grid = size // patch
    levels = neck([torch.rand(2, 64, grid, grid), torch.rand(2, 64, grid, grid)])
    assert neck.reduction() == [patch / 4, patch / 2, patch, 2 * patch] and neck.channels() == [24] * 4
    sides = [grid * 4, grid * 2, grid, -(-grid // 2)]  # an odd grid's pooled level rounds up
    assert [tuple(x.shape) for x in levels] == [(2, 24, s, s) for s in sides]


def test_neck_reads_only_the_last_map():
    torch.manual_seed(0)
    neck = SimpleFeaturePyramid(dim=16, patch_stride=4, channels=8).eval()
    last = torch.rand(1, 16, 5, 6)
    same = neck([torch.rand(1, 16, 5, 6), last])
    assert all(torch.equal(a, b) for a, b in zip(same, neck([last])))


def test_vit_with_simple_fpn_segments_at_native_resolution(export_dir):  # noqa: F811
    torch.manual_seed(0)
    net = SegmentationNet(create_backbone(str(export_dir)), num_classes=3, channels=16, neck="simple_fpn").eval()
    assert net.stride == 4 and net.neck.reduction() == [1, 2, 4, 8]
    with torch.no_grad():
        image = torch.rand(3, 64, 96)
        whole = net(image[None])[0].softmax(0)
        assert torch.allclose(sliding_window_probs(net, image, None), whole, atol=1e-6)  # one window = the net
        odd = torch.rand(3, 70, 98)  # no multiple of the patch: sliding 32 px windows, padded at the edges
        probs = sliding_window_probs(net, odd, 32, overlap=0.25)
    assert probs.shape == (3, 70, 98) and torch.allclose(probs.sum(0), torch.ones(70, 98), atol=1e-5)


def test_simple_fpn_refuses_a_backbone_with_its_own_pyramid():
    backbone = create_backbone("nonlocal_resnet18", "linear", out_indices=(1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"module.neck=simple_fpn .* has its own \(strides \[4, 8, 16, 32\]\); drop"):
        SegmentationNet(backbone, 3, neck="simple_fpn")
    with pytest.raises(ValueError, match=r"module.neck='fpn'; choose one of simple_fpn or null"):
        SegmentationNet(
            vitzoo.create_model("vit_cifar", features_only=True, depth=1, embed_dim=32, num_heads=1), 3, neck="fpn"
        )

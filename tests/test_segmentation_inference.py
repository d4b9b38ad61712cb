"""Sliding-window inference, against references written from its definition."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from vitzoo.segmentation import sliding_window_probs
from vitzoo.segmentation.inference import window_starts


class PixelwiseNet(nn.Module):
    """A 1x1 conv: each pixel's logits depend on that pixel only, so any tiling must give the whole-image result.
    Inputs must be multiples of ``stride``, like a ViT's."""

    def __init__(self, classes: int = 3, stride: int = 4):
        super().__init__()
        self.stride, self.conv, self.shapes = stride, nn.Conv2d(2, classes, 1), []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert x.shape[-2] % self.stride == 0 and x.shape[-1] % self.stride == 0
        self.shapes.append(tuple(x.shape))
        return self.conv(x)


@pytest.mark.parametrize("length,window,step", [(100, 32, 24), (32, 32, 24), (20, 32, 24), (97, 32, 32), (65, 16, 1)])
def test_windows_cover_the_length_and_stay_inside(length, window, step):
    starts = window_starts(length, window, step)
    covered = torch.zeros(max(length, window), dtype=torch.bool)
    for s in starts:
        covered[s : s + window] = True
    assert covered[:length].all() and starts[0] == 0 and starts == sorted(set(starts))
    assert starts[-1] == max(0, length - window)  # the last window is flush with the end, never past it
    assert all(b - a <= step for a, b in zip(starts, starts[1:]))


@pytest.mark.parametrize("size", [(70, 98), (32, 32), (13, 50), (9, 7)])
@pytest.mark.parametrize("overlap,flip", [(0.0, False), (0.5, True)])
def test_any_tiling_of_a_pixelwise_net_equals_the_whole_image(size, overlap, flip):
    torch.manual_seed(0)
    net = PixelwiseNet().eval()
    image = torch.rand(2, *size)
    with torch.no_grad():
        probs = sliding_window_probs(net, image, window=32, overlap=overlap, flip=flip, batch_size=3)
        reference = net.conv(image[None]).softmax(1)[0]
    assert probs.shape == (3, *size)
    torch.testing.assert_close(probs, reference, atol=1e-6, rtol=0)
    assert all(h <= 32 and w <= 32 for *_, h, w in net.shapes)  # never a forward pass larger than the window


def test_window_count_follows_the_overlap():
    net = PixelwiseNet().eval()
    with torch.no_grad():
        sliding_window_probs(net, torch.rand(2, 96, 64), window=32, overlap=0.5, batch_size=100)
    # steps of 16: rows start at 0, 16, ..., 64 (5), columns at 0, 16, 32 (3): 15 windows in one batch
    assert net.shapes == [(15, 2, 32, 32)]
    with torch.no_grad():
        out = sliding_window_probs(net, torch.rand(2, 96, 64), window=None)
    assert net.shapes[-1] == (1, 2, 96, 64) and out.shape == (3, 96, 64)


def test_bad_window_and_overlap_name_the_fix():
    net = PixelwiseNet()
    with pytest.raises(ValueError, match="window 30x30 is not a multiple of the backbone stride 4"):
        sliding_window_probs(net, torch.rand(2, 64, 64), window=30)
    with pytest.raises(ValueError, match=r"overlap=1.0 must lie in \[0, 1\)"):
        sliding_window_probs(net, torch.rand(2, 64, 64), window=32, overlap=1.0)

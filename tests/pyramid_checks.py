"""Small shapes of each pyramid family (four stages, heads per stage, SR ratios, windows kept), for the tests."""

from __future__ import annotations

import vitzoo

SMALL = {
    "pvt_tiny": dict(embed_dims=(16, 32, 48, 64), num_heads=(1, 2, 3, 4), mlp_ratios=(2, 2, 2, 2), num_classes=5),
    "pvt_v2_b0": dict(embed_dims=(16, 32, 48, 64), num_heads=(1, 2, 3, 4), num_classes=5),
    "swin_tiny": dict(embed_dim=16, num_heads=(1, 2, 2, 4), window_size=4, num_classes=5),
}
BASE = {"pvt": "pvt_tiny", "swin": "swin_tiny"}  # a release's family


def small_pyramid(arch: str, img_size: int = 64, **kwargs):
    """``vitzoo.create_model(arch)`` at ``img_size`` in its family's small shape (a release: its base's)."""
    shape = SMALL.get(arch) or SMALL[BASE["swin" if "swin" in arch else "pvt"]]
    return vitzoo.create_model(arch, img_size=img_size, **{**shape, **kwargs})

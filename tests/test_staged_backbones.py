"""What MLLA and RAVLT owe as backbones, each: the official models' parameter counts, timm's feature API at other
sizes, an smp encoder that trains, and torch.export equal to eager."""

from __future__ import annotations

import pytest

import vitzoo
from staged_checks import check_export_parity, check_features, check_parameter_count, check_smp_unet_trains

TINY = ("mlla_tiny", "ravlt_tiny")


@pytest.mark.parametrize(
    "arch, params",
    [("mlla_tiny", 24_392_200), ("mlla_small", 43_015_048), ("ravlt_tiny", 14_897_768), ("ravlt_small", 25_591_208)],
)
def test_parameter_count_is_the_official_models(arch, params):
    check_parameter_count(arch, params)


@pytest.mark.parametrize("arch", TINY)
def test_features_only_forward_intermediates_and_other_sizes(arch):
    check_features(f"vitzoo_{arch}", (64, 128, 256, 512))


@pytest.mark.parametrize("arch", TINY)
def test_smp_unet_encoder_trains_one_step(arch):
    check_smp_unet_trains(f"vitzoo_{arch}")


@pytest.mark.parametrize("arch", TINY)
def test_torch_export_equals_eager(arch):
    check_export_parity(vitzoo.create_model(arch, attention=None, depths=(1, 1, 1, 1), num_classes=3))

"""Checks shared by the MLLA and RAVLT model tests: random official-layout state dicts, RoPE pair rotation, the
features / smp / export behaviour every pyramid backbone has."""

from __future__ import annotations

from typing import Dict, Tuple

import pytest
import timm
import torch
import torch.nn.functional as F

import vitzoo

Shapes = Dict[str, Tuple[int, ...]]
BN = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def bn_shapes(prefix: str, channels: int) -> Shapes:
    return {f"{prefix}.{name}": (() if name == "num_batches_tracked" else (channels,)) for name in BN}


def conv_shapes(prefix: str, cin: int, cout: int, k: int, groups: int = 1, bias: bool = True) -> Shapes:
    out: Shapes = {f"{prefix}.weight": (cout, cin // groups, k, k)}
    if bias:
        out[f"{prefix}.bias"] = (cout,)
    return out


def linear_shapes(prefix: str, cin: int, cout: int) -> Shapes:
    return {f"{prefix}.weight": (cout, cin), f"{prefix}.bias": (cout,)}


def random_state(shapes: Shapes, seed: int = 0) -> Dict[str, torch.Tensor]:
    """float64 tensors of ``shapes``: norm weights near 1, running variances in [0.5, 1.5], the rest N(0, 0.1^2)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in shapes.items():
        if name.endswith("num_batches_tracked"):
            out[name] = torch.tensor(0)
        elif name.endswith("running_var"):
            out[name] = torch.rand(shape, generator=gen, dtype=torch.float64) + 0.5
        elif ("norm" in name and name.endswith("weight")) or "gamma" in name:
            out[name] = 1 + 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
        else:
            out[name] = 0.1 * torch.randn(shape, generator=gen, dtype=torch.float64)
    return out


def parameter_count(shapes: Shapes) -> int:
    """Parameters of a transcribed layout: everything but BN statistics and stored RoPE tables."""
    skip = ("running_mean", "running_var", "num_batches_tracked", "rope.rotations", "RoPE.angle")
    return sum(torch.Size(s).numel() for name, s in shapes.items() if not name.endswith(skip))


def rotate_pairs(x: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Channel pairs (2m, 2m+1) of x (..., n, 2P) as complex numbers times exp(i angles (n, P))."""
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def grid_axes(h: int, w: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Row and column index of each of the h*w tokens in raster order, float64 (n, 1)."""
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return rows.reshape(-1, 1).double(), cols.reshape(-1, 1).double()


def batch_norm(sd: dict, prefix: str, x: torch.Tensor) -> torch.Tensor:
    return F.batch_norm(
        x, sd[f"{prefix}.running_mean"], sd[f"{prefix}.running_var"], sd[f"{prefix}.weight"], sd[f"{prefix}.bias"]
    )


def conv(sd: dict, prefix: str, x: torch.Tensor, stride: int = 1, groups: int = 1) -> torch.Tensor:
    weight = sd[f"{prefix}.weight"]
    return F.conv2d(x, weight, sd.get(f"{prefix}.bias"), stride, weight.shape[-1] // 2, 1, groups)


def check_features(name: str, channels: Tuple[int, ...], size=(64, 96)) -> None:
    """features_only: four NCHW maps at strides 4-32 with the stage widths, equal to forward_intermediates."""
    torch.manual_seed(0)
    model = timm.create_model(name, num_classes=3).eval()
    features = timm.create_model(name, features_only=True).eval()
    features.load_state_dict(
        {f"model.{k}": v for k, v in model.state_dict().items() if not k.startswith("head")}, False
    )
    assert features.feature_info.reduction() == [4, 8, 16, 32]
    assert tuple(features.feature_info.channels()) == channels
    x = torch.randn(2, 3, *size)
    with torch.no_grad():
        maps = features(x)
        final, taken = model.forward_intermediates(x)
        logits = model(x)
    assert [tuple(m.shape) for m in maps] == [
        (2, c, size[0] // s, size[1] // s) for c, s in zip(channels, (4, 8, 16, 32))
    ]
    for a, b in zip(maps, taken):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(model.forward_head(final), logits)
    assert (
        model.forward_intermediates(x, indices=[1], intermediates_only=True, stop_early=True)[0].shape[1] == channels[1]
    )
    with pytest.raises(ValueError, match=r"stage outputs are NCHW maps; give output_fmt='NCHW'"):
        model.forward_intermediates(x, output_fmt="NHWC")


def check_smp_unet_trains(name: str) -> None:
    """smp's ``tu-`` encoder of the backbone builds a Unet that trains one step at 64 x 64."""
    import segmentation_models_pytorch as smp

    torch.manual_seed(0)
    model = smp.Unet(f"tu-{name}", encoder_weights=None, classes=2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(2, 3, 64, 64), torch.randint(0, 2, (2, 64, 64))
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    before = [p.detach().clone() for p in model.encoder.parameters()]
    opt.step()
    assert torch.isfinite(loss) and any(not torch.equal(a, p) for a, p in zip(before, model.encoder.parameters()))


def check_export_parity(model: torch.nn.Module, size=(64, 64)) -> None:
    """torch.export's program gives eager's logits."""
    model = model.eval()
    x = torch.randn(1, 3, *size)
    with torch.no_grad():
        program = torch.export.export(model, (x,))
        torch.testing.assert_close(program.module()(x), model(x))


def check_parameter_count(arch: str, params: int) -> None:
    """The architecture's own model holds the official model's parameters (within 0.5%)."""
    model = vitzoo.create_model(arch, attention=None)
    assert abs(sum(p.numel() for p in model.parameters()) / params - 1) < 0.005


def check_gmacs(arch: str, gmacs: float, attention=None) -> None:
    """FlopCounterMode's GMACs at 224, batch 1, eval, within 2% of the official model's."""
    from torch.utils.flop_counter import FlopCounterMode

    model = vitzoo.create_model(arch, attention=attention).eval()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        model(torch.randn(1, 3, 224, 224))
    assert abs(counter.get_total_flops() / 2e9 / gmacs - 1) < 0.02


def load_official_file(arch: str, state: Dict[str, torch.Tensor], path, depths, attention) -> torch.nn.Module:
    """``state`` (official names) saved to ``path``: timm's ``pretrained_cfg_overlay=dict(file=...)`` loads it, and so
    does ``init_from`` into a model of ``attention`` (softmax in stages 1-2, the model's own in 3-4: only the swapped
    stages' attention tensors are new); returns timm's model."""
    torch.save(state, path)
    model = timm.create_model(
        f"vitzoo_{arch}", pretrained=True, pretrained_cfg_overlay=dict(file=str(path)), depths=depths, num_classes=5
    )
    other = vitzoo.create_model(arch, attention=attention, depths=depths, num_classes=5)
    report = vitzoo.models.initialise_from(other, path)
    assert report.loaded and all(".attn." in k for k in report.new)  # only the swapped stages' attention is new
    later = [k for k in model.state_dict() if k.startswith(("layers.2.", "layers.3."))]
    assert all(torch.equal(model.state_dict()[k], other.state_dict()[k]) for k in later)
    return model

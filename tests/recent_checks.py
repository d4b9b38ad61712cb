"""Shared by the tests of pola, inline, mlla, rala and lion: float64 pieces written from the formulas (rotations as
complex numbers, the output gate), and the checks every one of them runs (the module at 1x, 1.5x and 2x its build
resolution in both backbones against its float64 reference; fused paths against eager ones with gradients)."""

import torch


from mech_checks import attention_io, attention_layers
from mech_checks import backbones as mech_backbones


def merged(t):
    """(B, H, N, D) -> (B, N, H*D)."""
    B, H, N, D = t.shape
    return t.transpose(1, 2).reshape(B, N, H * D)


def gated_out(layer, x, heads_out):
    """proj((merged heads) * (x W_g + b_g)) in float64."""
    gate = x.double() @ layer.gate.weight.double().T
    if layer.gate.bias is not None:
        gate = gate + layer.gate.bias.double()
    y = merged(heads_out) * gate
    return y @ layer.proj.weight.double().T + layer.proj.bias.double()


def grid_positions(grid, prefix):
    """(row, column) of each token as float64 vectors; prefix tokens at (0, 0)."""
    rows = [0] * prefix + [r for r in range(grid[0]) for _ in range(grid[1])]
    cols = [0] * prefix + [c for _ in range(grid[0]) for c in range(grid[1])]
    return torch.tensor(rows, dtype=torch.float64), torch.tensor(cols, dtype=torch.float64)


def rotate_complex(x, angles):
    """Channels (2m, 2m+1) as the complex number x_2m + i x_2m+1, multiplied by exp(i angle_m); angles (..., n, d/2)."""
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(z * torch.polar(torch.ones_like(angles), angles)).flatten(-2)


def row_shares(w):
    """|w| with rows normalised."""
    return w.abs() / w.abs().sum(-1, keepdim=True)


def backbones(spec):
    """``mech_checks.backbones`` with biases on q, k and v."""
    return mech_backbones(spec, qkv_bias=True)


def check_resolutions(spec, reference, randomise=lambda layer: None, sizes=(32, 48, 64)):
    """Both backbones (float64) at ``sizes``: 32 px (built), 48 px (1.5x) and 64 px (2x); every attention layer sees its
    input's grid and its output is ``reference(layer, x)`` (B, N, C) on its recorded input."""
    for name, model in backbones(spec).items():
        model = model.double().eval()
        for layer in attention_layers(model):
            randomise(layer)
        for px in sizes:
            for layer, x, out in attention_io(model, torch.randn(2, 3, px, px, dtype=torch.float64)):
                built = layer.grid_size
                assert layer.token_grid == (built[0] * px // 32, built[1] * px // 32), name
                torch.testing.assert_close(out, reference(layer, x), rtol=1e-7, atol=1e-9, msg=f"{name} {px}px")


def check_fused_equals_eager(fused, eager, x):
    """Two modules with the same weights give the same output and the same gradients (input and parameters)."""
    eager.load_state_dict(fused.state_dict())
    outs, grads = [], []
    for m in (fused, eager):
        xi = x.clone().requires_grad_()
        y = m(xi)
        y.square().sum().backward()
        outs.append(y.detach())
        grads.append([xi.grad] + [p.grad for p in m.parameters()])
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)

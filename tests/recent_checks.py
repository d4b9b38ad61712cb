"""Shared by the tests of pola, inline, mlla, rala and lion: float64 pieces written from the formulas (rotations as
complex numbers, the output gate), and the checks every one of them runs (the module at 1x, 1.5x and 2x its build
resolution in both backbones against its float64 reference; fused paths against eager ones with gradients)."""

import torch
import torch.nn.functional as F

from attention_reference import dwc_ref, module_qkv
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


def lepe_heads_ref(layer, x, weights_ref):
    """The heads' output (B, H, N, D) of a decoupled-RoPE layer (mlla, rala) in float64: ``weights_ref(layer, q,
    k)[0] @ v``, plus LePE (the layer's depthwise conv of v over the grid, prefix rows 0) when it has one."""
    q, k, v = module_qkv(layer, x)
    out = weights_ref(layer, q, k)[0] @ v
    if layer.lepe is not None:
        out = out + dwc_ref(v, layer.lepe, layer.current_grid(v.shape[-2]), layer.num_prefix_tokens)
    return out


def check_formula(layer, reference, tokens):
    """The float64 ``layer`` on a normal (2, ``tokens``, 16) input is ``reference(layer, x)`` to float64 rounding;
    returns x."""
    x = torch.randn(2, tokens, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x), reference(layer, x), rtol=1e-9, atol=1e-11)
    return x


def probs_at(layer, x, index):
    """``layer.probs`` for the queries ``index`` of x, with no mask and not causal (B, H, Q, N)."""
    return layer.probs(x, *layer.project(x)[:2], None, False, index)


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


def scan_inputs(n, num_gates=1):
    """Seeded float64 inputs of LION's scans, each requiring grad: features fq, fk (2, 3, n, 8) of unit norm, values v
    (2, 3, n, 5) and a list of ``num_gates`` log-gates (2, 3, n)."""
    torch.manual_seed(0)
    fq, fk = (F.normalize(torch.rand(2, 3, n, 8, dtype=torch.float64), dim=-1).requires_grad_() for _ in range(2))
    v = torch.randn(2, 3, n, 5, dtype=torch.float64, requires_grad=True)
    gates = [F.logsigmoid(torch.randn(2, 3, n, dtype=torch.float64)).requires_grad_() for _ in range(num_gates)]
    return fq, fk, v, gates


def check_same_with_gradients(first, second, inputs):
    """``first()`` and ``second()`` (float64) give the same output and the same gradients of its squared sum with
    respect to ``inputs``."""
    results = []
    for fn in (first, second):
        out = fn()
        results.append((out, torch.autograd.grad(out.square().sum(), inputs)))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-10, atol=1e-12)
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


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

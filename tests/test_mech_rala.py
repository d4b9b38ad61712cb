"""rala (RALA): query-aware key weights, RALA's per-head RoPE as complex rotations, the unrotated normaliser, LePE
and the linear gate against float64 formulas."""

import pytest
import torch

from attention_reference import module_qkv, phi, single_thread  # noqa: F401
from mech_checks import assert_one_line_error, build, gradcheck_module
from recent_checks import check_formula, check_resolutions, gated_out, grid_positions, lepe_heads_ref, probs_at
from recent_checks import rotate_complex, row_shares


def angles_ref(layer, n):
    """RALA, per head: pair m < d/4 turns by row * omega_m, pair m >= d/4 by column * omega_(m - d/4),
    omega_k = 10000^(-k / (d/4 - 1))."""
    rows, cols = grid_positions(layer.current_grid(n), layer.num_prefix_tokens)
    quarter = layer.head_dim // 4
    omega = [10000.0 ** (-k / max(quarter - 1, 1)) for k in range(quarter)]
    return torch.stack([rows * w for w in omega] + [cols * w for w in omega], dim=-1)


def weights_ref(layer, q, k, eps=1e-6):
    """k'_j = n softmax_j(tau qbar.phi k_j) phi k_j; (R_i phi q_i).(R_j k'_j) / (phi q_i . sum_j k'_j + n eps)."""
    fq, fk = phi(q, "elu"), phi(k, "elu")
    n, tau = k.shape[-2], q.shape[-1] ** -0.5
    logits = tau * (fq.mean(-2, keepdim=True) @ fk.transpose(-2, -1))  # (B, H, 1, n)
    alpha = torch.exp(logits) / torch.exp(logits).sum(-1, keepdim=True)
    kw = n * alpha.transpose(-2, -1) * fk
    angles = angles_ref(layer, n)
    num = rotate_complex(fq, angles) @ rotate_complex(kw, angles).transpose(-2, -1)
    return num / (fq @ kw.sum(-2).unsqueeze(-1) + n * eps), num


def reference(layer, x):
    return gated_out(layer, x, lepe_heads_ref(layer, x, weights_ref))


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("options", [{}, {"kernel_size": 0}, {"heads": "projected", "head_dim": 12}])
def test_module_is_the_float64_formula(prefix, options):
    layer = build({"name": "rala", **options}, tokens=prefix + 16, prefix=prefix, qkv_bias=True).double()
    layer.token_grid = (8, 2)  # non-square: rows and columns must not be swapped
    check_formula(layer, reference, prefix + 16)


def test_probs_are_the_weights_shares():
    layer = build("rala", tokens=17, prefix=1).double()
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    index = torch.tensor([0, 9, 16])
    expected = row_shares(weights_ref(layer, *module_qkv(layer, x)[:2])[1])[:, :, index]
    torch.testing.assert_close(probs_at(layer, x, index), expected)


def test_gradcheck():
    layer = build({"name": "rala", "kernel_size": 3}, dim=8, num_heads=1, tokens=5, prefix=1, qkv_bias=True).double()
    assert gradcheck_module(layer, torch.randn(1, 5, 8, dtype=torch.float64), fast_mode=True)


@pytest.mark.parametrize(
    "spec, fix",
    [
        ({"name": "rala", "heads": "projected", "head_dim": 6}, "multiple of 4"),
        ({"name": "rala", "kernel_size": 4}, "odd"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(spec, fix):
    assert_one_line_error(spec, fix, 16, 2)


def test_at_one_and_a_half_and_twice_the_resolution_in_both_backbones():
    check_resolutions("rala", reference)

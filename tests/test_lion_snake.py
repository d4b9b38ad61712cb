"""lion with order='snake' (LION-D / LION-S with natural symbols): the mask is the mean of the masks over a row snake
and a column snake of the grid, each mapped back to the backbone's order; checked against the float64 formula
written with explicit loops over the two orders, the chunked scans against the quadratic form (values and
gradients), and at 1.5x / 2x the training resolution."""

import pytest
import torch
import torch.nn.functional as F

from attention_reference import module_out, module_qkv
from mech_checks import assert_one_line_error, build, check_exporters, gradcheck_module
from recent_checks import check_formula, check_resolutions, check_same_with_gradients, probs_at, scan_inputs
from vitzoo.attention.lion import lion_snake, lion_snake_masked, snake_orders


def snake_sequences(h, w, prefix):
    """Sequence position -> token index (prefix first) for the row snake and the column snake, by loops."""
    rows, cols = list(range(prefix)), list(range(prefix))
    for r in range(h):
        rows += [prefix + r * w + c for c in (range(w) if r % 2 == 0 else reversed(range(w)))]
    for c in range(w):
        cols += [prefix + r * w + c for r in (range(h) if c % 2 == 0 else reversed(range(h)))]
    return rows, cols


def sequence_mask(lam):
    """M_ab over sequence positions: prod of lambda_s over s in [min(a, b), max(a, b)], s != a (1 on the diagonal)."""
    n = lam.shape[-1]
    a, b = torch.arange(n)[:, None], torch.arange(n)[None, :]
    lo, hi = torch.minimum(a, b), torch.maximum(a, b)
    M = torch.ones(*lam.shape[:-1], n, n, dtype=torch.float64)
    for s in range(n):  # gate s multiplies every entry whose range holds it, the query's own gate excepted
        M = M * torch.where((lo <= s) & (s <= hi) & (a != s), lam[..., s, None, None], torch.ones(()))
    return M


def gates_ref(layer, x, gate):
    """lambda_t (batch, head, token) in the backbone's order: sigmoid(a_h) (fixed), 1 - sigmoid(w_h.x_t + b_h)
    (selective), prefix gates 1."""
    B, N, _ = x.shape
    if layer.decay == "fixed":
        return torch.sigmoid(gate.double())[None, :, None].expand(B, -1, N).clone()
    lam = (1 - torch.sigmoid(x.double() @ gate.weight.double().T + gate.bias.double())).transpose(1, 2).clone()
    lam[..., : layer.num_prefix_tokens] = 1.0
    return lam


def snake_mask_ref(layer, x, grid):
    """(M^row + M^col) / 2 in the backbone's order: M[p, p'] = M_seq[pos(p), pos(p')] per order."""
    rows, cols = snake_sequences(*grid, layer.num_prefix_tokens)
    fixed = layer.decay == "fixed"
    params = (layer.decay_logit, layer.decay_logit_col) if fixed else (layer.gate, layer.gate_col)
    total = 0
    for sequence, param in zip((rows, cols), params):
        pos = torch.tensor([sequence.index(t) for t in range(x.shape[1])])
        if fixed:  # lambda_h^|pos(p) - pos(p')|
            lam = torch.sigmoid(param.detach().double())[:, None, None]
            total = total + lam ** (pos[:, None] - pos[None, :]).abs().double()
        else:
            M_seq = sequence_mask(gates_ref(layer, x, param).detach()[..., sequence])  # gates in sequence order
            total = total + M_seq[..., pos[:, None], pos[None, :]]
    return total / 2


def features_ref(x):
    u = F.silu(x.double()) + 0.5
    return u / u.norm(dim=-1, keepdim=True)


def weights_ref(layer, x, q, k, grid, eps=1e-6):
    """A_ij / (sum_j A_ij + eps), A_ij = tau phi(q_i).phi(k_j) M_ij, M the snakes' mean mask."""
    tau = q.shape[-1] ** -0.5
    attn = tau * features_ref(q) @ features_ref(k).transpose(-2, -1) * snake_mask_ref(layer, x, grid)
    return attn / (attn.sum(-1, keepdim=True) + eps)


def reference(layer, x, grid=None):
    q, k, v = module_qkv(layer, x)
    grid = grid if grid is not None else layer.token_grid
    return module_out(layer, weights_ref(layer, x, q, k, grid) @ v)


def spread(layer):
    """Gates far from one another and from 1/2, so the test sees which gate multiplies which entry."""
    for p in (layer.decay_logit, layer.decay_logit_col):
        if p is not None:
            torch.nn.init.normal_(p, std=1.5)
    for g in (layer.gate, layer.gate_col):
        if g is not None:
            torch.nn.init.normal_(g.weight)
            torch.nn.init.normal_(g.bias)


def test_the_two_orders_on_a_two_by_three_grid():
    """Row snake 1 2 3 | 6 5 4, column snake 1 4 | 5 2 | 3 6, the class token first in both."""
    rows, cols = snake_orders((2, 3), 1)
    assert rows.tolist() == [0, 1, 2, 3, 6, 5, 4]
    assert cols.tolist() == [0, 1, 4, 5, 2, 3, 6]
    for grid, prefix in [((4, 4), 0), ((3, 5), 1), ((5, 2), 2)]:
        assert [o.tolist() for o in snake_orders(grid, prefix)] == list(snake_sequences(*grid, prefix))


@pytest.mark.parametrize("decay", ["fixed", "selective"])
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("chunk, grid", [(3, (4, 4)), (64, (4, 4)), (4, (3, 5))])
def test_module_is_the_float64_formula(decay, prefix, chunk, grid):
    n = prefix + grid[0] * grid[1]
    layer = build({"name": "lion", "decay": decay, "order": "snake", "chunk": chunk}, tokens=n, prefix=prefix)
    layer = layer.double()
    spread(layer)
    layer.token_grid = grid
    x = check_formula(layer, reference, n)
    index = torch.tensor([0, 5, n - 1])
    q, k, _ = module_qkv(layer, x)
    torch.testing.assert_close(probs_at(layer, x, index), weights_ref(layer, x, q, k, grid)[:, :, index])


def test_one_row_with_tied_parameters_is_the_raster_form():
    """On a 1 x w grid both snakes are the raster order: with the column decay equal to the row one, snake = raster."""
    snake = build({"name": "lion", "decay": "fixed", "order": "snake", "chunk": 3}, tokens=8, prefix=1).double()
    raster = build({"name": "lion", "decay": "fixed", "chunk": 3}, tokens=8, prefix=1).double()
    state = raster.state_dict()
    snake.load_state_dict({**state, "decay_logit_col": state["decay_logit"]})
    snake.token_grid = raster.token_grid = (1, 7)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    torch.testing.assert_close(snake(x), raster(x), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("chunk", [1, 4, 64])
def test_chunked_scans_equal_the_masked_form_with_gradients(chunk):
    fq, fk, v, gates = scan_inputs(21, num_gates=2)
    orders = snake_orders((4, 5), 1)
    check_same_with_gradients(
        lambda: lion_snake(fq, fk, v, tuple(gates), orders, chunk=chunk),
        lambda: lion_snake_masked(fq, fk, v, tuple(gates), orders),
        (fq, fk, v, *gates),
    )


@pytest.mark.parametrize("decay", ["fixed", "selective"])
def test_both_orders_parameters_train(decay):
    layer = build({"name": "lion", "decay": decay, "order": "snake", "chunk": 4}, tokens=17, prefix=1)
    layer(torch.randn(2, 17, 16)).square().sum().backward()
    for p in layer.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


def test_gradcheck():
    layer = build({"name": "lion", "decay": "selective", "order": "snake", "chunk": 2}, dim=8, tokens=5, prefix=1)
    assert gradcheck_module(layer.double(), torch.randn(1, 5, 8, dtype=torch.float64), fast_mode=True)


@pytest.mark.parametrize(
    "spec, fix",
    [
        ({"name": "lion", "order": "hilbert"}, "raster"),
        ({"name": "lion", "decay": "none", "order": "snake"}, "fixed"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(spec, fix):
    assert_one_line_error(spec, fix, 16, 2)


@pytest.mark.parametrize("decay, sizes", [("fixed", (32, 48, 64)), ("selective", (32,))])
def test_at_one_and_a_half_and_twice_the_resolution_in_both_backbones(decay, sizes):
    """The snakes are built from each input's grid (the official fixes them at construction). Selective only at the
    build size (the ResNet's 16 x 16 grid there): its product reference takes about a minute at 1.5x, where its
    scans are fixed decay's with other gates."""
    check_resolutions({"name": "lion", "decay": decay, "order": "snake", "chunk": 8}, reference, spread, sizes)


@pytest.mark.slow
@pytest.mark.parametrize("decay", ["fixed", "selective"])
def test_exporters_carry_the_snake_orders(decay):
    """The ViT's 4 x 4 grid + class token in chunks of 4 through torch.export and the legacy ONNX exporter
    (onnxruntime, another batch size): the orders are constants of the traced grid."""
    check_exporters({"name": "lion", "decay": decay, "order": "snake", "chunk": 4})

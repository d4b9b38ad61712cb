"""lion (LION-Lit, -D, -S): the decay masks written as products of gates, the quadratic masked form, and the chunked
scans against it (values and gradients); exporters carry the multi-chunk scan."""

import pytest
import torch
import torch.nn.functional as F

from attention_reference import module_out, module_qkv, phi, single_thread  # noqa: F401
from mech_checks import assert_one_line_error, build, check_exporters, gradcheck_module
from recent_checks import check_formula, check_fused_equals_eager, check_resolutions, check_same_with_gradients
from recent_checks import probs_at, scan_inputs
from vitzoo.attention.lion import lion_chunked, lion_masked


def gates_ref(layer, x):
    """lambda_t = 1 - sigmoid(w_h.x_t + b_h) per (batch, head, token), prefix gates 1 (selective)."""
    z = x.double() @ layer.gate.weight.double().T + layer.gate.bias.double()
    lam = (1 - torch.sigmoid(z)).transpose(1, 2).clone()
    lam[..., : layer.num_prefix_tokens] = 1.0
    return lam


def mask_ref(lam):
    """M_ij = prod of lambda_s over s in [min(i, j), max(i, j)], s != i (1 on the diagonal)."""
    N = lam.shape[-1]
    j, s = torch.arange(N)[:, None], torch.arange(N)[None, :]
    rows = []
    for i in range(N):
        between = (s >= torch.clamp(j, max=i)) & (s <= torch.clamp(j, min=i)) & (s != i)  # (key j, gate s)
        rows.append(torch.where(between, lam[:, :, None, :], torch.ones(())).prod(dim=-1))
    return torch.stack(rows, dim=-2)


def features_ref(x, decay):
    if decay == "none":
        return phi(x, "elu")
    u = F.silu(x.double()) + 0.5
    return u / u.norm(dim=-1, keepdim=True)


def weights_ref(layer, x, q, k, eps=1e-6):
    """A_ij / (sum_j A_ij + eps), A_ij = tau phi(q_i).phi(k_j) M_ij."""
    tau = q.shape[-1] ** -0.5
    attn = tau * features_ref(q, layer.decay) @ features_ref(k, layer.decay).transpose(-2, -1)
    if layer.decay == "fixed":  # lambda_h^|i-j|
        n = x.shape[1]
        distance = (torch.arange(n)[:, None] - torch.arange(n)[None, :]).abs().double()
        attn = attn * torch.sigmoid(layer.decay_logit.double())[:, None, None] ** distance
    elif layer.decay == "selective":
        attn = attn * mask_ref(gates_ref(layer, x))
    return attn / (attn.sum(-1, keepdim=True) + eps)


def reference(layer, x):
    q, k, v = module_qkv(layer, x)
    return module_out(layer, weights_ref(layer, x, q, k) @ v)


DECAYS = ["none", "fixed", "selective"]


@pytest.mark.parametrize("decay", DECAYS)
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("chunk", [3, 64])  # several chunks with a ragged last one, and one chunk
def test_module_is_the_float64_formula(decay, prefix, chunk):
    layer = build(
        {"name": "lion", "decay": decay, "chunk": chunk}, tokens=prefix + 16, prefix=prefix, qkv_bias=True
    ).double()
    if layer.gate is not None:
        torch.nn.init.normal_(layer.gate.weight)  # spread gates, so the test sees them
    x = check_formula(layer, reference, prefix + 16)
    index = torch.tensor([0, 6, prefix + 15])
    q, k, _ = module_qkv(layer, x)
    torch.testing.assert_close(probs_at(layer, x, index), weights_ref(layer, x, q, k)[:, :, index])


def test_the_masks_match_the_decay_each_names():
    """Fixed decay is lambda^|i-j| (symmetric); the selective mask is not symmetric and never uses the query's gate."""
    lam = torch.full((1, 1, 5), 0.5, dtype=torch.float64)
    i, j = torch.meshgrid(torch.arange(5), torch.arange(5), indexing="ij")
    torch.testing.assert_close(mask_ref(lam)[0, 0], 0.5 ** (i - j).abs().double())  # the closed form of fixed decay
    lam = torch.tensor([[[1.0, 0.9, 0.1, 0.8, 0.7]]], dtype=torch.float64)
    M = mask_ref(lam)[0, 0]
    assert M[1, 2] == pytest.approx(0.1) and M[2, 1] == pytest.approx(0.9)  # the key's own gate, not the query's


@pytest.mark.parametrize("chunk", [1, 4, 7, 64])
def test_chunked_scans_equal_the_masked_form_with_gradients(chunk):
    fq, fk, v, (gates,) = scan_inputs(23)
    inputs = (fq, fk, v, gates)
    check_same_with_gradients(lambda: lion_chunked(*inputs, chunk=chunk), lambda: lion_masked(*inputs), inputs)


@pytest.mark.parametrize("impl", ["torch", "auto"])
def test_lit_fused_equals_eager_with_gradients(impl):
    fused = build({"name": "lion", "decay": "none", "impl": impl}, tokens=17, prefix=1, qkv_bias=True)
    eager = build({"name": "lion", "decay": "none", "impl": "eager"}, tokens=17, prefix=1, qkv_bias=True)
    check_fused_equals_eager(fused, eager, torch.randn(2, 17, 16))


def test_the_selective_gate_trains():
    layer = build({"name": "lion", "decay": "selective", "chunk": 4}, tokens=17, prefix=1)
    layer(torch.randn(2, 17, 16)).square().sum().backward()
    assert layer.gate.weight.grad.abs().sum() > 0 and layer.gate.bias.grad.abs().sum() > 0


@pytest.mark.parametrize("decay", ["fixed", "selective"])
def test_gradcheck(decay):
    layer = build({"name": "lion", "decay": decay, "chunk": 2}, dim=8, tokens=5, prefix=1, qkv_bias=True).double()
    assert gradcheck_module(layer, torch.randn(1, 5, 8, dtype=torch.float64), fast_mode=True)


@pytest.mark.slow
@pytest.mark.parametrize("decay", ["fixed", "selective"])
def test_exporters_carry_the_multi_chunk_scan(decay):
    """The ViT's 17 tokens in chunks of 4 (5 chunks, the last ragged) through torch.export and the legacy ONNX
    exporter (onnxruntime, another batch size); the registered-mechanism matrix runs one chunk."""
    check_exporters({"name": "lion", "decay": decay, "chunk": 4})


@pytest.mark.parametrize(
    "spec, fix",
    [
        ({"name": "lion", "decay": "rnn"}, "none"),
        ({"name": "lion", "chunk": 0}, "positive"),
        ({"name": "lion", "impl": "cuda"}, "impl"),
    ],
)
def test_bad_options_are_one_line_naming_the_fix(spec, fix):
    assert_one_line_error(spec, fix, 16, 2)


@pytest.mark.parametrize("decay, sizes", [("none", (32, 48, 64)), ("fixed", (32, 48, 64)), ("selective", (32, 48))])
def test_at_one_and_a_half_and_twice_the_resolution_in_both_backbones(decay, sizes):
    """Raster order at every grid: the masks follow the input's token count (selective's product reference is slow
    at 2x, where its scan is fixed decay's with other gates)."""
    check_resolutions({"name": "lion", "decay": decay, "chunk": 8}, reference, sizes=sizes)

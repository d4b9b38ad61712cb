"""The sigmoid output gate (``gate: channel | head``): y = proj(norm(O) * sigmoid(x W_g + b_g)), one gate per head
channel or one per head, for every mechanism; against a float64 reference, and composed with PolaFormer's and
RALA's linear gate."""

import pytest
import torch

from vitzoo.attention import list_attentions

from attention_reference import module_qkv, softmax_ref
from mech_checks import build
from recent_checks import merged

H, D = 2, 8


@pytest.mark.parametrize("scale_norm", [False, True])
@pytest.mark.parametrize("gate", ["channel", "head"])
def test_softmax_with_a_gate_is_the_float64_reference(gate, scale_norm):
    """The gate multiplies after the scale-norm and before the output projection (timm's order)."""
    layer = build(
        {"name": "softmax", "gate": gate},
        dim=16,
        num_heads=H,
        tokens=16,
        qkv_bias=True,
        scale_norm=scale_norm,
        norm_layer=torch.nn.LayerNorm,
    ).double()
    with torch.no_grad():
        layer.out_gate.weight.normal_()
        layer.out_gate.bias.normal_()
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    q, k, v = module_qkv(layer, x)
    heads = merged(softmax_ref(q, k, v)[0])
    if scale_norm:
        heads = torch.nn.functional.layer_norm(heads, (H * D,), layer.norm.weight.double(), layer.norm.bias.double())
    g = torch.sigmoid(x @ layer.out_gate.weight.T + layer.out_gate.bias)  # (B, N, H*D) or (B, N, H)
    g = g if gate == "channel" else g.repeat_interleave(D, dim=-1)
    want = (heads * g) @ layer.proj.weight.T + layer.proj.bias
    assert torch.allclose(layer(x), want, atol=1e-10)


def proj_input(layer, x):
    seen = []
    hook = layer.proj.register_forward_hook(lambda m, args, out: seen.append(args[0]))
    with torch.no_grad():
        layer(x)
    hook.remove()
    return seen[0]


@pytest.mark.parametrize("name", list_attentions())
@pytest.mark.parametrize("gate", ["channel", "head"])
def test_every_mechanism_takes_the_gate_before_its_projection(name, gate):
    """A gate of zero weights and bias is sigmoid(0) = 1/2 (the start the paper's default init gives): the output
    projection sees half of what it sees without the gate, linear gates (pola, rala) included."""
    layer = build({"name": name, "gate": gate}, dim=16, num_heads=H, tokens=17, prefix=1, qkv_bias=True).eval()
    assert layer.out_gate.weight.shape == ((H * D) if gate == "channel" else H, 16)
    with torch.no_grad():
        layer.out_gate.weight.zero_()
        layer.out_gate.bias.zero_()
    x = torch.randn(2, 17, 16)
    gated = proj_input(layer, x)
    layer.out_gate = None
    assert torch.allclose(gated, 0.5 * proj_input(layer, x), atol=1e-6)


def test_the_gate_has_a_bias_as_q_k_v_have_and_none_by_default():
    assert build("softmax", tokens=16).out_gate is None
    assert build({"name": "softmax", "gate": "head"}, tokens=16, qkv_bias=False).out_gate.bias is None


def test_an_unknown_gate_is_a_one_line_error():
    with pytest.raises(ValueError, match=r"unknown gate='sigmoid'; choose one of \['channel', 'head'\]") as err:
        build({"name": "linear", "gate": "sigmoid"}, tokens=16)
    assert "\n" not in str(err.value)

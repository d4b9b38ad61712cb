"""Leaving eager PyTorch without ONNX: torch.export, torch.compile(fullgraph=True) and torch.fx carry the same model,
for every registered mechanism in both backbones (tests/deploy_checks.py); logits match eager PyTorch within 1e-4.
ONNX: tests/test_deploy_onnx.py; the pyramids: tests/test_deploy_pyramids.py."""

from __future__ import annotations

import pytest
import torch

import vitzoo

from deploy_checks import BACKBONES, RESNET_SPECS, SPEC_IDS, SPECS, assert_logits, build, inputs

# every spec in the ViT (the fast run), RESNET_SPECS in the non-local ResNet (2-3 s each: marked slow)
COMPILE_CASES = [pytest.param(spec, "vit", id=f"{i}-vit") for spec, i in zip(SPECS, SPEC_IDS)] + [
    pytest.param(spec, "resnet", marks=pytest.mark.slow, id=f"{spec}-resnet") for spec in RESNET_SPECS
]


@pytest.mark.parametrize("attention, backbone", COMPILE_CASES)
def test_torch_export_and_compile_fullgraph(attention, backbone):
    model, x = build(backbone, attention), inputs()
    with torch.no_grad():
        expected = model(x)
        assert_logits(torch.export.export(model, (x,)).module()(x), expected)
        torch._dynamo.reset()
        assert_logits(torch.compile(model, fullgraph=True, backend="eager")(x), expected)


def test_fused_linear_attention_is_one_op_to_torch_export_and_compile():
    """The fused kernel is carried as vitzoo::linear_attention (not the eager formula, not a constant), and
    compiled training (aot_eager: forward and backward graphs) gives eager's gradients."""
    model, x = build("vit", "linear"), inputs()
    graph = torch.export.export(model, (x,)).graph
    assert any(node.target is torch.ops.vitzoo.linear_attention.default for node in graph.nodes)
    params = dict(model.named_parameters())
    expected = torch.autograd.grad(model(x).square().sum(), list(params.values()))
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    got = torch.autograd.grad(compiled(x).square().sum(), list(params.values()))
    for name, g, g_ref in zip(params, got, expected):
        torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-6, msg=name)


def test_torchscript_is_refused_with_one_clear_error():
    with pytest.raises(RuntimeError, match="use torch.jit.trace, torch.export or torch.onnx.export"):
        torch.jit.script(build("vit", "linear"))


FX_NODES = {"vit": ("blocks.1", "head"), "resnet": ("layer3", "fc")}  # (a feature after attention, the logits)


@pytest.mark.parametrize("backbone", BACKBONES)
@pytest.mark.parametrize("attention", SPECS, ids=SPEC_IDS)
def test_fx_feature_extractor_matches_eager(attention, backbone):
    """torch.fx through timm's create_feature_extractor (torchvision's, with timm's leaf functions): the graph's
    intermediate feature and logits are eager's, at the traced size and at a larger, non-square one (whose patch
    grid the graph must take from the input: it cannot be guessed from the token count)."""
    from timm.models._features_fx import create_feature_extractor

    model = build(backbone, attention, depth=2)
    feature, logits = FX_NODES[backbone]
    extractor = create_feature_extractor(model, {feature: "feature", logits: "logits"})
    grids = [m.token_grid for m in model.modules() if isinstance(m, vitzoo.attention.ZooAttention)]
    assert grids and all(grid is None for grid in grids), f"tracing stored token grids on the model: {grids}"
    for size in ((32, 32), (64, 96)):
        x, expected = inputs(2, size), {}
        with torch.no_grad():
            got = extractor(x)  # before eager, so no grid of this size is left on the layers
            hook = model.get_submodule(feature).register_forward_hook(lambda m, i, out: expected.update(feature=out))
            expected["logits"] = model(x)
            hook.remove()
        for name in ("feature", "logits"):
            torch.testing.assert_close(got[name], expected[name], msg=f"{name} at {size}")

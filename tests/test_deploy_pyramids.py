"""The pyramids (small shapes) leave eager PyTorch with their logits: a hub export round trip, torch.export,
torch.compile, both ONNX exporters and torch.fx features, the releases' mechanisms in each family."""

from __future__ import annotations

import pytest
import timm
import torch

from vitzoo.export import export_model

from deploy_checks import assert_logits, inputs, onnx_logits
from pyramid_checks import SMALL as PYRAMIDS
from pyramid_checks import small_pyramid

ort = pytest.importorskip("onnxruntime", reason="ONNX tests need the test extras (pip install -e '.[test]')")
pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript (pip install -e '.[test]')")


# -- the pyramids (small shapes), the releases' mechanisms, each in one stage of each family (two mixes a family; the
# first in the fast run for PVT v1 and Swin): a hub export round trip, torch.export, torch.compile, both ONNX
# exporters, torch.fx features
PYRAMID_MIXES = {
    "linear-focused-agent-inline": ["linear", "focused_linear", "agent", "inline"],
    "pola-softmax-focused-linear": ["pola", "softmax", "focused_linear", "linear"],
}
FAST_PYRAMIDS = {("pvt_tiny", "linear-focused-agent-inline"), ("swin_tiny", "linear-focused-agent-inline")}
PYRAMID_CASES = [
    pytest.param(arch, mix, marks=() if (arch, name) in FAST_PYRAMIDS else pytest.mark.slow, id=f"{arch}-{name}")
    for arch in sorted(PYRAMIDS)
    for name, mix in PYRAMID_MIXES.items()
]
DEPTHS = (1, 2, 1, 1)  # two blocks in stage 2 (Swin's shifted windows): the exporters' time grows with the blocks
PYRAMID_FX_NODES = {"pvt_tiny": "block2.1", "pvt_v2_b0": "stages.1", "swin_tiny": "layers.1"}


@pytest.mark.parametrize("arch, attention", PYRAMID_CASES)
def test_pyramid_leaves_eager_pytorch_with_its_logits(arch, attention, tmp_path):
    from timm.models._features_fx import create_feature_extractor

    torch.manual_seed(0)
    model, x = small_pyramid(arch, attention=attention, depths=DEPTHS).eval(), inputs(2, (64, 64))
    with torch.no_grad():
        expected = model(x)
        export_model(model, tmp_path)
        assert_logits(timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()(x), expected)
        assert_logits(torch.export.export(model, (x,)).module()(x), expected)
        torch._dynamo.reset()
        assert_logits(torch.compile(model, fullgraph=True, backend="eager")(x), expected)
        # the TorchScript exporter keeps the traced batch where a grid-bound mechanism runs in partitioned windows (the
        # Swin stages of 16 x 16 tokens here): the same batch here, another in the dynamo row below (docs/pyramids.md)
        assert_logits(onnx_logits(model, x, dynamo=False), expected)
        node = PYRAMID_FX_NODES[arch]
        got = create_feature_extractor(model, {node: "feature", "head": "logits"})(x)
        assert_logits(got["logits"], expected)


@pytest.mark.slow
@pytest.mark.parametrize("arch, attention", [("pvt_tiny", "linear"), ("pvt_v2_b0", "softmax"), ("swin_tiny", "agent")])
def test_pyramid_dynamo_onnx_export_at_another_batch(arch, attention):
    model = small_pyramid(arch, attention=attention, depths=DEPTHS).eval()
    x, other = inputs(2, (64, 64)), inputs(3, (64, 64))
    with torch.no_grad():
        assert_logits(onnx_logits(model, x, dynamo=True, run_on=other), model(other))

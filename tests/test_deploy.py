"""Leaving eager PyTorch: exporters, tracers and compilers must carry the same model."""
from __future__ import annotations

import io

import pytest
import torch

import vitzoo

ort = pytest.importorskip("onnxruntime", reason="ONNX tests need the test extras (pip install -e '.[test]')")


def _small_linear_vit():
    torch.manual_seed(0)
    return vitzoo.create_model("vit_tiny", attention="linear", img_size=32, patch_size=8, num_classes=10,
                               embed_dim=64, depth=2, num_heads=2).eval()


def test_legacy_onnx_export_of_the_fused_linear_path_is_the_eager_model():
    """The TorchScript-based exporter once froze the fused kernel's result into a wrong model (0.41 off)."""
    model = _small_linear_vit()
    x, other = torch.randn(2, 3, 32, 32), torch.randn(2, 3, 32, 32)
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, input_names=["x"], output_names=["y"])
    session = ort.InferenceSession(buf.getvalue())
    for inp in (x, other):
        got = torch.from_numpy(session.run(None, {"x": inp.numpy()})[0])
        torch.testing.assert_close(got, model(inp), atol=1e-4, rtol=0)


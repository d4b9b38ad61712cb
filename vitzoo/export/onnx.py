"""ONNX export of a hub export: ``model.onnx`` next to ``model.safetensors``.

The graph has a dynamic batch axis and the fixed image size of the export's ``input_size`` (its
training size; pass ``img_size`` for another). Every registered mechanism exports: linear attention's
fused op is recorded as its eager formula (``vitzoo.attention.functional.graph_capture``). Where
onnxruntime is installed the file is checked against eager PyTorch before it is kept.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence, Union

import torch

from .hub import load_exported

__all__ = ["ONNX_NAME", "export_onnx"]

ONNX_NAME = "model.onnx"
_CHECK_ATOL = 1e-4


def export_onnx(export_dir: Union[str, Path], img_size: Optional[Sequence[int]] = None) -> Path:
    """Write ``export_dir/model.onnx`` (input ``images`` (batch, C, H, W), output ``output``); returns its path."""
    export_dir = Path(export_dir)
    model = load_exported(export_dir).eval()
    chans, *size = model.pretrained_cfg["input_size"]
    x = torch.randn(2, chans, *(img_size or size), generator=torch.Generator().manual_seed(0))
    path = export_dir / ONNX_NAME
    torch.onnx.export(model, (x,), str(path), dynamo=True, input_names=["images"], output_names=["output"],
                      dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1)}})
    _check(path, model, x)
    return path


def _check(path: Path, model: torch.nn.Module, x: torch.Tensor) -> None:
    """onnxruntime's output vs eager at another batch size; a wrong file is removed and reported."""
    try:
        import onnxruntime as ort
    except ImportError:
        return
    x = torch.cat([x, x.flip(0)[:1]])
    with torch.no_grad():
        expected = model(x)
    got = torch.from_numpy(ort.InferenceSession(str(path)).run(None, {"images": x.numpy()})[0])
    err = (got - expected).abs().max().item()
    if not err < _CHECK_ATOL:
        path.unlink()
        raise ValueError(f"the ONNX model differs from eager PyTorch by {err:.2e} (> {_CHECK_ATOL}); nothing was "
                         "written; please report it with the model's config.json")

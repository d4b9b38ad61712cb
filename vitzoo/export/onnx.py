"""ONNX export of a hub export: ``model.onnx`` next to ``model.safetensors``.

The graph has a dynamic batch axis and the fixed image size of the export's ``input_size`` (its
training size; pass ``img_size`` for another: grid-bound mechanisms need ``interpolate: true``).
Every registered mechanism exports: linear attention's fused op is recorded as its eager formula
(``vitzoo.attention.functional.graph_capture``). The file is kept only when it is a valid ONNX model
(ONNX's checker with shape inference) and, where onnxruntime is installed, when it gives eager
PyTorch's logits; otherwise it is removed and the reason is one ValueError line. The weights are inside the file
(one self-contained ``model.onnx``) unless they exceed protobuf's 2 GiB, when ONNX keeps them beside it in
``model.onnx.data`` (both files are the model). Needs vitzoo's onnx extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn, Optional, Sequence, Union

import torch

from vitzoo.extras import require_extra

from .hub import load_exported

__all__ = ["ONNX_NAME", "export_onnx"]

ONNX_NAME = "model.onnx"
_CHECK_ATOL = 1e-4
_PROTOBUF_LIMIT = 2**31 - 2**26  # a protobuf message holds < 2 GiB: a larger model's weights go to model.onnx.data
_REPORT = "the model itself runs in PyTorch (load_exported); please report it with the export's config.json"


def export_onnx(export_dir: Union[str, Path], img_size: Optional[Sequence[int]] = None) -> Path:
    """Write ``export_dir/model.onnx`` (input ``images`` (batch, C, H, W), output ``output``); returns its path."""
    require_extra("onnx", "ONNX export")  # the exporter's onnx and onnxscript
    export_dir = Path(export_dir)
    model: Any = load_exported(export_dir).eval()  # a timm model: pretrained_cfg is timm's
    chans, *size = model.pretrained_cfg["input_size"]
    x = torch.randn(2, chans, *(img_size or size), generator=torch.Generator().manual_seed(0))
    check = torch.cat([x, x.flip(0)[:1]])  # the file runs at another batch size than it was exported with
    with torch.no_grad():
        expected = model(check)  # the model's own errors (an image size it cannot take) before the exporter's
    path = export_dir / ONNX_NAME
    _data_file(path).unlink(missing_ok=True)  # an earlier export's weights beside its graph
    try:
        torch.onnx.export(
            model,
            (x,),
            str(path),
            dynamo=True,
            input_names=["images"],
            output_names=["output"],
            dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1)}},
            external_data=_weight_bytes(model) >= _PROTOBUF_LIMIT,  # one self-contained file when it fits
        )
    except torch.onnx.OnnxExporterError as err:
        raise ValueError(
            f"torch.onnx.export could not export this model ({_first_line(err.__cause__ or err)}); {_REPORT}"
        ) from err
    _check(path, check, expected)
    return path


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))


def _check(path: Path, x: torch.Tensor, expected: torch.Tensor) -> None:
    """A valid ONNX model whose onnxruntime output on ``x`` is ``expected``; a wrong file is removed and reported."""
    import onnx

    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as err:
        _refuse(path, f"is not a valid ONNX model ({_first_line(err)})")
    try:
        import onnxruntime as ort
    except ImportError:
        return
    try:
        got = torch.from_numpy(ort.InferenceSession(str(path)).run(None, {"images": x.numpy()})[0])
    except Exception as err:  # onnxruntime's errors (Fail, InvalidGraph, ...) share no base but Exception
        _refuse(path, f"does not run in onnxruntime ({_first_line(err)})")
    diff = (got - expected).abs().max().item()
    if not diff < _CHECK_ATOL:
        _refuse(path, f"differs from eager PyTorch by {diff:.2e} (> {_CHECK_ATOL})")


def _data_file(path: Path) -> Path:
    """Where ONNX keeps the weights of a model above protobuf's limit."""
    return path.with_name(path.name + ".data")


def _refuse(path: Path, what: str) -> NoReturn:
    path.unlink()
    _data_file(path).unlink(missing_ok=True)
    raise ValueError(f"the exported file {what}; nothing was written; {_REPORT}")


def _first_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return f"{type(err).__name__}: {lines[0] if lines else ''}"

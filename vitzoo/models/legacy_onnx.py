"""An op the TorchScript ONNX exporter (``torch.onnx.export(..., dynamo=False)``) lacks, registered on import.

timm's ViT resamples its position embedding with antialiased bicubic interpolation
(``aten::_upsample_bicubic2d_aa``) at an input size other than the built one. Its ONNX form is
``Resize`` (opset 18+) with PyTorch's antialias kernel: cubic coefficient -0.5, out-of-range taps
dropped and the rest renormalised (``exclude_outside``); the dynamo exporter writes the same node.
"""

from __future__ import annotations

import torch
from torch.onnx import register_custom_op_symbolic, symbolic_helper

__all__ = ["bicubic_antialias"]

_RESIZE_ANTIALIAS_OPSET = 18  # Resize's antialias attribute


def bicubic_antialias(g, image, output_size, align_corners, scales_h=None, scales_w=None):
    """``aten::_upsample_bicubic2d_aa`` as ONNX ``Resize`` to (batch, channels, *output_size)."""
    if symbolic_helper._maybe_get_const(align_corners, "b"):
        return symbolic_helper._unimplemented("_upsample_bicubic2d_aa", "align_corners=True", image)
    size = symbolic_helper._maybe_get_const(output_size, "is")
    if symbolic_helper._is_value(size):
        size = g.op("Cast", size, to_i=symbolic_helper.cast_pytorch_to_onnx["Long"])
    else:
        size = g.op("Constant", value_t=torch.tensor(size, dtype=torch.int64))
    lead = g.op(
        "Slice",
        g.op("Shape", image),
        g.op("Constant", value_t=torch.tensor([0])),
        g.op("Constant", value_t=torch.tensor([2])),
    )
    unused = g.op("Constant", value_t=torch.tensor([], dtype=torch.float32))  # roi, scales: sizes are given
    return g.op(
        "Resize",
        image,
        unused,
        unused,
        g.op("Concat", lead, size, axis_i=0),
        mode_s="cubic",
        coordinate_transformation_mode_s="pytorch_half_pixel",
        antialias_i=1,
        cubic_coeff_a_f=-0.5,
        exclude_outside_i=1,
    )


register_custom_op_symbolic("aten::_upsample_bicubic2d_aa", bicubic_antialias, _RESIZE_ANTIALIAS_OPSET)

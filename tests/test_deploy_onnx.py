"""Both ONNX exporters carry the same model, for every registered mechanism (tests/deploy_checks.py): each file runs in
onnxruntime, at another batch size than it was exported with, and answers as eager PyTorch within 1e-4; the
export entry point (``vitzoo.export.onnx``) writes one checked, self-contained file or nothing."""

from __future__ import annotations

import pytest
import torch

import vitzoo
from vitzoo.attention import attention_options, resolve_attention
from vitzoo.export import export_model
from vitzoo.export.onnx import export_onnx

from deploy_checks import (
    BACKBONES,
    HEDGEHOG,
    RESNET_SPECS,
    ROPE_GATE,
    SIZES,
    assert_logits,
    build,
    deploy_spec,
    inputs,
    onnx_logits,
)
from deploy_checks import spec_id

ort = pytest.importorskip("onnxruntime", reason="ONNX tests need the test extras (pip install -e '.[test]')")
pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript (pip install -e '.[test]')")


def onnx_case(attention, backbone: str, dynamo: bool, size: str):
    """One row of the ONNX matrix. Unmarked (the fast run): the legacy exporter at the other size, where grids are
    resampled; the dynamo exporter (several seconds a model) and the built size are marked slow (the dynamo exporter
    at both sizes is in the fast run through export_onnx)."""
    fast = not dynamo and size != "built"
    return pytest.param(
        attention,
        backbone,
        dynamo,
        size,
        marks=() if fast else pytest.mark.slow,
        id=f"{spec_id(attention)}-{backbone}-{'dynamo' if dynamo else 'legacy'}-{size}",
    )


def resamples(spec) -> bool:
    """Whether the spec's layer has a path of its own off the built size (an ``interpolate`` option)."""
    spec = {"name": spec} if isinstance(spec, str) else spec
    return "interpolate" in attention_options(resolve_attention(spec)[0])


# The legacy exporter takes every row. The dynamo exporter (3-11 s a model) takes each layer at the other size, where
# grids are resampled, in the ViT; the built size where a layer has a path of its own there (``interpolate``); the
# non-local ResNet with RESNET_SPECS. Hedgehog's layer is linear attention's: its map is exported in the ViT (RoPE and
# the gate too).
ONNX_CASES = [
    onnx_case(attention, backbone, dynamo, size)
    for attention in [*vitzoo.list_attentions(), HEDGEHOG, *ROPE_GATE]
    for backbone in (BACKBONES if isinstance(attention, str) else ("vit",))
    for dynamo in (False, True)
    for size in SIZES
    if not dynamo
    or (backbone == "vit" and (size == "other" or resamples(attention)))
    or (backbone == "resnet" and size == "other" and attention in RESNET_SPECS)
]


@pytest.mark.parametrize("attention, backbone, dynamo, size", ONNX_CASES)
def test_onnx_exporters_in_onnxruntime(attention, backbone, dynamo, size):
    """Both exporters, at the built size and another; the model runs in onnxruntime at another batch size than it
    was exported with."""
    model = build(backbone, deploy_spec(attention, size))
    x, other = inputs(2, SIZES[size]), inputs(3, SIZES[size])
    with torch.no_grad():
        assert_logits(onnx_logits(model, x, dynamo, run_on=other), model(other))


def test_legacy_onnx_export_of_the_fused_linear_path_is_the_eager_model():
    """The TorchScript-based exporter can freeze the fused kernel's result into a constant (a model 0.41 off on
    other inputs): the export must answer as eager PyTorch on an input other than the one it traced."""
    torch.manual_seed(0)
    model = vitzoo.create_model(
        "vit_tiny", attention="linear", img_size=32, patch_size=8, num_classes=10, embed_dim=64, depth=2, num_heads=2
    ).eval()
    x, other = inputs(2), torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for inp in (x, other):
            assert_logits(onnx_logits(model, x, dynamo=False, run_on=inp), model(inp))


# the fused linear op (recorded as its formula) and a grid-bound mixture, resampled at the other size; the fast
# run exports the ViT at the other size (the harder case), the slow run also the built size and the ResNet
ENTRY_CASES = [("linear", "vit", "built")] + [
    pytest.param(
        "synth_mix",
        backbone,
        size,
        marks=() if (backbone, size) == ("vit", "other") else pytest.mark.slow,
        id=f"synth_mix-{backbone}-{size}",
    )
    for backbone in BACKBONES
    for size in SIZES
]


@pytest.mark.parametrize("attention, backbone, size", ENTRY_CASES)
def test_export_onnx_writes_model_onnx_next_to_the_hub_export(attention, backbone, size, tmp_path):
    """vitzoo.export.onnx (python -m vitzoo.export ... --onnx): dynamic batch, the export's image size or another."""
    model = build(backbone, deploy_spec(attention, size))
    export_model(model, tmp_path, data_config={"input_size": (3, 32, 32)})
    path = export_onnx(tmp_path, img_size=None if size == "built" else SIZES[size])
    assert path == tmp_path / "model.onnx"
    assert not (tmp_path / "model.onnx.data").exists()  # one self-contained file: the weights are inside it
    x = inputs(3, SIZES[size])
    got = torch.from_numpy(ort.InferenceSession(str(path)).run(None, {"images": x.numpy()})[0])
    with torch.no_grad():
        assert_logits(got, model(x))


def test_export_onnx_at_a_size_the_model_refuses_is_its_one_line_error(tmp_path):
    model = build("resnet", {"name": "synth_random", "interpolate": False})
    export_model(model, tmp_path, data_config={"input_size": (3, 32, 32)})
    with pytest.raises(ValueError, match=r"^SynthRandomAttention was built for 256 tokens .*set interpolate: true"):
        export_onnx(tmp_path, img_size=SIZES["other"])
    assert not (tmp_path / "model.onnx").exists()


def _negative_transpose(model, args, f, **kwargs):
    """An invalid file: Transpose with a negative perm entry, what the TorchScript exporter can write."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Transpose", ["images"], ["output"], perm=[0, -1, 1, 2])],
        "bad",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 32, 3, 32])],
    )
    onnx.save(helper.make_model(graph), f)


_EXPORT = torch.onnx.export  # the real exporter, under the tests that replace it


def _legacy_export(model, args, f, batch_axis: bool):
    _EXPORT(
        model,
        args,
        f,
        dynamo=False,
        input_names=["images"],
        output_names=["output"],
        dynamic_axes={"images": {0: "batch"}} if batch_axis else None,
    )


def _fixed_batch(model, args, f, **kwargs):
    """A valid file that only takes the export's batch size."""
    _legacy_export(model, args, f, batch_axis=False)


def _other_function(model, args, f, **kwargs):
    """A valid file of another function (the same network with linear attention)."""
    _legacy_export(build("vit", "linear"), args, f, batch_axis=True)


BAD_FILES = {
    "invalid": (_negative_transpose, r"is not a valid ONNX model \(.*Invalid attribute perm"),
    "fixed_batch": (_fixed_batch, "does not run in onnxruntime"),
    "other_function": (_other_function, "differs from eager PyTorch by"),
}


@pytest.mark.parametrize("write, message", BAD_FILES.values(), ids=BAD_FILES)
def test_export_onnx_removes_a_wrong_file_with_one_line(write, message, tmp_path, monkeypatch):
    """Whatever the exporter writes is checked: a file ONNX or onnxruntime refuses, or one that computes something
    else, is removed and reported in one line."""
    export_model(build("vit", "softmax"), tmp_path, data_config={"input_size": (3, 32, 32)})
    monkeypatch.setattr(torch.onnx, "export", write)
    with pytest.raises(ValueError, match=message) as err:
        export_onnx(tmp_path)
    assert "\n" not in str(err.value) and "nothing was written" in str(err.value)
    assert not (tmp_path / "model.onnx").exists()

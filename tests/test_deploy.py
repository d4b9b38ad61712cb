"""Leaving eager PyTorch: exporters and compilers carry the same model, for every registered mechanism.

Each mechanism in both backbones (a one-block ViT and the non-local ResNet with small channels, its
non-local blocks switched on) goes through both ONNX exporters (run in onnxruntime, at the built size and
at another), torch.export and torch.compile(fullgraph=True, backend="eager"); logits must match eager
PyTorch within 1e-4.
"""

from __future__ import annotations

import io

import pytest
import timm
import torch

import vitzoo
from vitzoo.attention import attention_options, resolve_attention
from vitzoo.export import export_model
from vitzoo.export.onnx import export_onnx
from vitzoo.models.nonlocal_resnet import NonLocalBlock

from mech_checks import tiny_vit
from pyramid_checks import SMALL as PYRAMIDS
from pyramid_checks import small_pyramid

ort = pytest.importorskip("onnxruntime", reason="ONNX tests need the test extras (pip install -e '.[test]')")
pytest.importorskip("onnxscript", reason="the dynamo ONNX exporter needs onnxscript (pip install -e '.[test]')")

ATOL = 1e-4
BACKBONES = ("vit", "resnet")
# every mechanism, the options that change the computation at sizes other than the training one, and the
# feature maps with parameters of their own (hedgehog)
HEDGEHOG = {"name": "linear", "feature_map": {"name": "hedgehog", "num_features": 8}}
# RoPE (rotate and decoupled forms, each variant) and the sigmoid gate, on top of every mechanism's own row
ROPE_GATE = [
    {"name": "softmax", "rope": "axial", "gate": "channel"},
    {"name": "linear", "rope": "mixed", "gate": "head"},
    {"name": "mlla", "rope": "dinov3"},
]
SPECS = [*vitzoo.list_attentions(), {"name": "hydra", "rescale": True}, HEDGEHOG, *ROPE_GATE]


def spec_id(spec) -> str:
    """A test id: the name, or the spec's values with a nested spec by its name (hydra-True, linear-hedgehog)."""
    if isinstance(spec, str):
        return spec
    return "-".join(f"{v['name'] if isinstance(v, dict) else v}" for v in spec.values())


SPEC_IDS = [spec_id(s) for s in SPECS]


def build(backbone: str, attention, depth: int = 1) -> torch.nn.Module:
    """``depth``: the ViT's blocks (2 gives window attention a shifted block)."""
    torch.manual_seed(0)
    if backbone == "vit":
        model = tiny_vit(attention, num_classes=5, depth=depth)
    else:
        model = vitzoo.create_model(
            "nonlocal_resnet18_cifar",
            attention=attention,
            channels=(8, 16, 32, 64),
            stem_width=8,
            num_classes=5,
            img_size=32,
        )
        for block in model.modules():  # a non-local block starts as the identity (zero BN scale): switch it on
            if isinstance(block, NonLocalBlock):
                torch.nn.init.ones_(block.norm.weight)
    return model.eval()


def inputs(batch: int = 2, size=(32, 32)):
    return torch.randn(batch, 3, *size, generator=torch.Generator().manual_seed(1))


def onnx_logits(model, x, dynamo: bool, run_on=None) -> torch.Tensor:
    """Export ``model`` at ``x`` with a dynamic batch axis and run it in onnxruntime on ``run_on`` (default x)."""
    buf = io.BytesIO()
    if dynamo:
        batch = torch.export.Dim("batch", min=1)
        torch.onnx.export(
            model, (x,), buf, dynamo=True, input_names=["x"], output_names=["y"], dynamic_shapes={"x": {0: batch}}
        )
    else:
        torch.onnx.export(
            model,
            (x,),
            buf,
            dynamo=False,
            input_names=["x"],
            output_names=["y"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}},
        )
    session = ort.InferenceSession(buf.getvalue())
    inp = x if run_on is None else run_on
    return torch.from_numpy(session.run(None, {"x": inp.numpy()})[0])


def assert_logits(got, expected):
    err = (got - expected).abs().max().item()
    assert err < ATOL, f"max abs logit error {err:.2e} >= {ATOL}"


SIZES = {"built": (32, 32), "other": (32, 48)}  # build() makes 32 x 32 models; "other" reshapes the token grid


def deploy_spec(attention, size: str) -> dict:
    """``attention`` as exported at ``size``: ``interpolate: true`` off the built size, where it is an option."""
    spec = {"name": attention} if isinstance(attention, str) else dict(attention)
    if size != "built" and "interpolate" in attention_options(resolve_attention(spec)[0]):
        spec["interpolate"] = True
    return spec


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


# hedgehog's layer is linear attention's in both backbones: its map is exported once, in the ViT (RoPE and the gate too)
ONNX_CASES = [
    onnx_case(attention, backbone, dynamo, size)
    for attention in vitzoo.list_attentions()
    for backbone in BACKBONES
    for dynamo in (False, True)
    for size in SIZES
] + [
    onnx_case(spec, "vit", dynamo, size)
    for spec in (HEDGEHOG, *ROPE_GATE)
    for dynamo in (False, True)
    for size in SIZES
]


@pytest.mark.parametrize("attention, backbone, dynamo, size", ONNX_CASES)
def test_onnx_exporters_in_onnxruntime(attention, backbone, dynamo, size):
    """Both exporters, at the built size and another; the model runs in onnxruntime at another batch size than it
    was exported with."""
    model = build(backbone, deploy_spec(attention, size))
    x, other = inputs(2, SIZES[size]), inputs(3, SIZES[size])
    with torch.no_grad():
        assert_logits(onnx_logits(model, x, dynamo, run_on=other), model(other))


# the ViT rows are the fast run; the non-local ResNet rows (2-3 s each) are marked slow
COMPILE_BACKBONES = ["vit", pytest.param("resnet", marks=pytest.mark.slow)]


@pytest.mark.parametrize("backbone", COMPILE_BACKBONES)
@pytest.mark.parametrize("attention", SPECS, ids=SPEC_IDS)
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


def test_torchscript_is_refused_with_one_clear_error():
    with pytest.raises(RuntimeError, match="use torch.jit.trace, torch.export or torch.onnx.export"):
        torch.jit.script(build("vit", "linear"))


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


# -- the pyramids (small shapes), the releases' mechanisms in each (PVT v1 and Swin with linear attention in the fast
# run): a hub export round trip, torch.export, torch.compile, both ONNX exporters, torch.fx features
PYRAMID_SPECS = ("linear", "softmax", "focused_linear", "agent", "inline", "pola")
FAST_PYRAMIDS = {("pvt_tiny", "linear"), ("swin_tiny", "linear")}  # PVTv2 runs timm's code as Swin does
PYRAMID_CASES = [
    pytest.param(arch, spec, marks=() if (arch, spec) in FAST_PYRAMIDS else pytest.mark.slow, id=f"{arch}-{spec}")
    for arch in sorted(PYRAMIDS)
    for spec in PYRAMID_SPECS
]
PYRAMID_FX_NODES = {"pvt_tiny": "block2.1", "pvt_v2_b0": "stages.1", "swin_tiny": "layers.1"}


@pytest.mark.parametrize("arch, attention", PYRAMID_CASES)
def test_pyramid_leaves_eager_pytorch_with_its_logits(arch, attention, tmp_path):
    from timm.models._features_fx import create_feature_extractor

    torch.manual_seed(0)
    model, x = small_pyramid(arch, attention=attention).eval(), inputs(2, (64, 64))
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
    model, x, other = small_pyramid(arch, attention=attention).eval(), inputs(2, (64, 64)), inputs(3, (64, 64))
    with torch.no_grad():
        assert_logits(onnx_logits(model, x, dynamo=True, run_on=other), model(other))

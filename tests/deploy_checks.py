"""What the deployment tests share: each mechanism built in both backbones (a one-block ViT and the non-local ResNet
with small channels, its non-local blocks switched on), the specs they run (every mechanism, hydra's rescale,
hedgehog, RoPE and the gate), the two input sizes, and the ONNX round trip through onnxruntime."""

from __future__ import annotations

import io

import torch

import vitzoo
from vitzoo.attention import attention_options, resolve_attention
from vitzoo.models.nonlocal_resnet import NonLocalBlock

from mech_checks import tiny_vit

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
# The non-local ResNet's block runs the ViT's layers on a feature map: the slower exporters (torch.export and
# torch.compile, ONNX's dynamo) take it with the layers that read the map's grid or carry the fused op.
RESNET_SPECS = ("softmax", "linear", "focused_linear", "window", "mlla")


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
    import onnxruntime as ort

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

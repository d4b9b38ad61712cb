"""Checks shared by the tests of single mechanisms (tests/test_mech_*.py): a tiny module, gradcheck, and
the mechanism inside both backbones at twice the training resolution against a float64 reference."""

import io
import math

import pytest
import torch

import vitzoo
from vitzoo.attention import ZooAttention, build_attention

from attention_reference import module_out, module_qkv


def build(spec, dim=16, num_heads=2, tokens=16, prefix=0, seed=0, grid=None, **kwargs):
    """The module for ``spec`` built for ``tokens`` tokens (``prefix`` of them before a square grid), or for ``prefix``
    tokens before the (h, w) ``grid`` when one is given (``tokens`` is then ignored)."""
    torch.manual_seed(seed)
    if grid is None:
        side = math.isqrt(tokens - prefix)
        grid = (side, side)
    else:
        tokens = prefix + grid[0] * grid[1]
    return build_attention(
        spec, dim, num_heads=num_heads, num_tokens=tokens, num_prefix_tokens=prefix, grid_size=grid, **kwargs
    )


def assert_one_line_error(spec, fix: str, dim: int, num_heads: int, grid_size=(4, 4), **kwargs) -> None:
    """Building ``spec`` (with ``kwargs``) is a ValueError matching ``fix``, in one line."""
    with pytest.raises(ValueError, match=fix) as err:
        build_attention(spec, dim, num_heads=num_heads, grid_size=grid_size, **kwargs)
    assert "\n" not in str(err.value)


def assert_bad_option(name: str, option: dict, fix: str, dim: int, num_heads: int) -> None:
    """``assert_one_line_error`` for the mechanism ``name`` with ``option``, on a 4x4 grid unless ``option`` names the
    build's ``grid_size`` (None: built without one), which the backbone supplies, not the spec."""
    option = dict(option)
    grid = option.pop("grid_size", (4, 4))
    assert_one_line_error({"name": name, **option}, fix, dim, num_heads, grid)


def gradcheck_module(m, x, fast_mode: bool = False) -> bool:
    """torch.autograd.gradcheck of ``m`` (float64) in its input and every parameter."""
    names = [n for n, _ in m.named_parameters()]
    return torch.autograd.gradcheck(
        lambda x, *p: torch.func.functional_call(m, dict(zip(names, p)), (x,)),
        (x.requires_grad_(), *m.parameters()),
        fast_mode=fast_mode,
    )


def tiny_vit(spec, **kwargs):
    """A ViT of ``spec`` at 32 px, patch 8 (a 4x4 grid + class token), 32 wide, one block, two heads, three classes;
    ``kwargs`` override those or pass on to ``vitzoo.create_model``."""
    options = dict(img_size=32, patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    return vitzoo.create_model("vit_tiny", attention=spec, **{**options, **kwargs})


def backbones(spec, **vit_kwargs):
    """The ViT (``tiny_vit``, with ``vit_kwargs``) and the CIFAR non-local ResNet, built with ``spec``."""
    torch.manual_seed(0)
    vit = tiny_vit(spec, **vit_kwargs)
    resnet = vitzoo.create_model(
        "nonlocal_resnet18_cifar", attention=spec, channels=(8, 16, 16, 16), stem_width=8, num_classes=3
    )
    return {"vit": vit, "resnet": resnet}


def backward_at_both_resolutions(spec):
    """Each backbone built with ``spec``: a forward (finite logits of the right shape) and a backward at its
    32 px build size and at 64 px; yields the model after each backward, its gradients in place."""
    for model in backbones(spec).values():
        for px in (32, 64):
            model.zero_grad()
            out = model(torch.randn(2, 3, px, px))
            assert out.shape == (2, model.num_classes) and torch.isfinite(out).all()
            out.square().mean().backward()
            yield model


def attention_layers(model):
    """Every zoo attention layer of ``model``."""
    return [m for m in model.modules() if isinstance(m, ZooAttention)]


def attention_io(model, images):
    """[(layer, its input, its output)] of every attention layer as ``model`` (3 classes) runs ``images`` without
    gradients; the logits must be finite and every layer must run."""
    layers, seen = attention_layers(model), []
    hooks = [m.register_forward_hook(lambda m, args, out: seen.append((m, args[0], out))) for m in layers]
    try:
        with torch.no_grad():
            logits = model(images)
    finally:
        for h in hooks:
            h.remove()
    assert logits.shape == (len(images), 3) and torch.isfinite(logits).all()
    assert len(seen) == len(layers) > 0
    return seen


def check_double_resolution(spec, reference, prepare=None):
    """Both backbones on 64 px inputs (twice their 32 px build): every attention layer sees the doubled grid
    and its output is ``module_out(reference(layer, q, k, v))`` on its recorded input (float64). ``prepare``,
    if given, is called on each attention layer first (to set parameters that start at 0, say)."""
    for name, model in backbones(spec).items():
        model = model.double().eval()
        for layer in attention_layers(model) if prepare is not None else ():
            prepare(layer)
        for layer, x, out in attention_io(model, torch.randn(2, 3, 64, 64, dtype=torch.float64)):
            built = layer.grid_size
            assert layer.token_grid == (2 * built[0], 2 * built[1]), name
            expected = module_out(layer, reference(layer, *module_qkv(layer, x)))
            torch.testing.assert_close(out, expected, rtol=1e-7, atol=1e-9, msg=name)


def check_onnx_at_another_size(spec, prepare):
    """A one-block ViT with ``spec`` (``prepare`` called on its attention layer, to set parameters that start at 0),
    exported by the legacy ONNX exporter at 32 x 48 px (another grid than its 32 x 32 build): onnxruntime gives its
    eager logits."""
    ort = pytest.importorskip("onnxruntime", reason="ONNX tests need the test extras")
    torch.manual_seed(0)
    model = tiny_vit(spec, num_classes=5).eval()
    for layer in model.modules():
        if isinstance(layer, ZooAttention):
            prepare(layer)
    x = torch.randn(2, 3, 32, 48)
    buf = io.BytesIO()
    torch.onnx.export(model, (x,), buf, dynamo=False, input_names=["x"], output_names=["y"])
    got = ort.InferenceSession(buf.getvalue()).run(None, {"x": x.numpy()})[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(x), rtol=1e-4, atol=1e-4)


def check_exporters(spec):
    """A ``tiny_vit`` of ``spec`` through torch.export and the legacy ONNX exporter (onnxruntime, another batch
    size): both give its eager logits."""
    ort = pytest.importorskip("onnxruntime", reason="ONNX tests need the test extras")
    torch.manual_seed(0)
    model = tiny_vit(spec).eval()
    x, other = torch.randn(2, 3, 32, 32), torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.export.export(model, (x,)).module()(x), model(x), rtol=1e-4, atol=1e-5)
        buf = io.BytesIO()
        torch.onnx.export(model, (x,), buf, dynamo=False, input_names=["x"], dynamic_axes={"x": {0: "batch"}})
        got = ort.InferenceSession(buf.getvalue()).run(None, {"x": other.numpy()})[0]
        torch.testing.assert_close(torch.from_numpy(got), model(other), rtol=1e-4, atol=1e-5)

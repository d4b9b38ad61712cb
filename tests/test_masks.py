"""Key-padding masks on the kernel (linear) attention paths: a padded batch gives each image what it gives alone.

References are float64 and written from the formula: padded keys add nothing to S = sum_j phi(k_j)^T v_j and
z = sum_j phi(k_j). The fused paths (the chunked torch path with and without the compiled CPU kernel) run masked
features through the ``identity`` map and must equal the eager formula, gradients included.
"""

import json
import os
import subprocess
import sys

import pytest
import torch

from attention_reference import phi
from mask_checks import images, pad_tokens, symmetric, unpad
from vitzoo.attention import build_attention
from vitzoo.attention import functional as AF
from vitzoo.kernels import fused_linear_attention, naive_linear_attention, triton_available

GRIDS = [(3, 4), (2, 2), (4, 3)]


def key_mask(b, h, n, seed=0):
    keep = torch.rand(b, h, n, generator=torch.Generator().manual_seed(seed)) > 0.4
    keep[..., 0] = True  # every row keeps a key
    return keep


def masked_ref(q, k, v, feature_map, keep, eps=1e-6):
    """sum over kept keys of phi(q_i).phi(k_j) v_j / (sum over kept keys of phi(q_i).phi(k_j) + eps)."""
    sim = (phi(q, feature_map) @ phi(k, feature_map).transpose(-2, -1)) * keep[..., None, :].double()
    return (sim @ v.double()) / (sim.sum(-1, keepdim=True) + eps)


@pytest.mark.parametrize("feature_map", ["elu", "relu", "taylor", "identity"])
@pytest.mark.parametrize("use_kernel", [None, False])
def test_fused_masked_paths_match_float64_reference_with_gradients(feature_map, use_kernel):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, generator=g, dtype=torch.float64) for _ in range(3))
    if feature_map == "identity":
        q, k = q.exp(), k.exp()
    keep = key_mask(2, 1, 37)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    ref = masked_ref(q, k, v, feature_map, keep)
    fused = fused_linear_attention(q, k, v, feature_map, impl="torch", chunk=8, use_kernel=use_kernel, key_mask=keep)
    naive = naive_linear_attention(q, k, v, feature_map, key_mask=keep)
    eager = AF.linear_attention(q, k, v, feature_map, impl="eager", key_mask=keep)
    for out in (fused, naive, eager):
        torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    dout = torch.randn(ref.shape, generator=g, dtype=torch.float64)
    expected = torch.autograd.grad(ref, (q, k, v), dout)
    for got, want in zip(torch.autograd.grad(fused, (q, k, v), dout), expected):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


_TRITON_MASKED = """
import json, torch
from vitzoo.kernels import fused_linear_attention, naive_linear_attention
errors = {}
for fmap in ("elu", "taylor"):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 20, 16, generator=g).requires_grad_() for _ in range(3))
    keep = torch.rand(2, 1, 20, generator=g) > 0.4
    keep[..., 0] = True
    out = fused_linear_attention(q, k, v, fmap, impl="triton", key_mask=keep)
    ref = naive_linear_attention(q.double(), k.double(), v.double(), fmap, key_mask=keep)
    dout = torch.randn(out.shape, generator=g)
    pairs = [(out, ref)] + list(zip(torch.autograd.grad(out, (q, k, v), dout),
                                    torch.autograd.grad(ref, (q, k, v), dout.double())))
    errors[fmap] = max((a.double() - b).abs().max().item() for a, b in pairs)
print(json.dumps(errors))
"""


@pytest.mark.slow
@pytest.mark.skipif(not triton_available(), reason="triton does not import here")
def test_masked_triton_path_matches_the_float64_formula_under_the_interpreter():
    """The Triton kernels take masked features through ``identity`` (taylor's d + 1 too), gradients included."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _TRITON_MASKED], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    errors = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(errors) == {"elu", "taylor"} and max(errors.values()) < 1e-5, errors


def test_masked_fused_fp32_equals_masked_eager_and_padding_never_leaks():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 2, 50, 16, generator=g).requires_grad_() for _ in range(3))
    keep = key_mask(2, 1, 50)
    with torch.no_grad():  # padded keys with inf features: a product mask (not a select) would leak inf * 0
        pad = ~keep[:, :, :, None].expand_as(k)
        k.masked_fill_(pad, float("inf"))
        v.masked_fill_(pad, 1e30)
    fused = AF.linear_attention(q, k, v, "elu", impl="torch", key_mask=keep)
    eager = AF.linear_attention(q, k, v, "elu", impl="eager", key_mask=keep)
    assert torch.isfinite(fused).all()
    torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-6)
    dout = torch.randn(fused.shape, generator=g)
    for a, b in zip(torch.autograd.grad(fused, (q, k), dout), torch.autograd.grad(eager, (q, k), dout)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_key_padding_reads_both_timm_forms_and_refuses_the_rest():
    keys = torch.tensor([[True, True, False], [True, False, False]])[:, None, None, :]
    assert torch.equal(AF.key_padding(keys), keys[:, :, 0])
    assert torch.equal(AF.key_padding(symmetric(keys)), keys[:, :, 0])
    assert AF.key_padding(None) is None
    causal = torch.ones(3, 3, dtype=torch.bool).tril()[None, None]
    with pytest.raises(ValueError, match="differs from query to query.*attention='softmax'") as err:
        AF.key_padding(causal)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="boolean attn_mask"):
        AF.key_padding(torch.zeros(1, 1, 1, 3))


LINEAR_SPECS = [
    "linear",
    "taylor",
    {"name": "linear", "feature_map": "hedgehog"},
    "performer",
    {"name": "performer", "scale": "log_n"},
    {"name": "focused_linear", "pos_embed": False},
    "focused_linear",
    "pola",
    "efficient",
    {"name": "hydra", "rescale": True},
    "inline",
    {"name": "nystrom", "num_landmarks": 3},
    {"name": "nystrom", "num_landmarks": 3, "scale": "log_n"},
    {"name": "nystrom", "num_landmarks": 64},
    {"name": "lion", "decay": "none"},
    "mlla",
    "rala",
    {"name": "mlla", "rope": "dinov3"},
    {"name": "agent", "num_agents": 4},
    {"name": "agent", "num_agents": 4, "scale": "log_n", "bias": False},
    {"name": "window", "window_size": 2, "rel_pos": True},
    {"name": "window", "window_size": 2, "scale": "log_n"},
]


# Every mechanism that takes a key mask: the key-padding forms above, and those that take any mask (softmax and its
# eager twin, the Synthesizers, whose logits index one grid: their images are not run on their own grids).
MASK_SPECS = LINEAR_SPECS + [
    "softmax",
    {"name": "softmax", "fused": False},
    {"name": "softmax", "fused": False, "scale": "log_n"},
    "synth_dense",
    "synth_random",
    {"name": "synth_mix", "parts": ["random", "softmax"], "scale": "log_n"},
]


@pytest.mark.parametrize("spec", LINEAR_SPECS, ids=str)
@pytest.mark.parametrize("form", ["keys", "symmetric"])
def test_padded_batch_gives_each_image_what_it_gives_alone(spec, form):
    prefix, dim = 1, 16
    layer = build_attention(spec, dim, num_heads=2, num_tokens=17, num_prefix_tokens=prefix, grid_size=(4, 4))
    layer = layer.double().eval()
    with torch.no_grad():  # learned position tables start at 0: give them values, so each image's own table shows
        for name, p in layer.named_parameters():
            if "pos" in name:
                p.normal_()
    xs = images(GRIDS, prefix, dim)
    x, mask, canvas = pad_tokens(xs, GRIDS, prefix)
    layer.token_grid, layer.image_grids = canvas, tuple(GRIDS)  # as the ViT sets them (share_grid)
    out = layer(x, attn_mask=mask if form == "keys" else symmetric(mask))
    layer.image_grids = None
    for i, (grid, xi) in enumerate(zip(GRIDS, xs)):
        layer.token_grid = grid
        torch.testing.assert_close(unpad(out, i, grid, canvas, prefix), layer(xi), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("spec", MASK_SPECS, ids=str)
@pytest.mark.parametrize("form", ["keys", "symmetric"])
def test_an_image_with_no_key_gets_zero_output_and_finite_gradients(spec, form):
    """An attn_mask all False for image 1: its rows are 0 (the layer's biases set to 0, so that the attention term
    shows; the convs see its tokens as 0), everything is finite, gradients included, under a random output gradient,
    and the other images give what they give alone."""
    prefix, dim = 1, 16
    name = spec if isinstance(spec, str) else spec["name"]
    own_grids = not name.startswith("synth")
    layer = build_attention(spec, dim, num_heads=2, num_tokens=17, num_prefix_tokens=prefix, grid_size=(4, 4))
    layer = layer.double().eval()
    with torch.no_grad():
        for pname, p in layer.named_parameters():
            if pname.split(".")[-1] == "bias":
                p.zero_()
            elif "pos" in pname:
                p.normal_()
    xs = images(GRIDS, prefix, dim)
    x, mask, canvas = pad_tokens(xs, GRIDS, prefix)
    mask[1] = False
    layer.token_grid, layer.image_grids = canvas, tuple(GRIDS) if own_grids else None
    x.requires_grad_()
    mask = mask if form == "keys" else symmetric(mask)
    out = layer(x, attn_mask=mask)
    assert torch.isfinite(out).all()
    assert (out[1] == 0).all()
    params = [p for p in layer.parameters() if p.requires_grad]
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
    grads = torch.autograd.grad(out, [x, *params], dout, allow_unused=True)
    assert all(g is None or torch.isfinite(g).all() for g in grads)
    assert (grads[0][1] == 0).all()
    with torch.no_grad():
        for i in (0, 2):
            if own_grids:
                layer.token_grid, layer.image_grids = GRIDS[i], None
                alone, got = layer(xs[i]), unpad(out, i, GRIDS[i], canvas, prefix)
            else:
                alone, got = layer(x[i : i + 1], attn_mask=mask[i : i + 1]), out[i : i + 1]
            torch.testing.assert_close(got, alone, rtol=1e-10, atol=1e-12)


def test_masked_probs_put_no_weight_on_padded_keys():
    layer = build_attention("linear", 16, num_heads=2).double()
    xs = images(GRIDS, 0, 16)
    x, mask, _ = pad_tokens(xs, GRIDS, 0)
    q, k, _ = layer.project(x)
    rows = layer.probs(x, q, k, mask, False, torch.arange(x.shape[1]))
    assert (rows.masked_select(~mask) == 0).all()
    torch.testing.assert_close(rows.sum(-1), torch.ones_like(rows[..., 0]), rtol=1e-5, atol=0)


@pytest.mark.parametrize("spec", MASK_SPECS, ids=str)
def test_probs_of_an_image_with_no_key_are_zero_rows(spec):
    """The implied attention matrix (diagnostics, transfer) of an image whose keys are all masked: zero rows, not
    NaN; the other images put no weight on their padded keys."""
    prefix, dim = 1, 16
    name = spec if isinstance(spec, str) else spec["name"]
    layer = build_attention(spec, dim, num_heads=2, num_tokens=17, num_prefix_tokens=prefix, grid_size=(4, 4))
    layer = layer.double().eval()
    x, mask, canvas = pad_tokens(images(GRIDS, prefix, dim), GRIDS, prefix)
    mask[1] = False
    layer.token_grid, layer.image_grids = canvas, None if name.startswith("synth") else tuple(GRIDS)
    with torch.no_grad():
        q, k, _ = layer.project(x)
        rows = layer.probs(x, q, k, mask, False, torch.arange(x.shape[1]))
    assert torch.isfinite(rows).all()
    assert (rows[1] == 0).all()
    assert (rows.masked_select(~mask.expand_as(rows)) == 0).all()


def test_lion_with_a_decay_refuses_a_mask_in_one_line():
    layer = build_attention({"name": "lion", "decay": "fixed"}, 16, num_heads=2, grid_size=(2, 2))
    with pytest.raises(ValueError, match="takes no attn_mask: with decay=fixed.*or decay: none") as err:
        layer(torch.randn(1, 4, 16), attn_mask=torch.ones(1, 1, 1, 4, dtype=torch.bool))
    assert "\n" not in str(err.value)


def test_linear_refuses_a_query_dependent_mask_in_one_line():
    layer = build_attention("linear", 16, num_heads=2)
    mask = torch.ones(5, 5, dtype=torch.bool).tril()[None, None]
    with pytest.raises(ValueError, match="differs from query to query") as err:
        layer(torch.randn(1, 5, 16), attn_mask=mask)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["linear", "softmax"])
@pytest.mark.parametrize("shape", [(2, 1, 1, 4), (3, 1, 1, 5), (2, 5), (2, 1, 5, 4)])
def test_a_mask_that_does_not_fit_the_tokens_is_one_line(name, shape):
    """A mask for other tokens or images, or a (B, N) one (SDPA would read its B rows as queries), is refused
    before any mechanism reads it."""
    layer = build_attention(name, 16, num_heads=2)
    with pytest.raises(ValueError, match="does not broadcast to .* \\(B, 1, 1, N\\) key padding") as err:
        layer(torch.randn(2, 5, 16), attn_mask=torch.ones(shape, dtype=torch.bool))
    assert "\n" not in str(err.value)


class Masked(torch.nn.Module):
    """A layer called with an attn_mask, as exporters take it (x and the mask as inputs)."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, x, mask):
        return self.layer(x, attn_mask=mask)


def test_torch_export_of_a_masked_linear_forward_matches_eager():
    layer = build_attention("linear", 16, num_heads=2).eval()
    xs = [t.float() for t in images(GRIDS, 0, 16)]
    x, mask, _ = pad_tokens(xs, GRIDS, 0)
    program = torch.export.export(Masked(layer), (x, mask))
    torch.testing.assert_close(program.module()(x, mask), layer(x, attn_mask=mask), rtol=1e-6, atol=1e-6)
    flipped = mask.clone()
    flipped[0, ..., 3] = False  # another mask through the same program
    torch.testing.assert_close(program.module()(x, flipped), layer(x, attn_mask=flipped), rtol=1e-6, atol=1e-6)


def test_onnx_export_of_a_masked_linear_forward_matches_eager():
    """The TorchScript exporter records the eager formula with the masked features; onnxruntime runs it."""
    ort = pytest.importorskip("onnxruntime")
    import io

    layer = build_attention("linear", 16, num_heads=2).eval()
    x, mask, _ = pad_tokens([t.float() for t in images(GRIDS, 0, 16)], GRIDS, 0)
    buf = io.BytesIO()
    torch.onnx.export(Masked(layer), (x, mask), buf, dynamo=False, input_names=["x", "mask"], output_names=["y"])
    session = ort.InferenceSession(buf.getvalue())
    for m in (mask, mask.roll(1, dims=0)):
        got = session.run(None, {"x": x.numpy(), "mask": m.numpy()})[0]
        with torch.no_grad():
            torch.testing.assert_close(torch.from_numpy(got), layer(x, attn_mask=m), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "linear", "feature_map": "hedgehog"},
        "linear",
        "taylor",
        "performer",
        "focused_linear",
        {"name": "linear", "rope": "axial"},
        "inline",
        "pola",
        {"name": "lion", "decay": "none"},
        "softmax",
    ],
    ids=str,
)
@pytest.mark.parametrize("empty", [False, True], ids=["", "an-image-with-no-key"])
def test_masked_mechanisms_fused_equal_eager_with_gradients(spec, empty):
    """The fused path (impl: torch; softmax: SDPA) and the eager formula (impl: eager; fused: false) under one mask,
    fp32, also with an image whose keys are all masked (0 on both)."""
    name, options = (
        (spec, {}) if isinstance(spec, str) else (spec["name"], {k: v for k, v in spec.items() if k != "name"})
    )
    twins = [{"fused": True}, {"fused": False}] if name == "softmax" else [{"impl": "torch"}, {"impl": "eager"}]
    layers = [
        build_attention(
            {"name": name, **options, **twin},
            16,
            num_heads=2,
            num_tokens=17,
            num_prefix_tokens=1,
            grid_size=(4, 4),
        )
        for twin in twins
    ]
    layers[1].load_state_dict(layers[0].state_dict())
    x, mask, canvas = pad_tokens([t.float() for t in images(GRIDS, 1, 16)], GRIDS, 1)
    if empty:
        mask[1] = False
    outs, grads = [], []
    for layer in layers:
        layer.token_grid = canvas
        xi = x.clone().requires_grad_()
        out = layer(xi, attn_mask=mask)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), xi)[0])
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-4)
    assert all(torch.isfinite(t).all() for t in outs + grads)


@pytest.mark.parametrize("feature_map", ["elu", "relu", "taylor", "identity"])
@pytest.mark.parametrize("use_kernel", [None, False])
def test_fused_paths_give_a_row_with_no_key_zero_with_finite_gradients(feature_map, use_kernel):
    """A (batch, head) whose keys are all masked: 0 on the fused paths (the CPU kernel, the torch ops) as on the
    naive formula (0 / eps), gradients finite and equal."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 2, 13, 8, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    keep = key_mask(2, 1, 13)
    keep[1] = False
    fused = fused_linear_attention(q, k, v, feature_map, impl="torch", chunk=4, use_kernel=use_kernel, key_mask=keep)
    naive = naive_linear_attention(q, k, v, feature_map, key_mask=keep)
    assert (fused[1] == 0).all() and (naive[1] == 0).all()
    torch.testing.assert_close(fused, naive, rtol=1e-10, atol=1e-12)
    dout = torch.randn(fused.shape, generator=g, dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(fused, (q, k, v), dout), torch.autograd.grad(naive, (q, k, v), dout)):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_a_bad_key_mask_is_one_line_naming_the_form():
    q = torch.randn(2, 2, 5, 4)
    with pytest.raises(ValueError, match="bool \\(B or 1, H or 1, Nk\\)") as err:
        fused_linear_attention(q, q, q, key_mask=torch.ones(2, 5))
    assert "\n" not in str(err.value)


def test_compiled_masked_linear_forward_and_backward_match_eager():
    """torch.compile (fullgraph, aot_eager: forward and backward graphs) of a masked linear layer gives eager's
    output and gradients; the fused op stays one op with the mask's features through it."""
    layer = build_attention("linear", 16, num_heads=2)
    x, mask, _ = pad_tokens([t.float() for t in images(GRIDS, 0, 16)], GRIDS, 0)
    compiled = torch.compile(Masked(layer), fullgraph=True, backend="aot_eager")
    outs, grads = [], []
    for fn in (compiled, Masked(layer)):
        xi = x.clone().requires_grad_()
        out = fn(xi, mask)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), [xi, *layer.parameters()]))
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

"""2-D RoPE (``rope: axial | mixed | dinov3``): the angle tables against timm's and against float64 formulas, the
rotate form (softmax family: scores depend only on offsets) and the decoupled form (kernel forms: a float64 O(n^2)
reference, the O(n) path against its eager twin with gradients), prefix tokens unrotated, every mechanism taking
RoPE or refusing it in one line, and new resolutions without resampling."""

import math

import pytest
import torch
from timm.layers.pos_embed_sincos import RotaryEmbeddingCat, RotaryEmbeddingDinoV3, RotaryEmbeddingMixed

from vitzoo.attention import SoftmaxAttention, list_attentions
from vitzoo.attention import lion
from vitzoo.attention.base import ROPE_FORMS
from vitzoo.attention.decoupled import decoupled_attention, decoupled_attention_eager
from vitzoo.attention.rope import build_rope, rotate_all

from attention_reference import module_out, module_qkv, phi, softmax_ref
from mech_checks import build, tiny_vit
from recent_checks import gated_out, rotate_complex

D, H = 8, 2  # head_dim, heads
GRIDS = [(3, 5), (4, 4)]


def interleaved(angles):
    """(..., d/2) -> (sin, cos) in timm's interleaved (..., d) layout."""
    return angles.sin().repeat_interleave(2, -1), angles.cos().repeat_interleave(2, -1)


def assert_table(angles, timm_embed, atol=2e-5):
    sin, cos = timm_embed.chunk(2, -1)
    got_sin, got_cos = interleaved(angles)
    assert torch.allclose(got_sin, sin, atol=atol) and torch.allclose(got_cos, cos, atol=atol)


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("indexing", ["ij", "xy"])
@pytest.mark.parametrize("base, offset, ref", [(10000.0, 0.0, None), (100.0, 1.0, None), (10000.0, 0.0, (4, 4))])
def test_axial_table_is_timms_rotary_embedding_cat(grid, indexing, base, offset, ref):
    rope = build_rope({"name": "axial", "base": base, "indexing": indexing, "offset": offset, "ref_grid": ref}, D, H)
    timm_rope = RotaryEmbeddingCat(
        D, temperature=base, in_pixels=False, grid_indexing=indexing, grid_offset=offset, ref_feat_shape=ref
    )
    assert_table(rope.angles(grid, 0, torch.zeros(())), timm_rope.get_embed(list(grid)))


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("indexing", ["ij", "xy"])
def test_mixed_table_and_init_are_timms_rotary_embedding_mixed(grid, indexing):
    torch.manual_seed(3)
    timm_rope = RotaryEmbeddingMixed(H * D, depth=1, num_heads=H, temperature=10.0, grid_indexing=indexing)
    torch.manual_seed(3)
    rope = build_rope({"name": "mixed", "indexing": indexing}, D, H)
    assert torch.allclose(rope.freqs, timm_rope.freqs[:, 0])  # the same initial frequencies from the same draw
    assert_table(rope.angles(grid, 0, torch.zeros(())), timm_rope.get_embed(list(grid))[0].detach())


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("normalize", ["separate", "min", "max"])
@pytest.mark.parametrize("indexing, offset", [("ij", 0.0), ("xy", 0.25)])
def test_dinov3_table_is_timms_rotary_embedding_dinov3(grid, normalize, indexing, offset):
    opts = {"name": "dinov3", "normalize": normalize, "indexing": indexing, "offset": offset}
    rope = build_rope(opts, D, H)
    timm_rope = RotaryEmbeddingDinoV3(
        D, temperature=100.0, normalize_coords=normalize, grid_indexing=indexing, grid_offset=offset, rotate_half=False
    )
    assert_table(rope.angles(grid, 0, torch.zeros(())), timm_rope.get_embed(list(grid)))


def formula_table(name, grid, freqs=None, base=None, ref=None):
    """theta (H or 1, h*w, d/2) in float64 straight from docs/mechanisms.md section 20 ('ij' indexing)."""
    h, w = grid
    out = torch.zeros(H if name == "mixed" else 1, h * w, D // 2, dtype=torch.float64)
    for n in range(h * w):
        t = [float(n // w), float(n % w)]
        if name == "axial" and ref is not None:
            t = [t[0] * ref[0] / h, t[1] * ref[1] / w]
        if name == "dinov3":
            t = [2 * (t[0] + 0.5) / h - 1, 2 * (t[1] + 0.5) / w - 1]
        for m in range(D // 2):
            axis, band = divmod(m, D // 4)
            if name == "axial":
                out[0, n, m] = t[axis] * base ** (-band / (D / 4))
            elif name == "dinov3":
                out[0, n, m] = 2 * math.pi * t[axis] / base ** (4 * band / D)
            else:
                out[:, n, m] = t[0] * freqs[0, :, m] + t[1] * freqs[1, :, m]
    return out


@pytest.mark.parametrize("spec", [{"name": "axial", "base": 100.0, "ref_grid": (6, 2)}, "mixed", "dinov3"])
def test_tables_match_float64_formulas_with_prefix_rows_zero(spec):
    rope = build_rope(spec, D, H).double()
    name, grid = rope.name, (3, 4)
    want = formula_table(name, grid, rope.freqs, rope.base, rope.ref_grid)
    got = rope.angles(grid, 2, torch.zeros((), dtype=torch.float64))
    assert got.dtype == torch.float64 and got.shape[-2:] == (2 + 12, D // 2)
    assert torch.equal(got[:, :2], torch.zeros_like(got[:, :2]))  # prefix tokens: no rotation
    assert torch.allclose(got[:, 2:], want, rtol=0, atol=1e-12)


def test_per_image_positions_give_each_images_table():
    """The batched form: positions of two grids padded into (B, n, 2) give each image's own table."""
    rope = build_rope("dinov3", D, H)
    like = torch.zeros(())
    a, b = rope.positions((2, 3), like), rope.positions((3, 3), like)
    batch = torch.stack([torch.cat([a, a.new_zeros(3, 2)]), b])
    table = rope.angles_from(batch)
    assert table.shape == (2, 1, 9, D // 2)
    assert torch.equal(table[0, :, :6], rope.angles((2, 3), 0, like))
    assert torch.equal(table[1], rope.angles((3, 3), 0, like))


def test_rotate_is_the_complex_rotation_and_keeps_dtype():
    x, angles = torch.randn(2, H, 5, D, dtype=torch.float64), torch.randn(H, 5, D // 2, dtype=torch.float64)
    k = torch.randn_like(x)
    turned = rotate_all(angles, x, k)
    assert all(torch.allclose(t, rotate_complex(y, angles), atol=1e-12) for t, y in zip(turned, (x, k)))
    assert rotate_all(angles.float(), x.half())[0].dtype == torch.half


@pytest.mark.parametrize("spec", ["axial", "mixed", "dinov3"])
def test_rotated_scores_depend_only_on_the_offset(spec):
    """Shift test: with the same q and k at every position, (R_i q).(R_j k) is a function of p_j - p_i alone."""
    rope = build_rope(spec, D, H).double()
    grid = (4, 5)
    angles = rope.angles(grid, 0, torch.zeros((), dtype=torch.float64))
    q, k = torch.randn(1, H, 1, D, dtype=torch.float64), torch.randn(1, H, 1, D, dtype=torch.float64)
    n = grid[0] * grid[1]
    rq, rk = rotate_all(angles, q.expand(1, H, n, D), k.expand(1, H, n, D))
    scores = rq @ rk.transpose(-2, -1)
    seen = {}
    for i in range(n):
        for j in range(n):
            offset = (j // grid[1] - i // grid[1], j % grid[1] - i % grid[1])
            ref = seen.setdefault(offset, scores[0, :, i, j])
            assert torch.allclose(scores[0, :, i, j], ref, atol=1e-10)
    assert len(seen) == (2 * grid[0] - 1) * (2 * grid[1] - 1)


@pytest.mark.parametrize("rope", ["axial", "mixed", "dinov3"])
def test_softmax_with_rope_is_the_float64_reference(rope):
    layer = build({"name": "softmax", "rope": rope}, dim=16, num_heads=H, tokens=17, prefix=1).double()
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    q, k, v = module_qkv(layer, x)
    angles = layer.rope.angles((4, 4), 1, x)
    want = module_out(layer, softmax_ref(rotate_complex(q, angles), rotate_complex(k, angles), v)[0])
    assert torch.allclose(layer(x), want, atol=1e-10)
    # the class token's q and k are not turned: its scores with itself are the plain ones
    assert torch.allclose(rotate_complex(q, angles)[:, :, 0], q[:, :, 0])


def decoupled_ref(fq, fk, v, angles, eps):
    """o_i = sum_j (R_i fq_i).(R_j fk_j) v_j / (fq_i . sum_j fk_j + n eps), in float64 through the n x n matrix."""
    num = rotate_complex(fq, angles) @ rotate_complex(fk, angles).transpose(-2, -1)
    den = fq.double() @ fk.double().sum(-2).unsqueeze(-1) + fk.shape[-2] * eps
    return (num / den) @ v.double()


@pytest.mark.parametrize("spec", ["linear", {"name": "linear", "feature_map": "relu"}, "focused_linear"])
def test_kernel_forms_take_decoupled_rope_as_the_float64_reference(spec):
    spec = {"name": spec} if isinstance(spec, str) else dict(spec)
    layer = build({**spec, "rope": "axial"}, dim=16, num_heads=H, tokens=17, prefix=1).double()
    assert layer.rope_form == "decoupled"
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    q, k, v = module_qkv(layer, x)
    fq, fk, name = layer.features(q, k)
    heads = decoupled_ref(phi(fq, name), phi(fk, name), v, layer.rope.angles((4, 4), 1, x), layer.eps)
    if spec["name"] == "focused_linear":
        heads = heads + layer.dwc.over_grid(v, (4, 4), 1)
    assert torch.allclose(layer(x), module_out(layer, heads), atol=1e-10)


def test_efficient_takes_decoupled_rope_as_the_float64_reference():
    """o_i = sum_j (R_i softmax_D(q_i)).(R_j softmax_N(k)_j) v_j: its plain normaliser is 1."""
    layer = build({"name": "efficient", "rope": "mixed"}, dim=16, num_heads=H, tokens=17, prefix=1).double()
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    q, k, v = module_qkv(layer, x)
    qs, ks = q.softmax(dim=-1), k.softmax(dim=-2)
    angles = layer.rope.angles((4, 4), 1, x)
    heads = (rotate_complex(qs, angles) @ rotate_complex(ks, angles).transpose(-2, -1)) @ v
    assert torch.allclose(layer(x), module_out(layer, heads), atol=1e-10)


def test_pola_takes_decoupled_rope_on_both_polarity_halves():
    """Each stream: sum_j (R_i f_i).(R_j phi(k_j)) v_j / n over (f_i . sum_j phi(k_j) / n + eps), R turning the
    positive and the negative half of the 2d features by the same table; then pola's linear gate and projection."""
    layer = build({"name": "pola", "rope": "axial", "kernel_size": 0}, dim=16, num_heads=H, tokens=17, prefix=1)
    layer = layer.double()
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    q, k, v = module_qkv(layer, x)
    fs, fo, fk = layer.features(q, k)
    angles = layer.rope.angles((4, 4), 1, x)
    table = torch.cat([angles, angles], dim=-1)
    heads = []
    for f, values in ((fs, v[..., : D // 2]), (fo, v[..., D // 2 :])):
        num = rotate_complex(f, table) @ rotate_complex(fk, table).transpose(-2, -1) / 17
        heads.append((num @ values) / (f @ fk.sum(-2).unsqueeze(-1) / 17 + layer.eps))
    assert torch.allclose(layer(x), gated_out(layer, x, torch.cat(heads, dim=-1)), atol=1e-10)


@pytest.mark.parametrize(
    "options", [{"decay": "fixed"}, {"decay": "selective", "order": "snake"}, {"decay": "none"}], ids=str
)
def test_lion_takes_decoupled_rope_in_its_scans(options):
    """o_i = sum_j M_ij (R_i f_i).(R_j g_j) v_j / (sum_j M_ij f_i.g_j + eps sqrt(d)), M LION's decay mask (1 for
    decay none), through the chunked scans (chunks of 4) against the float64 formula."""
    spec = {"name": "lion", "rope": "mixed", "chunk": 4, **options}
    layer = build(spec, dim=16, num_heads=H, tokens=17, prefix=1, qkv_bias=True).double()
    x = torch.randn(2, 17, 16, dtype=torch.float64)
    q, k, v = module_qkv(layer, x)
    fq, fk = layer.features(q, k)
    everyone = torch.arange(17)
    if options["decay"] == "none":
        mask = torch.ones(17, 17, dtype=torch.float64)
    elif options.get("order") == "snake":
        mask = lion.snake_mask(layer._snake_gates(x, fq), layer._orders(x), everyone)
    else:
        mask = lion.decay_mask(layer.log_gates(x, fq), everyone)
    angles = layer.rope.angles((4, 4), 1, x)
    num = (rotate_complex(fq, angles) @ rotate_complex(fk, angles).transpose(-2, -1)) * mask
    den = ((fq @ fk.transpose(-2, -1)) * mask).sum(-1, keepdim=True) + layer.eps * D**0.5
    assert torch.allclose(layer(x), module_out(layer, (num @ v) / den), atol=1e-10)


def test_decoupled_o_n_path_equals_its_eager_twin_with_gradients():
    g = torch.Generator().manual_seed(0)
    fq, fk = (torch.rand(2, H, 13, D, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    v = torch.randn(2, H, 13, D, generator=g, dtype=torch.float64, requires_grad=True)
    angles = build_rope("mixed", D, H).double().angles((3, 4), 1, v)
    fused, eager = decoupled_attention(fq, fk, angles, v), decoupled_attention_eager(fq, fk, angles, v)
    assert torch.allclose(fused, eager, atol=1e-12)
    assert torch.allclose(fused, decoupled_ref(fq, fk, v, angles, 1e-6), atol=1e-12)
    w = torch.randn_like(fused)
    grads = [torch.autograd.grad((out * w).sum(), (fq, fk, v)) for out in (fused, eager)]
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-10)


def test_linear_layer_auto_and_eager_impls_agree_with_gradients():
    x = torch.randn(2, 17, 16)
    layers = [
        build({"name": "linear", "rope": "mixed", "impl": impl}, tokens=17, prefix=1) for impl in ("auto", "eager")
    ]
    layers[1].load_state_dict(layers[0].state_dict())
    outs = [m(x) for m in layers]
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    for out in outs:
        out.square().sum().backward()
    assert torch.allclose(layers[0].rope.freqs.grad, layers[1].rope.freqs.grad, atol=1e-4)
    assert layers[0].rope.freqs.grad.abs().sum() > 0  # mixed frequencies learn


def test_mlla_and_rala_take_the_rope_option_in_place_of_their_own_table():
    for name in ("mlla", "rala"):
        layer = build({"name": name, "rope": "dinov3"}, dim=16, num_heads=H, tokens=16)
        fq = torch.rand(1, H, 16, D)
        assert torch.equal(layer.angles(fq), layer.rope.angles((4, 4), 0, fq))
        own = build(name, dim=16, num_heads=H, tokens=16)
        assert torch.equal(own.angles(fq), own.own_angles((4, 4), fq))


def test_every_mechanism_takes_rope_or_refuses_it_in_one_line():
    for name in list_attentions():
        try:
            layer = build({"name": name, "rope": "axial"}, dim=16, num_heads=H, tokens=17, prefix=1)
        except ValueError as err:
            assert "takes no rope: " in str(err) and "\n" not in str(err), name
            assert type(build(name, dim=16, num_heads=H, tokens=17, prefix=1)).no_rope, name
            continue
        assert layer.no_rope is None and layer.rope_form in ROPE_FORMS, name
        assert layer(torch.randn(1, 17, 16)).shape == (1, 17, 16)
    with pytest.raises(ValueError, match="softmax part only"):  # its softmax part has q and k: the reason is another
        build({"name": "synth_mix", "parts": ["random", "softmax"], "rope": "axial"}, dim=16, num_heads=H, tokens=16)


@pytest.mark.parametrize(
    "spec, fix",
    [
        ("spiral", "choose one of"),
        ({"name": "axial", "temperature": 5}, "valid options"),
        ({"name": "mixed", "ref_grid": (4, 4)}, "valid options"),
        ({"name": "axial", "indexing": "yx"}, "indexing"),
        ({"name": "dinov3", "normalize": "mean"}, "normalize"),
        ({"name": "axial", "base": 0}, "base"),
        ({"name": "axial", "base": "100"}, "base must be a number"),
        ({"name": "axial", "offset": "a"}, "offset must be a finite number"),
        ({"name": "axial", "ref_grid": 4}, "ref_grid must be a grid"),
        ({"name": "axial", "ref_grid": (4.5, 4)}, "positive integers"),
        ({"base": 100}, "has no 'name'"),
    ],
)
def test_bad_rope_specs_are_one_line_errors(spec, fix):
    with pytest.raises(ValueError, match=fix) as err:
        build({"name": "softmax", "rope": spec}, dim=16, num_heads=H, tokens=16)
    assert "\n" not in str(err.value)


def test_rope_needs_a_head_dim_divisible_by_4_and_head_wide_features():
    with pytest.raises(ValueError, match="multiple of 4"):
        build({"name": "softmax", "rope": "axial"}, dim=12, num_heads=2, tokens=16)
    with pytest.raises(ValueError, match="num_features"):
        build({"name": "linear", "rope": "axial", "feature_map": {"name": "hedgehog", "num_features": 2}}, tokens=16)
    with pytest.raises(ValueError, match="no causal form yet"):
        build({"name": "linear", "rope": "axial", "causal": True}, tokens=16)


def test_rope_mixed_frequencies_are_one_parameter_per_block_and_head():
    model = tiny_vit({"name": "softmax", "rope": "mixed"}, depth=2)
    freqs = [block.attn.rope.freqs for block in model.blocks]
    assert all(isinstance(f, torch.nn.Parameter) and f.shape == (2, 2, 8) for f in freqs)
    assert not torch.equal(freqs[0], freqs[1])  # each block draws its own directions


@pytest.mark.parametrize("spec", [{"name": "softmax", "rope": "axial"}, {"name": "linear", "rope": "dinov3"}])
def test_larger_inputs_run_without_resampling(spec):
    """1.5x and 2x the build resolution: the tables follow the input's grid; nothing is resampled."""
    torch.manual_seed(0)
    model = tiny_vit(spec, pos_embed="none").eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for size in (48, 64):
        assert torch.isfinite(model(torch.randn(2, 3, size, size))).all()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    table = model.blocks[0].attn.rope_angles(1 + 64, torch.zeros(()))
    assert table.shape[-2] == 1 + 64  # the 8 x 8 grid of the 64 px input


def test_rope_is_none_by_default():
    layer = build("softmax", tokens=16)
    assert layer.rope is None and layer.out_gate is None


def test_decoupled_under_key_padding_gives_each_image_what_it_gives_alone():
    """Padded keys' features zeroed and n counted per image: the real rows are the unpadded image's, both paths."""
    g = torch.Generator().manual_seed(2)
    fq, fk = (torch.rand(1, H, 9, D, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(1, H, 9, D, generator=g, dtype=torch.float64)
    angles = build_rope("axial", D, H).double().angles((2, 3), 1, v)  # 7 real tokens, 2 padded
    keep = torch.tensor([True] * 7 + [False] * 2)
    alone = decoupled_attention(fq[:, :, :7], fk[:, :, :7], angles[:, :7], v[:, :, :7])
    masked = fk * keep[:, None]
    for path in (decoupled_attention, decoupled_attention_eager):
        padded = path(fq, masked, torch.cat([angles, angles[:, :2]], dim=1), v, num_keys=7)
        assert torch.allclose(padded[:, :, :7], alone, atol=1e-12)


@pytest.mark.parametrize("layer_decay", [None, 0.75])
def test_mixed_frequencies_get_no_weight_decay(layer_decay):
    from vitzoo.training.optim import build_optimizer

    model = tiny_vit({"name": "softmax", "rope": "mixed"}, depth=2)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = build_optimizer(model, 1e-3, 0.05, layer_decay=layer_decay).param_groups
    decay = {names[id(p)] for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decay and not any(".rope." in name for name in decay)


def test_softmax_with_rope_fused_equals_eager_with_gradients():
    x = torch.randn(2, 17, 16)
    layers = [build({"name": "softmax", "rope": "mixed", "fused": f}, tokens=17, prefix=1) for f in (True, False)]
    layers[1].load_state_dict(layers[0].state_dict())
    outs = [m(x) for m in layers]
    assert torch.allclose(outs[0], outs[1], atol=1e-6)
    for out in outs:
        out.square().sum().backward()
    for a, b in zip(*(dict(m.named_parameters()).values() for m in layers)):
        assert torch.allclose(a.grad, b.grad, atol=1e-5)


def test_a_mechanism_declaring_no_rope_form_fails_loudly_instead_of_ignoring_rope():
    class Undeclared(SoftmaxAttention):
        rope_form = None

    layer = Undeclared(16, num_heads=H, rope="axial", num_tokens=16, grid_size=(4, 4))
    with pytest.raises(TypeError, match="has a rope but no rope_form"):
        layer(torch.randn(1, 16, 16))


def test_lion_scans_with_rope_equal_the_quadratic_form_with_gradients():
    g = torch.Generator().manual_seed(4)
    fq, fk = (torch.rand(1, H, 13, D, generator=g, dtype=torch.float64).requires_grad_() for _ in range(2))
    v = torch.randn(1, H, 13, D, generator=g, dtype=torch.float64, requires_grad=True)
    gates = (torch.rand(1, H, 13, generator=g, dtype=torch.float64) * 0.9 + 0.05).log()
    angles = build_rope("axial", D, H).double().angles((3, 4), 1, v)
    outs = [
        lion.lion_chunked(fq, fk, v, gates, chunk=4, angles=angles),
        lion.lion_masked(fq, fk, v, gates, angles=angles),
    ]
    assert torch.allclose(outs[0], outs[1], atol=1e-12)
    grads = [torch.autograd.grad(out.sum(), (fq, fk, v)) for out in outs]
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "softmax", "rope": "mixed"},
        {"name": "pola", "rope": "axial"},
        {"name": "lion", "decay": "none", "rope": "mixed"},
    ],
    ids=lambda s: f"{s['name']}-{s['rope']}",
)
def test_a_variable_size_batch_with_rope_gives_each_image_its_own_output(spec):
    """Each image's own table on the padded canvas (per-head tables for mixed): every image as it is alone."""
    torch.manual_seed(0)
    model = tiny_vit(spec, depth=2).double().eval()
    images = [torch.randn(3, 32, 32, dtype=torch.float64), torch.randn(3, 24, 40, dtype=torch.float64)]
    with torch.no_grad():
        alone = torch.cat([model(image[None]) for image in images])
        assert torch.allclose(model(images), alone, atol=1e-10)


@pytest.mark.parametrize("spec", [{"name": "softmax", "rope": "axial"}, {"name": "agent", "num_agents": 4}])
def test_dropped_patches_are_one_line_never_a_guessed_grid(spec):
    """timm's patch dropout keeps 4 of the 16 patches: a 2x2 grid guessed from the count would give them wrong
    places; the layer refuses instead (in eval no patch is dropped)."""
    model = tiny_vit(spec, patch_drop_rate=0.75)
    with pytest.raises(ValueError, match="4 grid tokens where token_grid, the 4x4 .* has 16.*patch_drop_rate") as err:
        model.train()(torch.randn(2, 3, 32, 32))
    assert "\n" not in str(err.value)
    assert model.eval()(torch.randn(2, 3, 32, 32)).shape == (2, 3)

"""Variable-size batches: a list of images of different sizes through the ViT as one padded, masked batch gives
each image what it gives alone (float64), and a linear-attention ViT trains on mixed sizes."""

import pytest
import torch

import vitzoo

SIZES = [(8, 12), (16, 8), (12, 12)]
TINY = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=3)


def tiny(attention, **kwargs):
    torch.manual_seed(0)
    return vitzoo.create_model("vit_cifar", attention=attention, **{**TINY, **kwargs}).double().eval()


def images(sizes=SIZES, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(3, h, w, generator=g, dtype=torch.float64) for h, w in sizes]


@pytest.mark.parametrize(
    "attention,options",
    [
        ("linear", {}),
        ("softmax", {}),
        ({"name": "softmax", "scale": "log_n"}, {}),
        ({"name": "softmax", "rope": "dinov3"}, {}),
        ({"name": "softmax", "rope": "axial"}, {"class_token": False, "global_pool": "avg"}),
        ("inline", {}),
        ({"name": "focused_linear", "pos_embed": False}, {}),
        ("linear", {"block": "mlla"}),
        ("mlla", {"block": "mlla"}),
        ("rala", {}),
        ("pola", {}),
        ("focused_linear", {}),
        ({"name": "linear", "rope": "dinov3"}, {}),
        ({"name": "agent", "num_agents": 4}, {}),
        ({"name": "nystrom", "num_landmarks": 4}, {}),
        ("efficient", {}),
        ({"name": "hydra", "rescale": True}, {}),
        ({"name": "lion", "decay": "none"}, {}),
        ("performer", {}),
        ({"name": "window", "window_size": 2, "shift": False, "rel_pos": True}, {}),
    ],
    ids=str,
)
def test_a_list_of_images_gives_each_image_what_it_gives_alone(attention, options):
    model, batch = tiny(attention, **options), images()
    together = model(batch)
    for i, img in enumerate(batch):
        torch.testing.assert_close(together[i : i + 1], model(img[None]), rtol=1e-9, atol=1e-11)


def test_tokens_of_the_padded_forward_match_the_image_alone_and_the_mask_marks_them():
    model, batch = tiny("linear"), images()
    tokens, valid = model.forward_padded(batch)
    assert tokens.shape[:2] == valid.shape == (3, 1 + 4 * 3)
    for i, img in enumerate(batch):
        alone = model.forward_features(img[None])[0]
        torch.testing.assert_close(tokens[i][valid[i]], alone, rtol=1e-9, atol=1e-11)


def test_a_tensor_batch_takes_timms_forward_unchanged():
    model = tiny("linear")
    x = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    torch.testing.assert_close(model(x), model.forward_head(model.forward_features(x)), rtol=0, atol=0)


@pytest.mark.parametrize(
    "call,fix",
    [
        (lambda m: m([torch.randn(3, 10, 8, dtype=torch.float64)]), "multiple of the patch size"),
        (lambda m: m([torch.randn(3, 0, 8, dtype=torch.float64)]), "0x8, not a positive multiple"),
        (lambda m: m([torch.randn(3, 8, 8, dtype=torch.float64), torch.randn(1, 8, 8)]), "one channel count"),
        (lambda m: m([torch.randn(3, 8, 8, dtype=torch.float64)], attn_mask=torch.ones(1, 1, 1, 5)), "own padding"),
        (lambda m: m([torch.randn(1, 8, 8), torch.randn(1, 8, 12)]), r"image 0 has shape \(1, 8, 8\), not \(3, H, W\)"),
        (
            lambda m: m([torch.randn(3, 8, 8), torch.randn(8, 12, 3)]),
            r"image 1 has shape \(8, 12, 3\), not \(3, H, W\)",
        ),
        (lambda m: m([torch.randn(3, 8, 8), torch.randn(8, 8)]), r"image 1 has shape \(8, 8\), not \(3, H, W\)"),
        (lambda m: m([torch.randn(3, 8, 8), torch.randn(3, 2, 8)]), r"image 1 has shape \(3, 2, 8\): .*one patch"),
        (lambda m: m([torch.zeros(3, 8, 8, dtype=torch.uint8)]), r"image 0 of shape \(3, 8, 8\) has dtype torch.uint8"),
    ],
)
def test_bad_lists_are_one_line_errors(call, fix):
    """A bad image names its index, its shape and what is expected (the model's channels, sides a multiple of the
    patch size, a float dtype), before any conv sees it."""
    with pytest.raises(ValueError, match=fix) as err:
        call(tiny("linear"))
    assert "\n" not in str(err.value)


def test_a_list_item_that_is_not_a_tensor_is_one_line():
    with pytest.raises(TypeError, match="image 1 is a numpy.ndarray, not a torch.Tensor") as err:
        tiny("linear")([torch.randn(3, 8, 8), torch.randn(3, 8, 8).numpy()])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("method", ["forward_features", "forward_intermediates", "forward"])
def test_timms_tensor_methods_refuse_a_list_naming_the_calls_that_take_one(method):
    """forward_features / forward_intermediates (and forward, which calls the first) take one tensor, as in timm;
    a list is one line naming model(images) and model.forward_padded(images)."""
    pattern = r"takes one \(B, C, H, W\) tensor, not a list of images.*model\(images\).*model\.forward_padded\(images\)"
    with pytest.raises(TypeError, match=pattern) as err:
        getattr(tiny("linear"), method)(images())
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "attention,fix",
    [
        ("linformer", "cannot take a variable-size batch.*mixes all tokens.*images of one size.*takes key padding"),
        ({"name": "lion", "decay": "fixed"}, "cannot take a variable-size batch.*images of one size.*decay: none"),
        ({"name": "lion", "decay": "selective"}, "cannot take a variable-size batch.*padding changes"),
        ("synth_random", "one grid, not of each image's own"),
    ],
    ids=str,
)
def test_a_mechanism_tied_to_one_grid_refuses_a_list_in_one_line(attention, fix):
    """The padding of a list is not a mask the caller passed: a mechanism that cannot leave padded keys out says it
    cannot take a variable-size batch, why, and the fix (not "takes no attn_mask")."""
    with pytest.raises(ValueError, match=fix) as err:
        tiny(attention)(images())
    assert "\n" not in str(err.value)


def test_agent_refuses_images_whose_agent_grids_differ():
    with pytest.raises(ValueError, match="agent grids .* lower num_agents") as err:
        tiny({"name": "agent", "num_agents": 9})(images([(8, 12), (16, 16)]))
    assert "\n" not in str(err.value)


def test_window_refuses_images_cut_into_other_windows_than_the_canvas():
    with pytest.raises(ValueError, match="other windows than the batch's .* lower window_size") as err:
        tiny({"name": "window", "window_size": 2})(images())  # block 1 shifts: a side of 2 is not shifted alone
    assert "\n" not in str(err.value)


def test_linear_vit_trains_on_mixed_sizes():
    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", attention="linear", **TINY)
    batch = [img.float() for img in images([(8, 12), (16, 8), (12, 12), (16, 16)])]
    labels = torch.tensor([0, 1, 2, 1])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(25):
        loss = torch.nn.functional.cross_entropy(model(batch), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    model.eval()
    with torch.no_grad():
        together = model(batch)
        for i, img in enumerate(batch):
            torch.testing.assert_close(together[i : i + 1], model(img[None]), rtol=1e-4, atol=1e-5)

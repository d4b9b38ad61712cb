"""robustness.corrupt: documented strengths, ranges, determinism, protocols, bad input."""

import importlib.util
import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from vitzoo import robustness
from vitzoo.robustness import CORRUPTIONS, corrupt, list_corruptions
from vitzoo.robustness.corruptions.blur import zoom_factors
from vitzoo.robustness.corruptions.weather import FROST_FILES, frost_dir

# The source constants, written out here so that a changed constant in the library fails a test:
# "cifar" from hendrycks/robustness ImageNet-C/create_c/make_cifar_c.py, "imagenet" from
# ImageNet-C/imagenet_c/imagenet_c/corruptions.py (the ImageNet tables are also found in imagecorruptions'
# code by test_corruptions_reference.py).
CONSTANTS = {
    "gaussian_noise": {"cifar": [0.04, 0.06, 0.08, 0.09, 0.10], "imagenet": [0.08, 0.12, 0.18, 0.26, 0.38]},
    "shot_noise": {"cifar": [500, 250, 100, 75, 50], "imagenet": [60, 25, 12, 5, 3]},
    "impulse_noise": {"cifar": [0.01, 0.02, 0.03, 0.05, 0.07], "imagenet": [0.03, 0.06, 0.09, 0.17, 0.27]},
    "speckle_noise": {"cifar": [0.06, 0.10, 0.12, 0.16, 0.20], "imagenet": [0.15, 0.20, 0.35, 0.45, 0.60]},
    "contrast": {"cifar": [0.75, 0.5, 0.4, 0.3, 0.15], "imagenet": [0.4, 0.3, 0.2, 0.1, 0.05]},
    "gaussian_blur": {"cifar": [0.4, 0.6, 0.7, 0.8, 1.0], "imagenet": [1, 2, 3, 4, 6]},
    "defocus_blur": {
        "cifar": [(0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1, 0.2), (1.5, 0.1)],
        "imagenet": [(3, 0.1), (4, 0.5), (6, 0.5), (8, 0.5), (10, 0.5)],
    },
    "jpeg_compression": {"cifar": [80, 65, 58, 50, 40], "imagenet": [25, 18, 15, 10, 7]},
    "glass_blur": {
        "cifar": [(0.05, 1, 1), (0.25, 1, 1), (0.4, 1, 1), (0.25, 1, 2), (0.4, 1, 2)],
        "imagenet": [(0.7, 1, 2), (0.9, 2, 1), (1, 2, 3), (1.1, 3, 2), (1.5, 4, 2)],
    },
    "motion_blur": {
        "cifar": [(6, 1), (6, 1.5), (6, 2), (8, 2), (9, 2.5)],
        "imagenet": [(10, 3), (15, 5), (15, 8), (15, 12), (20, 15)],
    },
    "zoom_blur": {
        "cifar": [
            np.arange(1, 1.06, 0.01),
            np.arange(1, 1.11, 0.01),
            np.arange(1, 1.16, 0.01),
            np.arange(1, 1.21, 0.01),
            np.arange(1, 1.26, 0.01),
        ],
        "imagenet": [
            np.arange(1, 1.11, 0.01),
            np.arange(1, 1.16, 0.01),
            np.arange(1, 1.21, 0.02),
            np.arange(1, 1.26, 0.02),
            np.arange(1, 1.31, 0.03),
        ],
    },
    "snow": {
        "cifar": [
            (0.1, 0.2, 1, 0.6, 8, 3, 0.95),
            (0.1, 0.2, 1, 0.5, 10, 4, 0.9),
            (0.15, 0.3, 1.75, 0.55, 10, 4, 0.9),
            (0.25, 0.3, 2.25, 0.6, 12, 6, 0.85),
            (0.3, 0.3, 1.25, 0.65, 14, 12, 0.8),
        ],
        "imagenet": [
            (0.1, 0.3, 3, 0.5, 10, 4, 0.8),
            (0.2, 0.3, 2, 0.5, 12, 4, 0.7),
            (0.55, 0.3, 4, 0.9, 12, 8, 0.7),
            (0.55, 0.3, 4.5, 0.85, 12, 8, 0.65),
            (0.55, 0.3, 2.5, 0.85, 12, 12, 0.55),
        ],
    },
    "frost": {
        "cifar": [(1, 0.2), (1, 0.3), (0.9, 0.4), (0.85, 0.4), (0.75, 0.45)],  # frost images resized by 0.2
        "imagenet": [(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)],
    },  # as they are
    "fog": {
        "cifar": [(0.2, 3), (0.5, 3), (0.75, 2.5), (1, 2), (1.5, 1.75)],
        "imagenet": [(1.5, 2), (2, 2), (2.5, 1.7), (2.5, 1.5), (3, 1.4)],
    },
    "brightness": {"cifar": [0.05, 0.1, 0.15, 0.2, 0.3], "imagenet": [0.1, 0.2, 0.3, 0.4, 0.5]},
    "elastic_transform": {
        "cifar": [
            (32 * 0, 32 * 0, 32 * 0.08),
            (32 * 0.05, 32 * 0.2, 32 * 0.07),
            (32 * 0.08, 32 * 0.06, 32 * 0.06),
            (32 * 0.1, 32 * 0.04, 32 * 0.05),
            (32 * 0.1, 32 * 0.03, 32 * 0.03),
        ],
        "imagenet": [
            (244 * 2, 244 * 0.7, 244 * 0.1),
            (244 * 2, 244 * 0.08, 244 * 0.2),
            (244 * 0.05, 244 * 0.01, 244 * 0.02),
            (244 * 0.07, 244 * 0.01, 244 * 0.02),
            (244 * 0.12, 244 * 0.01, 244 * 0.02),
        ],
    },
    "pixelate": {"cifar": [0.95, 0.9, 0.85, 0.75, 0.65], "imagenet": [0.6, 0.5, 0.4, 0.3, 0.25]},
    "spatter": {
        "cifar": [
            (0.62, 0.1, 0.7, 0.7, 0.5, 0),
            (0.65, 0.1, 0.8, 0.7, 0.5, 0),
            (0.65, 0.3, 1, 0.69, 0.5, 0),
            (0.65, 0.1, 0.7, 0.69, 0.6, 1),
            (0.65, 0.1, 0.5, 0.68, 0.6, 1),
        ],
        "imagenet": [
            (0.65, 0.3, 4, 0.69, 0.6, 0),
            (0.65, 0.3, 3, 0.68, 0.6, 0),
            (0.65, 0.3, 2, 0.68, 0.5, 0),
            (0.65, 0.3, 1, 0.65, 1.5, 1),
            (0.67, 0.4, 1, 0.65, 1.5, 1),
        ],
    },
    "saturate": {
        "cifar": [(0.3, 0), (0.1, 0), (1.5, 0), (2, 0.1), (2.5, 0.2)],
        "imagenet": [(0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)],
    },
}
FROST_RESIZE = {"cifar": 0.2, "imagenet": 1}
NOISES = ["gaussian_noise", "shot_noise", "impulse_noise", "speckle_noise"]
RANDOM = set(NOISES) | {"glass_blur", "motion_blur", "snow", "frost", "fog", "spatter", "elastic_transform"}
CASES = [(p, s) for p in ("cifar", "imagenet") for s in range(1, 6)]
ALL = sorted(CONSTANTS)


def gen(seed):
    return torch.Generator().manual_seed(seed)


def texture(size, seed=0):
    """A smooth-plus-detail test image in [0.1, 0.9]: (2, 3, size, size), float64."""
    x = torch.rand(2, 3, size + 4, size + 4, generator=gen(seed), dtype=torch.float64)
    x = 0.6 * F.avg_pool2d(x, 5, 1) + 0.4 * x[..., 2:-2, 2:-2]
    return 0.1 + 0.8 * (x - x.min()) / (x.max() - x.min())


def clipped_moments(values, weights):
    """Mean and std of a discrete distribution of float64 values with the given weights."""
    w = weights / weights.sum()
    m = (w * values).sum()
    return m.item(), (w * (values - m) ** 2).sum().sqrt().item()


def reference_moments(name, c):
    """Exact mean/std of the noise formula applied to a 0.5 pixel, then clipped to [0, 1]."""
    if name == "shot_noise":  # Poisson(0.5 c) / c
        k = torch.arange(0, int(0.5 * c + 20 * math.sqrt(0.5 * c) + 20), dtype=torch.float64)
        lam = torch.tensor(0.5 * c, dtype=torch.float64)
        pmf = torch.exp(k * lam.log() - lam - torch.lgamma(k + 1))
        return clipped_moments((k / c).clamp(0, 1), pmf)
    scale = c if name == "gaussian_noise" else 0.5 * c  # speckle: 0.5 + 0.5 * N(0, c^2)
    z = torch.linspace(-9, 9, 18_001, dtype=torch.float64)
    return clipped_moments((0.5 + scale * z).clamp(0, 1), torch.exp(-0.5 * z**2))


@pytest.mark.parametrize("protocol,severity", CASES)
@pytest.mark.parametrize("name", ["gaussian_noise", "shot_noise", "speckle_noise"])
def test_additive_noise_strength_on_mid_grey(name, protocol, severity):
    c = CONSTANTS[name][protocol][severity - 1]
    grey = torch.full((4, 3, 64, 64), 0.5)
    y = corrupt(grey, name, severity, protocol=protocol, generator=gen(severity)).double()
    ref_mean, ref_std = reference_moments(name, c)
    # Unclipped, these are the documented strengths: std c, 0.5 c, sqrt(0.5 / c).
    unclipped = {"gaussian_noise": c, "speckle_noise": 0.5 * c, "shot_noise": math.sqrt(0.5 / c)}[name]
    if unclipped < 0.5 / 5:
        assert ref_std == pytest.approx(unclipped, rel=1e-4)
    assert y.std().item() == pytest.approx(ref_std, rel=0.02)
    assert y.mean().item() == pytest.approx(ref_mean, abs=5 * ref_std / math.sqrt(y.numel()))


@pytest.mark.parametrize("protocol,severity", CASES)
def test_impulse_noise_fraction_per_element(protocol, severity):
    c = CONSTANTS["impulse_noise"][protocol][severity - 1]
    grey = torch.full((4, 3, 64, 64), 0.5)
    y = corrupt(grey, "impulse_noise", severity, protocol=protocol, generator=gen(severity))
    n = y.numel()
    tol = lambda p, count: 5 * math.sqrt(p * (1 - p) / count)  # noqa: E731  (binomial 5-sigma)
    assert set(y.unique().tolist()) <= {0.0, 0.5, 1.0}
    assert (y != 0.5).double().mean().item() == pytest.approx(c, abs=tol(c, n))
    assert (y == 1).double().mean().item() == pytest.approx(c / 2, abs=tol(c / 2, n))  # half salt
    assert (y == 0).double().mean().item() == pytest.approx(c / 2, abs=tol(c / 2, n))  # half pepper
    # each element (channel) on its own, as skimage: P(any channel of a pixel hit) = 1 - (1 - c)^3
    any_hit = (y != 0.5).any(dim=1).double().mean().item()
    p_any = 1 - (1 - c) ** 3
    assert any_hit == pytest.approx(p_any, abs=tol(p_any, n // 3))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_range_shape_dtype_and_input_untouched(name, dtype):
    x = texture(32).to(dtype)
    x[0, 0, :4] = 0.0  # saturated pixels are kept in range too
    x[0, 1, :4] = 1.0
    before = x.clone()
    for severity in (0, 1, 5):  # clean, the mildest and the strongest
        y = corrupt(x, name, severity, generator=gen(0))
        assert y.shape == x.shape and y.dtype == dtype and y.device == x.device
        assert y.min() >= 0 and y.max() <= 1
        assert y.data_ptr() != x.data_ptr()
    assert torch.equal(x, before)
    assert torch.equal(corrupt(x, name, 0), x)  # severity 0 = clean


@pytest.mark.parametrize("name", ALL)
def test_deterministic_for_a_seed(name):
    x = texture(32)
    a = corrupt(x, name, 3, generator=gen(1))
    assert torch.equal(a, corrupt(x, name, 3, generator=gen(1)))
    torch.manual_seed(5)
    b = corrupt(x, name, 3)
    torch.manual_seed(5)
    assert torch.equal(b, corrupt(x, name, 3))  # generator=None: the global RNG
    assert torch.equal(a, corrupt(x, name, 3, generator=gen(2))) == (name not in RANDOM)


@pytest.mark.parametrize(
    "shape,protocol",
    [((32, 32), "cifar"), ((64, 64), "cifar"), ((32, 128), "cifar"), ((65, 65), "imagenet"), ((96, 128), "imagenet")],
)
def test_protocol_defaults_by_short_side(shape, protocol):
    x = torch.full((1, 3, *shape), 0.5)
    other = {"cifar": "imagenet", "imagenet": "cifar"}[protocol]
    default = corrupt(x, "gaussian_noise", 3, generator=gen(0))
    assert torch.equal(default, corrupt(x, "gaussian_noise", 3, protocol=protocol, generator=gen(0)))
    assert not torch.equal(default, corrupt(x, "gaussian_noise", 3, protocol=other, generator=gen(0)))


@pytest.mark.parametrize("protocol,size", [("cifar", 32), ("imagenet", 64)])
@pytest.mark.parametrize(
    "name", NOISES + ["gaussian_blur", "defocus_blur", "contrast", "jpeg_compression", "brightness", "pixelate"]
)  # the others' tables are not monotone by design
def test_strength_grows_with_severity(name, protocol, size):
    x = texture(size).float()
    dev = [(corrupt(x, name, s, protocol=protocol, generator=gen(s)) - x).abs().mean().item() for s in range(6)]
    assert dev[0] == 0
    assert all(a < b for a, b in zip(dev, dev[1:])), dev


@pytest.mark.parametrize("protocol,severity", CASES)
def test_contrast_scales_std_exactly(protocol, severity):
    c = CONSTANTS["contrast"][protocol][severity - 1]
    x = 0.4 + 0.2 * texture(32)  # in [0.42, 0.58]: never clipped
    y = corrupt(x, "contrast", severity, protocol=protocol)
    torch.testing.assert_close(y.mean(dim=(-2, -1)), x.mean(dim=(-2, -1)))
    torch.testing.assert_close(y.std(dim=(-2, -1)), c * x.std(dim=(-2, -1)))


def gaussian_blur_reference(x, sigma):
    """float64 reference: 1D Gaussian truncated at int(4 sigma + 0.5), edge pixels repeated,
    applied as H x H and W x W matrices (rows, then columns)."""
    radius = int(4 * sigma + 0.5)
    w = [math.exp(-0.5 * (t / sigma) ** 2) for t in range(-radius, radius + 1)]
    w = torch.tensor(w, dtype=torch.float64) / sum(w)

    def matrix(n):
        m = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            for j, t in enumerate(range(-radius, radius + 1)):
                m[i, min(max(i + t, 0), n - 1)] += w[j]
        return m

    return matrix(x.shape[-2]) @ x @ matrix(x.shape[-1]).T


@pytest.mark.parametrize("size", [(40, 36), (96, 80)])  # small matrices; index padding and convs above 64 px
@pytest.mark.parametrize("protocol,severity", CASES)
def test_gaussian_blur_matches_reference(protocol, severity, size):
    x = texture(size[0])[..., : size[1]]  # non-square
    y = corrupt(x, "gaussian_blur", severity, protocol=protocol)
    ref = gaussian_blur_reference(x, CONSTANTS["gaussian_blur"][protocol][severity - 1])
    torch.testing.assert_close(y, ref.clamp(0, 1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("protocol,severity", CASES)
def test_defocus_blur_matches_hendrycks_disk(protocol, severity):
    cv2 = pytest.importorskip("cv2")
    radius, alias_blur = CONSTANTS["defocus_blur"][protocol][severity - 1]
    # The reference recipe: a 17x17 (or (2r+1)^2 for r > 8) aliased disk, normalised, smoothed by
    # a 3x3 (5x5) Gaussian of std alias_blur, then cv2.filter2D per channel.
    grid = np.arange(-8, 9) if radius <= 8 else np.arange(-radius, radius + 1)
    xx, yy = np.meshgrid(grid, grid)
    disk = ((xx**2 + yy**2) <= radius**2).astype(np.float32)
    kernel = cv2.GaussianBlur(disk / disk.sum(), ksize=(3, 3) if radius <= 8 else (5, 5), sigmaX=alias_blur)
    x = texture(48)
    ref = np.stack([[cv2.filter2D(ch, -1, kernel) for ch in im] for im in x.numpy()]).clip(0, 1)
    y = corrupt(x, "defocus_blur", severity, protocol=protocol)
    torch.testing.assert_close(y, torch.from_numpy(ref), rtol=0, atol=1e-6)  # float32 kernel there


@pytest.mark.parametrize("name", ["gaussian_blur", "defocus_blur"])
def test_blur_removes_high_frequencies_and_keeps_flat_images(name):
    x = texture(64).float()
    high = lambda im: torch.fft.rfft2(im).abs()[..., 16:48, 16:].pow(2).sum().item()  # noqa: E731
    for protocol in ("cifar", "imagenet"):
        energy = [high(corrupt(x, name, s, protocol=protocol)) for s in range(6)]
        assert all(e < energy[0] for e in energy[1:]), energy
        if name == "gaussian_blur":  # a disk's spectrum has side lobes: not monotone in a fixed band
            assert all(a > b for a, b in zip(energy, energy[1:])), energy
    flat = torch.full((1, 3, 40, 40), 0.3, dtype=torch.float64)
    for protocol, severity in CASES:
        out = corrupt(flat, name, severity, protocol=protocol)
        # the reference disk at ImageNet-C severity 4-5 carries 1.3% / 1.1% extra mass (its
        # anti-aliasing blur reflects at the grid edge the disk touches); all others sum to 1
        mass = {("imagenet", 4): 1.012975, ("imagenet", 5): 1.010786}.get((protocol, severity), 1.0)
        expected = 0.3 * (mass if name == "defocus_blur" else 1.0)
        torch.testing.assert_close(out, torch.full_like(flat, expected), rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("protocol,severity", [("cifar", 1), ("cifar", 5), ("imagenet", 5)])
def test_jpeg_equals_pil_at_documented_quality(protocol, severity, channels):
    x = texture(32)[:, :channels]  # not on the 8-bit grid: the library rounds to it first
    y = corrupt(x, "jpeg_compression", severity, protocol=protocol)
    quality = CONSTANTS["jpeg_compression"][protocol][severity - 1]
    for im, out in zip(x, y):
        u8 = (im * 255).round().byte().permute(1, 2, 0).squeeze(-1).numpy()
        buf = io.BytesIO()
        Image.fromarray(u8).save(buf, "JPEG", quality=quality)
        ref = torch.from_numpy(np.array(Image.open(buf))).reshape(u8.shape[0], u8.shape[1], channels)
        assert torch.equal((out * 255).round().byte(), ref.permute(2, 0, 1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", [n for n in ALL if n != "jpeg_compression"])
def test_cuda_images_give_the_cpu_answer(name):
    """Every corruption on CUDA images: the same result as on the CPU for the same CPU generator (random
    ones draw where the generator lives), and a CUDA generator works too."""
    x = texture(32).float()
    cpu = corrupt(x, name, 3, generator=gen(0))
    cuda = corrupt(x.cuda(), name, 3, generator=gen(0))
    assert cuda.device.type == "cuda"
    torch.testing.assert_close(cuda.cpu(), cpu, rtol=0, atol=1e-5)
    on_device = corrupt(x.cuda(), name, 3, generator=torch.Generator("cuda").manual_seed(0))
    assert on_device.device.type == "cuda"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", NOISES)
def test_cpu_generator_with_cuda_images(name):
    x = texture(32).float()
    cpu = corrupt(x, name, 3, generator=gen(0))
    cuda = corrupt(x.cuda(), name, 3, generator=gen(0))
    assert cuda.device.type == "cuda"
    torch.testing.assert_close(cuda.cpu(), cpu)
    on_device = corrupt(x.cuda(), name, 3, generator=torch.Generator("cuda").manual_seed(0))
    assert on_device.device.type == "cuda"


@pytest.mark.parametrize("name", sorted(CONSTANTS))
def test_constants_are_the_sources(name):
    for protocol in ("cifar", "imagenet"):
        table, source = getattr(CORRUPTIONS[name], protocol), CONSTANTS[name][protocol]
        if name == "zoom_blur":  # (start, stop, step) of np.arange, to the last bit
            assert [zoom_factors(*c) for c in table] == [a.tolist() for a in source]
        elif name == "frost":
            assert [c[:2] for c in table] == source and {c[2] for c in table} == {FROST_RESIZE[protocol]}
        else:
            assert list(table) == source


def test_registry_lists_every_corruption_and_group():
    benchmark = [
        "gaussian_noise",
        "shot_noise",
        "impulse_noise",
        "defocus_blur",
        "glass_blur",
        "motion_blur",
        "zoom_blur",
        "snow",
        "frost",
        "fog",
        "brightness",
        "contrast",
        "elastic_transform",
        "pixelate",
        "jpeg_compression",
    ]  # the order of the reference's table
    extra = ["speckle_noise", "gaussian_blur", "spatter", "saturate"]
    assert list_corruptions("benchmark") == sorted(benchmark)
    assert list_corruptions("extra") == sorted(extra)
    assert list_corruptions() == sorted(benchmark + extra) == sorted(robustness.CORRUPTIONS)
    assert list_corruptions("noise") == sorted(NOISES)
    assert list_corruptions("weather") == ["brightness", "fog", "frost", "snow", "spatter"]
    families = [list_corruptions(f) for f in ("noise", "blur", "weather", "digital")]
    assert sorted(sum(families, [])) == list_corruptions()  # every corruption in exactly one family
    with pytest.raises(ValueError, match="'benchmark', 'extra', 'noise'"):
        list_corruptions("rain")


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"name": "gaussian"}, "brightness.*zoom_blur"),
        ({"severity": 6}, r"\[0, 1, 2, 3, 4, 5\]"),
        ({"severity": -1}, r"\[0, 1, 2, 3, 4, 5\]"),
        ({"severity": 2.0}, r"\[0, 1, 2, 3, 4, 5\]"),
        ({"severity": True}, r"\[0, 1, 2, 3, 4, 5\]"),
        ({"protocol": "CIFAR"}, r"\['cifar', 'imagenet'\]"),
        ({"images": torch.rand(3, 32, 32)}, r"\(B, C, H, W\)"),
        ({"images": torch.randint(0, 255, (1, 3, 8, 8), dtype=torch.uint8)}, "float"),
        ({"images": torch.randn(1, 3, 8, 8)}, "before normalising"),
        ({"images": torch.rand(1, 3, 8, 8).index_fill_(3, torch.tensor([2]), float("nan"))}, "contain NaN"),
        ({"images": torch.rand(1, 2, 8, 8), "name": "jpeg_compression"}, "1 or 3 channels"),
    ],
)
def test_bad_input_names_the_fix(kwargs, match):
    args = {"images": torch.rand(1, 3, 8, 8), "name": "gaussian_noise", "severity": 3, **kwargs}
    with pytest.raises(ValueError, match=match):
        corrupt(**args)


def test_the_shipped_frost_images_are_imagecorruptions_pixels():
    """The package data holds the reference frost images' RGB values to the last bit (re-encoded losslessly)."""
    reference = importlib.util.find_spec("imagecorruptions")  # not imported: it needs pkg_resources
    if reference is None:
        pytest.skip("the reference: pip install --no-deps imagecorruptions==1.1.2 (bash .ci/run installs it)")
    source = Path(reference.origin).parent / "frost"
    for i, name in enumerate(FROST_FILES, start=1):
        (original,) = source.glob(f"frost{i}.*")
        with Image.open(frost_dir() / name) as ours, Image.open(original) as theirs:
            assert np.array_equal(np.asarray(ours.convert("RGB")), np.asarray(theirs.convert("RGB"))), name


@pytest.mark.parametrize("name", ["brightness", "saturate", "snow", "frost", "spatter"])
def test_colour_corruptions_need_gray_or_rgb(name):
    with pytest.raises(ValueError, match=f"{name} needs 1 or 3 channels"):
        corrupt(torch.rand(1, 2, 32, 32), name, 3)
    gray = corrupt(torch.rand(2, 1, 32, 32), name, 3, generator=gen(0))
    assert gray.shape == (2, 1, 32, 32)


def test_gray_brightness_and_saturate_follow_hsv():
    """One channel: HSV value is the pixel, so brightness adds c (clipped); saturation stays 0 (the pixel)."""
    x = texture(32)[:, :1]
    for protocol, severity in CASES:
        c = CONSTANTS["brightness"][protocol][severity - 1]
        torch.testing.assert_close(corrupt(x, "brightness", severity, protocol=protocol), (x + c).clamp(max=1))
        assert torch.equal(corrupt(x, "saturate", severity, protocol=protocol), x)


def test_glass_blur_needs_room_to_move_pixels():
    with pytest.raises(ValueError, match="glass_blur at this severity needs images larger than 8 px"):
        corrupt(torch.rand(1, 3, 8, 40), "glass_blur", 5, protocol="imagenet")

"""vitzoo's corruptions against the reference code: imagecorruptions 1.1.2 (Hendrycks & Dietterich's
operations made size-generic, at the ImageNet-C constants) run at each protocol's constants, and, where
imagecorruptions departs from the released datasets (frost's resize, the elastic transform), the
formula of hendrycks/robustness written here with the libraries it calls.

Deterministic corruptions must equal the reference within the stated tolerance (in 0..255 units: the
reference works in float32; PIL rounds to 8 bits). Random ones are checked twice: with the reference's
``np.random`` calls fed vitzoo's own draws (then equal like a deterministic one), and with each side
drawing for itself (then the mean and std of the change, image by image, agree within 5 standard errors).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

import corruption_reference as R
from vitzoo.robustness import CORRUPTIONS, corrupt

cv2 = pytest.importorskip("cv2")
SEVERITIES = (1, 2, 3, 4, 5)
SIZES = {"cifar": (32, 40), "imagenet": (64, 56)}  # (H, W): non-square on purpose
TOL = {"pixelate": 1.0 + 1e-9, "jpeg_compression": 0.0, "elastic_transform": 0.25}  # 0..255 units
DEFAULT_TOL = 1e-3
DETERMINISTIC = [
    "brightness",
    "contrast",
    "saturate",
    "pixelate",
    "jpeg_compression",
    "gaussian_blur",
    "defocus_blur",
    "zoom_blur",
]
RANDOM = [
    "gaussian_noise",
    "shot_noise",
    "speckle_noise",
    "glass_blur",
    "motion_blur",
    "snow",
    "fog",
    "frost",
    "spatter",
    "elastic_transform",
]


@pytest.fixture(scope="module")
def ref():
    return R.load()


def images(protocol: str, n: int = 2, seed: int = 0) -> torch.Tensor:
    """Smooth-plus-detail float64 images on the 8-bit grid (what the reference reads), with a black and
    a gray patch (the HSV corner cases)."""
    h, w = SIZES[protocol]
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, h + 4, w + 4, generator=g, dtype=torch.float64)
    x = 0.6 * F.avg_pool2d(x, 5, 1) + 0.4 * x[..., 2:-2, 2:-2]
    x = (x - x.min()) / (x.max() - x.min())
    x[0, :, :3, :3] = 0
    x[0, :, 3:6, :3] = 0.5
    return (x * 255).round() / 255


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- the formulas imagecorruptions departs from


def reference_frost(idx: int) -> Path:
    """imagecorruptions' own frost image ``idx`` (0-4), not vitzoo's re-encoded copy."""
    folder = Path(importlib.util.find_spec("imagecorruptions").origin).parent / "frost"
    return folder / f"frost{idx + 1}.{'png' if idx < 3 else 'jpg'}"


def hendrycks_frost(x_u8: np.ndarray, c: tuple, idx=None, top=None, left=None) -> np.ndarray:
    """make_cifar_c.py (frost images resized by 0.2) / corruptions.py (as they are) frost; draws its own
    frost, top and left with np.random unless given."""
    idx = np.random.randint(5) if idx is None else idx
    frost = cv2.imread(str(reference_frost(idx)))
    if c[2] != 1:
        frost = cv2.resize(frost, (0, 0), fx=c[2], fy=c[2])
    h, w = x_u8.shape[:2]
    top = np.random.randint(0, frost.shape[0] - h) if top is None else top
    left = np.random.randint(0, frost.shape[1] - w) if left is None else left
    frost = frost[top : top + h, left : left + w][..., [2, 1, 0]]
    return np.clip(c[0] * x_u8.astype(np.float64) + c[1] * frost, 0, 255)


def hendrycks_elastic(x_u8: np.ndarray, c: tuple) -> np.ndarray:
    """make_cifar_c.py / corruptions.py elastic_transform at constants c: random affine, then a smoothed
    random displacement (imagecorruptions has another elastic: no affine, other constants)."""
    from scipy.ndimage import map_coordinates
    from skimage.filters import gaussian

    image = x_u8.astype(np.float32) / 255
    hw = image.shape[:2]
    centre, side = np.float32(hw) // 2, min(hw) // 3
    src = np.float32([centre + side, [centre[0] + side, centre[1] - side], centre - side])
    dst = src + np.random.uniform(-c[2], c[2], size=src.shape).astype(np.float32)
    image = cv2.warpAffine(image, cv2.getAffineTransform(src, dst), hw[::-1], borderMode=cv2.BORDER_REFLECT_101)
    dx, dy = (
        (gaussian(np.random.uniform(-1, 1, size=hw), c[1], mode="reflect", truncate=3) * c[0]).astype(np.float32)[
            ..., None
        ]
        for _ in range(2)
    )
    x, y, z = np.meshgrid(np.arange(hw[1]), np.arange(hw[0]), np.arange(3))
    at = (y + dy).reshape(-1, 1), (x + dx).reshape(-1, 1), z.reshape(-1, 1)
    return np.clip(map_coordinates(image, at, order=1, mode="reflect").reshape(image.shape), 0, 1) * 255


def reference(ref, name: str, protocol: str, severity: int):
    """The reference of ``name`` at ``protocol``'s constants: a function of an (H, W, 3) uint8 image."""
    spec = CORRUPTIONS[name]
    c = spec.param(severity, protocol)
    if name == "frost":
        return lambda im, **drawn: hendrycks_frost(im, c, **drawn)
    if name == "elastic_transform":
        return lambda im: hendrycks_elastic(im, c)
    if name == "pixelate":  # hendrycks/robustness: BOX down, BOX up (imagecorruptions: NEAREST up)

        def box(im):
            h, w = im.shape[:2]
            small = Image.fromarray(im).resize((int(w * c), int(h * c)), Image.BOX)
            return np.asarray(small.resize((w, h), Image.BOX), dtype=np.float64)

        return box
    if name == "zoom_blur":  # its factor lists are np.arange calls, not one constant: the formula with

        def zoom(im):  # the reference's clipped_zoom
            x = (im / 255.0).astype(np.float32)
            layers = [ref.clipped_zoom(x, z)[: x.shape[0], : x.shape[1]] for z in np.arange(*c)]
            return np.clip((x + sum(layers)) / (len(layers) + 1), 0, 1) * 255

        return zoom
    fn = getattr(ref, name)
    fn = fn if protocol == "imagenet" else R.at_constants(fn, spec.imagenet, spec.cifar)
    return lambda im: np.clip(np.asarray(fn(Image.fromarray(im), severity), dtype=np.float64), 0, 255)


def assert_equal_255(ours: torch.Tensor, theirs: np.ndarray, tol: float, what: str) -> None:
    diff = (ours * 255 - R.from_hwc(theirs) * 255).abs().max().item()
    assert diff <= tol, f"{what}: max |vitzoo - reference| = {diff:.3g} (0..255) > {tol}"


# ---------------------------------------------------------------- constants


@pytest.mark.parametrize("name", sorted(set(CORRUPTIONS) - {"zoom_blur", "elastic_transform"}))
def test_imagenet_tables_are_the_ones_in_imagecorruptions_code(ref, name):
    """Each ImageNet table is a constant of the reference function's code (zoom_blur's are np.arange calls,
    checked in test_corruptions.py; imagecorruptions' elastic_transform is another transform)."""
    table = CORRUPTIONS[name].imagenet
    table = [c[:2] for c in table] if name == "frost" else table  # its third entry is vitzoo's resize (1)
    R.at_constants(getattr(ref, name), table, table)  # fails unless the code holds the table exactly once


# ---------------------------------------------------------------- deterministic: equal within tolerance


@pytest.mark.parametrize("protocol", ["cifar", "imagenet"])
@pytest.mark.parametrize("name", DETERMINISTIC)
def test_deterministic_corruption_equals_reference(ref, name, protocol):
    x = images(protocol)
    for severity in SEVERITIES:
        y = corrupt(x, name, severity, protocol=protocol)
        fn = reference(ref, name, protocol, severity)
        for i in range(len(x)):
            assert_equal_255(y[i], fn(R.to_hwc_u8(x[i])), TOL.get(name, DEFAULT_TOL), f"{name} {protocol} {severity}")


@pytest.mark.parametrize("protocol,size", [("cifar", 32), ("imagenet", 224)])
def test_pixelate_equals_imagecorruptions_nearest_upsampling_at_the_standard_sizes(ref, protocol, size):
    """imagecorruptions enlarges with NEAREST where the released data used BOX: the same pixels except
    where an output pixel's centre falls exactly on a boundary (never at 32 or 224 px)."""
    x = F.interpolate(images(protocol), size=(size, size), mode="nearest")
    for severity in SEVERITIES:
        y = corrupt(x, "pixelate", severity, protocol=protocol)
        fn = R.at_constants(ref.pixelate, CORRUPTIONS["pixelate"].imagenet, getattr(CORRUPTIONS["pixelate"], protocol))
        for i in range(len(x)):
            out = np.asarray(fn(Image.fromarray(R.to_hwc_u8(x[i])), severity))
            assert_equal_255(y[i], out, TOL["pixelate"], f"pixelate {protocol} {severity}")


# ---------------------------------------------------------------- random: vitzoo's draws fed to the reference


def uniform_(g, shape, low, high):
    return low + (high - low) * torch.rand(shape, generator=g, dtype=torch.float64)


def fed_draws(name: str, x: torch.Tensor, c, g: torch.Generator) -> list[dict]:
    """vitzoo's draws for ``corrupt(x, name, generator=g)``, redrawn in its order, as the reference's
    ``np.random`` results (one dict per image) or, for the formulas here, their arguments."""
    b, _, h, w = x.shape
    hwc = lambda t: [t[i].permute(1, 2, 0).numpy() for i in range(b)]  # noqa: E731
    if name in ("gaussian_noise", "speckle_noise"):
        return [{"normal": [z]} for z in hwc(c * torch.randn(x.shape, generator=g, dtype=x.dtype))]
    if name == "shot_noise":
        return [{"poisson": [k]} for k in hwc(torch.poisson(x * c, generator=g))]
    if name == "glass_blur":
        d, it = c[1], c[2]
        off = torch.randint(-d, d, (b, it, h - 2 * d, w - 2 * d, 2), generator=g)
        return [{"randint": list(off[i].reshape(-1, 2).numpy())} for i in range(b)]
    if name == "motion_blur":
        return [{"uniform": [a]} for a in uniform_(g, (b,), -45, 45).numpy()]
    if name == "fog":
        size, step, wibble, draws = 1 << (max(h, w) - 1).bit_length(), None, 100.0, []
        step = size
        while step >= 2:
            draws += [uniform_(g, (b, size // step, size // step), -wibble, wibble) for _ in range(3)]
            step, wibble = step // 2, wibble / c[1]
        return [{"uniform": [d[i].numpy() for d in draws]} for i in range(b)]
    if name == "snow":
        layer = c[0] + c[1] * torch.randn((b, h, w), generator=g, dtype=x.dtype)
        angle = uniform_(g, (b,), -135, -45)
        return [{"normal": [layer[i].numpy()], "uniform": [angle[i].item()]} for i in range(b)]
    if name == "spatter":
        layer = c[0] + c[1] * torch.randn((b, h, w), generator=g, dtype=torch.float64)
        return [{"normal": [layer[i].numpy()]} for i in range(b)]
    if name == "elastic_transform":
        shift = uniform_(g, (b, 3, 2), -c[2], c[2])
        noise = uniform_(g, (b, 2, h, w), -1, 1)
        return [{"uniform": [shift[i].numpy(), noise[i, 0].numpy(), noise[i, 1].numpy()]} for i in range(b)]
    raise AssertionError(name)


def frost_draws(x: torch.Tensor, c, g: torch.Generator) -> list[dict]:
    """vitzoo's frost draws (image, then top-left as a fraction of the room) as the formula's arguments."""
    b, _, h, w = x.shape
    pick = torch.randint(0, 5, (b,), generator=g)
    u = torch.rand((b, 2), generator=g, dtype=torch.float64)
    out = []
    for i in range(b):
        fh, fw = cv2.imread(str(reference_frost(int(pick[i])))).shape[:2]
        fh, fw = int(fh * c[2]), int(fw * c[2])
        out.append({"idx": int(pick[i]), "top": int(u[i, 0] * (fh - h)), "left": int(u[i, 1] * (fw - w))})
    return out


@pytest.mark.parametrize("protocol", ["cifar", "imagenet"])
@pytest.mark.parametrize("name", RANDOM)
def test_random_corruption_equals_reference_given_the_same_draws(ref, monkeypatch, name, protocol):
    x = images(protocol)
    for severity in SEVERITIES:
        c = CORRUPTIONS[name].param(severity, protocol)
        y = corrupt(x, name, severity, protocol=protocol, generator=gen(severity))
        fn = reference(ref, name, protocol, severity)
        if name == "frost":
            outs = [fn(R.to_hwc_u8(x[i]), **d) for i, d in enumerate(frost_draws(x, c, gen(severity)))]
        else:
            outs = []
            for i, draws in enumerate(fed_draws(name, x, c, gen(severity))):
                with R.feeding(monkeypatch, **draws):
                    outs.append(fn(R.to_hwc_u8(x[i])))
        for i, out in enumerate(outs):
            assert_equal_255(y[i], out, TOL.get(name, DEFAULT_TOL), f"{name} {protocol} {severity}")


# ---------------------------------------------------------------- random: each side draws for itself


def per_image_stats(change: torch.Tensor) -> torch.Tensor:
    """(B, 2): mean and std over each image's pixels of the change."""
    flat = change.flatten(1)
    return torch.stack([flat.mean(1), flat.std(1)], 1)


@pytest.mark.parametrize("protocol", ["cifar", "imagenet"])
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.slow) if n == "glass_blur" else n  # its
        for n in RANDOM + ["impulse_noise"]
    ],
)  # reference loops per pixel in Python
def test_random_corruption_matches_reference_in_distribution(ref, monkeypatch, name, protocol):
    """The same 16 images (8 for glass_blur) through vitzoo (torch draws) and the reference (numpy draws,
    seeded): per severity, the mean and the std of each image's change agree on average within 5
    standard errors of the paired difference (plus 1e-3 for the corruptions that change images little)."""
    n = 8 if name == "glass_blur" else 16
    x = images(protocol, n=n, seed=1)
    default_rng = np.random.default_rng
    monkeypatch.setattr(np.random, "default_rng", lambda seed=None: default_rng(7))  # skimage's s&p draws
    np.random.seed(0)
    for severity in SEVERITIES:
        ours = corrupt(x, name, severity, protocol=protocol, generator=gen(100 + severity))
        fn = reference(ref, name, protocol, severity)
        theirs = torch.stack([R.from_hwc(fn(R.to_hwc_u8(x[i]))) for i in range(n)])
        diff = per_image_stats(ours - x) - per_image_stats(theirs - x)  # (n, 2)
        bound = 5 * diff.std(0) / n**0.5 + 1e-3
        assert (diff.mean(0).abs() <= bound).all(), (
            f"{name} {protocol} {severity}: mean/std of the change differ by {diff.mean(0).tolist()} > {bound.tolist()}"
        )

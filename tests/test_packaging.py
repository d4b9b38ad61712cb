"""``pip install vitzoo`` is the library alone (attention, kernels, models, export on torch + timm + safetensors):
it builds and runs every mechanism without the applications' packages (Lightning, Hydra, albumentations...)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
APP_MODULES = (
    "lightning",
    "pytorch_lightning",
    "lightning_fabric",
    "torchmetrics",
    "hydra",
    "omegaconf",
    "albumentations",
    "cv2",
    "tensorboard",
    "sklearn",
    "matplotlib",
    "rich",
    "segmentation_models_pytorch",
    "ninja",
)
CORE_DEPENDENCIES = ("torch", "torchvision", "timm", "safetensors", "numpy")

# Builds every registered mechanism (and both non-local ResNets), runs a forward, exports one model and loads it
# back; then names any application module that was imported.
EVERY_MECHANISM = f"""
import sys, tempfile
import torch, vitzoo, vitzoo.export, vitzoo.diagnostics
for name in vitzoo.list_attentions():
    model = vitzoo.create_model("vit_cifar", attention=name, img_size=16, depth=2, num_classes=3)
    out = model(torch.rand(2, 3, 16, 16))
    assert out.shape == (2, 3), (name, out.shape)
for name in ("softmax", "linear"):
    model = vitzoo.create_model("nonlocal_resnet18_cifar", attention=name, num_classes=3).eval()
    assert model(torch.rand(1, 3, 32, 32)).shape == (1, 3)
with tempfile.TemporaryDirectory() as folder:
    vitzoo.export.export_model(model, folder)
    again = vitzoo.export.load_exported(folder).eval()
    image = torch.rand(1, 3, 32, 32)
    torch.testing.assert_close(again(image), model(image))
apps = sorted(m for m in sys.modules if m.partition(".")[0] in {APP_MODULES!r})
print("built", len(vitzoo.list_attentions()), "mechanisms; application modules imported:", apps)
"""

# A meta-path finder in front of all the others that finds none of the application packages: to importlib they
# are not installed (``import`` raises ModuleNotFoundError, ``find_spec`` and ``metadata`` find nothing).
NOT_INSTALLED = f"""
import sys
class NotInstalled:
    def __init__(self, finders):
        self.finders = finders
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {APP_MODULES!r}:
            return None
        for finder in self.finders:
            spec = finder.find_spec(name, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                return spec
        return None
    def find_distributions(self, *args, **kwargs):
        for finder in self.finders:
            if hasattr(finder, "find_distributions"):
                yield from finder.find_distributions(*args, **kwargs)
    def invalidate_caches(self):
        for finder in self.finders:
            if hasattr(finder, "invalidate_caches"):
                finder.invalidate_caches()
sys.meta_path[:] = [NotInstalled(list(sys.meta_path))]
try:
    import lightning
except ModuleNotFoundError:
    pass
else:
    raise AssertionError("the finder let lightning through")
"""

MET_REQUIREMENTS = """
from importlib import metadata
from packaging.requirements import Requirement
for line in metadata.requires("vitzoo"):
    req = Requirement(line)
    if req.marker is None or req.marker.evaluate({"extra": ""}):
        assert req.specifier.contains(metadata.version(req.name), prereleases=True), (line, metadata.version(req.name))
"""


def _run(python: str, code: str, cwd: Path) -> str:
    done = subprocess.run(
        [python, "-c", code],
        check=False,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": ""},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_every_mechanism_builds_without_the_application_packages(tmp_path):
    out = _run(sys.executable, NOT_INSTALLED + EVERY_MECHANISM, ROOT)
    assert out.rstrip().endswith("application modules imported: []"), out


def test_the_core_dependencies_are_what_pyproject_declares():
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert sorted(re.match(r"[A-Za-z0-9_.-]+", r).group(0) for r in requires) == sorted(CORE_DEPENDENCIES)


def _closure(names) -> set:
    """The installed distributions ``names`` need, recursively (their extras and unmet markers left out)."""
    from packaging.requirements import Requirement

    seen, todo = set(), list(names)
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in seen:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # a requirement for another platform or Python
        seen.add(name)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def _link_distribution(name: str, site: Path) -> None:
    """Symlink the top-level files and folders of an installed distribution (from its RECORD) into ``site``."""
    dist = metadata.distribution(name)
    base = Path(dist.locate_file(""))
    tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith(("..", "__pycache__"))}
    for top in tops:
        if not (site / top).exists() and (base / top).exists():
            (site / top).symlink_to(base / top)


@pytest.mark.slow
def test_a_fresh_venv_with_the_core_alone_builds_every_mechanism(tmp_path):
    """A venv without system site-packages holds exactly the closure of vitzoo's core requirements, linked from
    this environment's installed distributions (nothing downloaded); pip installs vitzoo's wheel into it offline,
    each of its requirements is met there, and every mechanism builds. (pip's resolver is not the judge: this
    machine's torch is installed without the CUDA wheels its metadata names.)"""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    python = str(venv / "bin" / "python")
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    closure = _closure(CORE_DEPENDENCIES)
    assert not closure & {"lightning", "hydra-core", "omegaconf", "albumentations", "torchmetrics", "matplotlib"}
    for name in closure:
        _link_distribution(name, site)
    source = tmp_path / "src"
    shutil.copytree(ROOT / "vitzoo", source / "vitzoo", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    pip = [sys.executable, "-m", "pip", "--quiet"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--wheel-dir", tmp_path, source],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("vitzoo-*.whl")
    subprocess.run([*pip, "--python", python, "install", "--no-index", "--no-deps", wheel], check=True, timeout=600)
    _run(python, MET_REQUIREMENTS, tmp_path)
    frost = {p.name for p in (site / "vitzoo" / "robustness" / "corruptions" / "frost").iterdir()}
    assert frost == {"LICENSE", "README.md", "frost1.webp", "frost2.webp", "frost3.webp", "frost4.jpg", "frost5.jpg"}
    out = _run(python, EVERY_MECHANISM, tmp_path)
    assert out.rstrip().endswith("application modules imported: []"), out

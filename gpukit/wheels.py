"""Which wheels the GPU machine lacks: the kit's roots and every requirement of theirs it does not have.

A requirement comes from a wheel's METADATA (``Requires-Dist``), its marker evaluated for the GPU machine
(CPython 3.12 on x86-64 Linux, no extras). It is met when its distribution is in ``gpu_packages.txt`` or already
in the kit; otherwise it is downloaded, at the version this environment has where that satisfies it.
"""

from __future__ import annotations

import importlib.metadata
import re
import zipfile
from pathlib import Path
from typing import Iterable, List, NamedTuple, Optional

from packaging.requirements import Requirement

GPU_PACKAGES = Path(__file__).with_name("gpu_packages.txt")
GPU_MARKERS = dict(
    python_version="3.12",
    python_full_version="3.12.3",
    implementation_name="cpython",
    implementation_version="3.12.3",
    platform_python_implementation="CPython",
    os_name="posix",
    sys_platform="linux",
    platform_system="Linux",
    platform_machine="x86_64",
    extra="",
)


class Root(NamedTuple):
    """A distribution the kit carries: its pinned version, whether its requirements are followed, and the top-level
    modules it provides (what vitzoo's code imports)."""

    name: str
    version: str
    follow: bool
    modules: tuple


ROOTS = (
    Root("hydra-core", "1.3.8", True, ("hydra",)),
    Root("omegaconf", "2.3.1", True, ("omegaconf",)),
    Root("albumentations", "2.0.8", True, ("albumentations",)),
    Root("timm", "1.0.31", True, ("timm",)),  # the image's timm version is unknown; vitzoo needs >= 1.0.26
    Root("fla-core", "0.6.0", True, ("fla",)),  # the peer kernels of the attention benchmark
    Root("segmentation-models-pytorch", "0.6.0", True, ("segmentation_models_pytorch",)),  # the export tests' smp
    # not followed: flash-linear-attention needs a newer transformers only for its models (the kit uses fla.ops);
    # imagecorruptions would pull opencv-python over the headless cv2, torchattacks pins requests~=2.25.1
    Root("flash-linear-attention", "0.6.0", False, ()),
    Root("imagecorruptions", "1.1.2", False, ("imagecorruptions",)),
    Root("torchattacks", "3.5.1", False, ("torchattacks",)),
)


def normalise(name: str) -> str:
    """PEP 503's form of a distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def gpu_packages(path: Path = GPU_PACKAGES) -> set:
    """The normalised distribution names installed on the GPU machine."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return {normalise(line) for line in lines if line}


def wheel_name(path: Path) -> str:
    """The normalised distribution name of a wheel file."""
    return normalise(path.name.split("-", 1)[0])


def requirements(wheel: Path) -> List[Requirement]:
    """The wheel's requirements whose markers hold on the GPU machine."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = z.read(meta).decode()
    found = [
        Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines() if line.startswith("Requires-Dist:")
    ]
    return [r for r in found if r.marker is None or r.marker.evaluate(GPU_MARKERS)]


def local_version(name: str) -> Optional[str]:
    """The version of ``name`` installed here, or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def pin(req: Requirement) -> str:
    """A pip argument for ``req``: this environment's version where it satisfies the specifier (the set tested
    here), else the specifier for pip to resolve."""
    version = local_version(req.name)
    if version is not None and req.specifier.contains(version, prereleases=True):
        return f"{normalise(req.name)}=={version}"
    return f"{normalise(req.name)}{req.specifier}"


def missing(wheels: Iterable[Path], have: set, follow: set) -> List[Requirement]:
    """Requirements of the ``follow`` wheels met neither by the GPU machine nor by ``have`` (normalised names)."""
    out = {}
    for wheel in wheels:
        if wheel_name(wheel) not in follow:
            continue
        for req in requirements(wheel):
            name = normalise(req.name)
            if name not in have and name not in out:
                out[name] = req
    return list(out.values())

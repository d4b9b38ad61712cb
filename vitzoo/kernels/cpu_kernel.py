"""The compiled CPU kernel of the chunked linear-attention path (csrc/linear_attention_cpu.cpp).

Built on first use with torch's JIT extension builder (g++ and ninja, about a minute) for the
instruction set torch itself runs with, once per install and CPU: the build is cached under
``TORCH_EXTENSIONS_DIR`` (~/.cache/torch_extensions by default) in a folder named after the source's
path, so checkouts and venvs sharing the cache do not rebuild each other's. Where it cannot be built
the torch path runs on plain torch ops instead (1.5-2.5x slower from 3k to 65k tokens on a 2-core
AVX-512 machine, docs/benchmarks/attention_cpu.txt), after one warning. ``VITZOO_CPU_KERNEL=0`` skips
the build and uses the torch ops.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import sys
import threading
import warnings
from pathlib import Path
from types import ModuleType
from typing import Optional

import torch

from .feature_maps import KERNEL_MAPS

__all__ = ["cpu_kernel", "cpu_kernel_enabled", "build_cpu_kernel"]

_SOURCE = Path(__file__).with_name("csrc") / "linear_attention_cpu.cpp"
_ARCH_FLAGS = {  # torch's CPU capability -> what the compiler may assume
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
}
_lock = threading.Lock()
log = logging.getLogger(__name__)


def cpu_kernel_enabled() -> bool:
    """False when VITZOO_CPU_KERNEL is 0 / false / off."""
    return os.environ.get("VITZOO_CPU_KERNEL", "1").strip().lower() not in {"0", "false", "off", "no"}


def _ensure_ninja_on_path() -> None:
    """torch's builder calls ``ninja`` by name: the venv's scripts folder holds it when the venv
    is not activated."""
    if shutil.which("ninja") is None:
        os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])


def _import_builder():
    """torch.utils.cpp_extension, without its import-time "No CUDA runtime is found" log line (a CPU build)."""
    builder_log = logging.getLogger("torch.utils.cpp_extension")
    level = builder_log.level
    builder_log.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        builder_log.setLevel(level)
    return cpp_extension


def _install_tag() -> str:
    """8 hex digits of the source's path: torch's build files hold absolute paths, so two installs
    sharing one extension folder would rebuild it for each other on every run."""
    return hashlib.sha1(str(_SOURCE.resolve()).encode()).hexdigest()[:8]


@functools.lru_cache(maxsize=None)
def _build() -> Optional[ModuleType]:
    cpp_extension = _import_builder()
    capability = torch.backends.cpu.get_cpu_capability()
    _ensure_ninja_on_path()
    name = f"vitzoo_linear_attention_cpu_{capability.lower()}_{_install_tag()}"
    folder = Path(cpp_extension._get_build_directory(name, verbose=False))
    if (folder / f"{name}.so").is_file():
        log.debug("vitzoo: loading the CPU linear-attention kernel for %s from %s", capability, folder)
    else:  # visible at any log level: the first linear-attention step waits for it
        print(
            f"vitzoo: building the CPU linear-attention kernel for {capability} (about a minute, once per install; "
            f"cached in {folder}); VITZOO_CPU_KERNEL=0 skips it, python -m vitzoo.kernels build builds it ahead",
            file=sys.stderr,
            flush=True,
        )
    try:
        compiler = os.environ.get("CXX", "c++")
        if shutil.which(compiler) is None:
            raise RuntimeError(f"no C++ compiler {compiler!r} on PATH")
        return cpp_extension.load(
            name=name,
            sources=[str(_SOURCE)],
            extra_cflags=["-O3", "-fopenmp", "-fno-trapping-math", *_ARCH_FLAGS.get(capability, [])],
            extra_ldflags=["-fopenmp"],
        )
    except Exception as err:  # no compiler, no ninja, a read-only cache: the torch ops still work
        reason = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
        warnings.warn(
            f"vitzoo: the CPU linear-attention kernel could not be built ({reason}); the torch path "
            "runs on plain torch ops (slower). Install g++ and ninja (pip install ninja) to build it, "
            "or set VITZOO_CPU_KERNEL=0 to skip trying.",
            RuntimeWarning,
            stacklevel=3,
        )
        return None


def build_cpu_kernel() -> Optional[ModuleType]:
    """Build (or load) the kernel now, whatever VITZOO_CPU_KERNEL says; None when it cannot be built."""
    with _lock:
        return _build()


def cpu_kernel(x: torch.Tensor, feature_map: str) -> Optional[ModuleType]:
    """The built kernel module when it serves ``x`` (a float32 / float64 CPU tensor) and the feature
    map, else None."""
    if not (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and feature_map in KERNEL_MAPS
        and cpu_kernel_enabled()
    ):
        return None
    with _lock:  # one build per process, whichever thread asks first
        return _build()

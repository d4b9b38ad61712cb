"""``python -m gpukit.environment [--find]``: one JSON line: the GPU, driver, Python, torch, CUDA, Triton, and each
module a kit run imports with its version (or the error importing it; ``--find``: found, not imported)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import platform
import shutil
import subprocess
import sys

# what the phases import beyond the standard library: vitzoo, its stack, the kit's wheels, the test side
MODULES = (
    "vitzoo",
    "torch",
    "triton",
    "timm",
    "torchvision",
    "lightning",
    "torchmetrics",
    "hydra",
    "omegaconf",
    "albumentations",
    "cv2",
    "numpy",
    "safetensors",
    "matplotlib",
    "yaml",
    "rich",
    "tensorboard",
    "sklearn",
    "fla.ops.linear_attn",
    "torchattacks",
    "imagecorruptions",
    "onnx",
    "onnxruntime",
    "onnxscript",
    "pytest",
    "xdist",
)


def driver() -> str:
    if shutil.which("nvidia-smi") is None:
        return "no nvidia-smi"
    proc = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
    )
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else proc.stderr[-200:]


def module_line(name: str, find_only: bool) -> str:
    """``version (file)`` of an importable module, else ``IMPORT FAILED: ...``."""
    try:
        if find_only:
            spec = importlib.util.find_spec(name.split(".")[0])
            if spec is None:
                raise ModuleNotFoundError(f"No module named {name.split('.')[0]!r}")
            return f"found ({spec.origin})"
        module = importlib.import_module(name)
        top = importlib.import_module(name.split(".")[0])
        return str(getattr(top, "__version__", "?")) + f" ({getattr(module, '__file__', '')})"
    except Exception as err:  # any failure to import is the finding, reported, never raised
        return f"IMPORT FAILED: {type(err).__name__}: {str(err)[:200]}"


def describe(find_only: bool = False) -> dict:
    info = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "driver": driver(),
        "modules": {name: module_line(name, find_only) for name in MODULES},
    }
    for dist in ("triton", "timm", "lightning", "fla-core"):
        try:
            info[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            info[dist] = "not installed"
    import torch

    info.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(
            gpu=torch.cuda.get_device_name(0),
            sms=p.multi_processor_count,
            gpu_memory_gib=round(p.total_memory / 2**30, 1),
            capability=".".join(map(str, (p.major, p.minor))),
        )
    else:
        info["gpu"] = "none (torch sees no CUDA device)"
    return info


if __name__ == "__main__":
    print(json.dumps(describe(find_only="--find" in sys.argv[1:])))

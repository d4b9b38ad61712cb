"""Which optional packages each extra of pyproject.toml brings, and the one-line error when a part of vitzoo is
used without its extra. Imports only the standard library, so a check runs before the heavy imports."""

from __future__ import annotations

import importlib.util

from vitzoo.errors import MissingDependency

__all__ = ["EXTRAS", "install_hint", "missing", "require_extra", "extra_error"]

# the modules of each extra that its parts import at load time (pyproject.toml's optional-dependencies)
_TRAIN = ("lightning", "torchmetrics", "hydra", "omegaconf", "albumentations", "cv2", "sklearn")
EXTRAS = {
    "train": _TRAIN,
    "seg": (*_TRAIN, "segmentation_models_pytorch"),
    "onnx": ("onnx", "onnxscript"),
}


def install_hint(extra: str) -> str:
    """How to install ``extra``: no package index serves vitzoo yet, so from a clone of its repository."""
    return f"in a clone of vitzoo: pip install -e '.[{extra}]' (or pip install '<clone>[{extra}]')"


def missing(extra: str) -> list:
    """The modules of ``extra`` that are not installed (found without importing them)."""
    return [name for name in EXTRAS[extra] if importlib.util.find_spec(name) is None]


def require_extra(extra: str, what: str) -> None:
    """Raise :class:`MissingDependency` in one line naming ``extra`` when ``what`` (a module or a command) cannot run
    for lack of one of its modules."""
    if missing(extra):
        raise extra_error(extra, what, ImportError(what))


def extra_error(extra: str, what: str, err: ImportError) -> ImportError:
    """What an application package raises when importing its modules failed with ``err``: one line naming
    ``extra`` when a module of it is missing, else ``err`` itself."""
    absent = missing(extra)
    if not absent:
        return err
    return MissingDependency(
        f"{what} needs vitzoo's {extra} extra ({', '.join(absent)} not installed); {install_hint(extra)}"
    )

"""The core install (`pip install vitzoo`): importing an application module without its extra is one line naming
the extra and how to install it from a clone."""

import subprocess
import sys

import pytest

from vitzoo.errors import MissingDependency
from vitzoo.extras import EXTRAS, extra_error, require_extra

# a fresh interpreter where the extras' modules cannot be imported, as in the core install; one line per module
_CORE = """
import importlib, sys
for name in {blocked!r}:
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError, find_spec finds nothing
for module in {modules!r}:
    try:
        importlib.import_module(module)
        print(module, "imported")
    except ImportError as err:
        print(type(err).__name__, err, sep=": ")
"""
_APPS = {
    "vitzoo.training": "train",
    "vitzoo.data": "train",
    "vitzoo.robustness": "train",
    "vitzoo.utils": "train",
    "vitzoo.segmentation": "seg",
}
_LIBRARY = ["vitzoo.export", "vitzoo.attention", "vitzoo.models", "vitzoo.diagnostics"]


def test_app_module_without_its_extra_is_one_line_naming_it():
    blocked = sorted({m for names in EXTRAS.values() for m in names})
    code = _CORE.format(blocked=blocked, modules=[*_APPS, *_LIBRARY])
    lines = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.splitlines()
    assert len(lines) == len(_APPS) + len(_LIBRARY), lines
    for line, (module, extra) in zip(lines, _APPS.items()):
        assert line.startswith(f"MissingDependency: {module} needs vitzoo's {extra} extra (lightning, "), line
        assert line.endswith(f"in a clone of vitzoo: pip install -e '.[{extra}]' (or pip install '<clone>[{extra}]')")
    assert lines[len(_APPS) :] == [f"{module} imported" for module in _LIBRARY]  # the library needs no extra


def test_require_extra_names_the_missing_modules(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxscript", None)
    with pytest.raises(MissingDependency, match=r"^--onnx needs vitzoo's onnx extra \(onnxscript not installed\); "):
        require_extra("onnx", "--onnx")


def test_an_unrelated_import_error_is_not_blamed_on_an_extra():
    err = ImportError("cannot import name 'x'")
    assert extra_error("train", "vitzoo.training", err) is err  # every train module is installed here

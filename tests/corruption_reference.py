"""The reference corruptions (``imagecorruptions`` 1.1.2, Hendrycks & Dietterich's code made size-generic)
for the parity tests, loaded with the shims today's libraries need, plus helpers to feed it our draws.

imagecorruptions 1.1.2 imports ``pkg_resources`` (gone from recent setuptools), calls ``np.float_``
(gone in numpy 2) and ``skimage.filters.gaussian(multichannel=True)`` (``channel_axis`` since 0.19).
The shims live here, scoped to that module: nothing else in the test process sees them. Install it
without its dependencies (it asks for opencv-python, which clashes with albumentations'
opencv-python-headless): ``pip install --no-deps imagecorruptions==1.1.2 scikit-image``.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
import warnings
from contextlib import contextmanager

import numpy as np
import pytest
import torch

INSTALL = "pip install --no-deps imagecorruptions==1.1.2 scikit-image"


def _numpy_with_float_() -> types.ModuleType:
    """numpy as the reference module sees it: everything of numpy, plus ``float_``."""
    proxy = types.ModuleType("numpy")
    proxy.__getattr__ = lambda name: getattr(np, name)  # module-level __getattr__ (PEP 562)
    proxy.float_ = np.float64
    return proxy


def _gaussian_with_multichannel(gaussian):
    def shim(image, sigma=1.0, multichannel=None, **kwargs):
        if multichannel:
            kwargs.setdefault("channel_axis", -1)
        return gaussian(image, sigma=sigma, **kwargs)

    return shim


def load():
    """``imagecorruptions.corruptions`` with the shims, or skip the test with the line that installs it."""
    try:
        import skimage.filters

        cached = sys.modules.get("imagecorruptions.corruptions")
        if cached is None:
            fake = types.ModuleType("pkg_resources")
            fake.resource_filename = lambda pkg, path: os.path.join(os.path.dirname(sys.modules[pkg].__file__), path)
            saved = sys.modules.get("pkg_resources")
            sys.modules["pkg_resources"] = saved or fake
            try:
                with warnings.catch_warnings():  # it imports map_coordinates from scipy.ndimage.interpolation
                    warnings.simplefilter("ignore", DeprecationWarning)
                    cached = importlib.import_module("imagecorruptions.corruptions")
            finally:
                if saved is None:
                    del sys.modules["pkg_resources"]
            cached.np = _numpy_with_float_()
            cached.gaussian = _gaussian_with_multichannel(skimage.filters.gaussian)
        return cached
    except ImportError as err:
        pytest.skip(f"the reference corruptions are not installed ({err}); {INSTALL}")


@contextmanager
def feeding(monkeypatch, **draws):
    """Make the reference's ``np.random.<name>`` calls return the given arrays, in call order:
    ``feeding(monkeypatch, normal=[a], uniform=[b, c])``. Fails if a draw is left over."""
    queues = {name: list(values) for name, values in draws.items()}
    for name in queues:

        def take(*args, _name=name, **kwargs):
            assert queues[_name], f"the reference drew np.random.{_name} more often than fed"
            return queues[_name].pop(0)

        monkeypatch.setattr(np.random, name, take)
    yield
    assert not any(queues.values()), f"draws left over: { {k: len(v) for k, v in queues.items() if v} }"


def to_hwc_u8(x: torch.Tensor) -> np.ndarray:
    """(C, H, W) in [0, 1] on the 8-bit grid -> (H, W, C) uint8."""
    return (x * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()


def from_hwc(a: np.ndarray) -> torch.Tensor:
    """A reference output (H, W, C) in 0..255 -> (C, H, W) float64 in [0, 1]."""
    return torch.from_numpy(np.asarray(a, dtype=np.float64)).permute(2, 0, 1) / 255


def at_constants(fn, table, new_table):
    """The reference function ``fn`` with its severity table ``table`` (a constant of its code)
    replaced by ``new_table``: the same code at, e.g., make_cifar_c.py's constants."""
    consts = fn.__code__.co_consts
    hits = [i for i, c in enumerate(consts) if isinstance(c, tuple) and c == tuple(table)]
    assert len(hits) == 1, f"{fn.__name__} does not hold the table {table} once"
    consts = consts[: hits[0]] + (tuple(new_table),) + consts[hits[0] + 1 :]
    return types.FunctionType(
        fn.__code__.replace(co_consts=consts), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )

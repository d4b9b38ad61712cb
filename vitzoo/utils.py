"""What every room's entry point shares: user errors as one line, configs instantiated with those errors
intact, results written as strict JSON."""

from __future__ import annotations

import json
import math
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator

from vitzoo.errors import MissingDependency
from vitzoo.extras import extra_error

try:
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate
    from omegaconf import DictConfig
    from omegaconf.errors import MissingMandatoryValue
except ImportError as err:  # the core install: one line naming the extra
    raise extra_error("train", "vitzoo.utils", err) from None

__all__ = ["USER_ERRORS", "user_errors", "instantiate_config", "write_json"]

USER_ERRORS = (ValueError, FileNotFoundError, MissingDependency)


@contextmanager
def user_errors() -> Iterator[None]:
    """Print a configuration / data error as one line on stderr and exit 1 (traceback with VITZOO_TRACEBACK=1)."""
    try:
        yield
    except (*USER_ERRORS, MissingMandatoryValue) as err:
        if os.environ.get("VITZOO_TRACEBACK"):
            raise
        if isinstance(err, MissingMandatoryValue):
            err = f"{err.full_key} is required (??? in the config); pass {err.full_key}=... on the command line"
        sys.exit(f"error: {err}")


def instantiate_config(node: DictConfig, **kwargs) -> Any:
    """hydra's instantiate, re-raising a user error from the target's constructor as itself."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        if isinstance(err.__cause__, USER_ERRORS):
            raise err.__cause__ from None
        raise


def _strict(value: Any) -> Any:
    """``value`` with NaN / inf floats as None (strict JSON has no literal for them: a diverged loss)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    return value


def write_json(path: Path, metrics: Dict[str, Any]) -> None:
    """``metrics`` as indented, key-sorted strict JSON at ``path`` (parent folders created; paths as
    strings, NaN / inf as null)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_strict(metrics), indent=2, sort_keys=True, default=str, allow_nan=False) + "\n")

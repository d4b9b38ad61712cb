"""Options as the applications' Python APIs take them: an instance of an option dataclass of :mod:`vitzoo.options`,
or a mapping of its fields (as Hydra gives them), checked against the dataclass as the command line's are."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Type, TypeVar, Union

from omegaconf import OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from vitzoo.options import ClassifierOptions, MixupOptions, OptimOptions, TransferOptions, reject_unknown

__all__ = ["OptimOptions", "MixupOptions", "ClassifierOptions", "TransferOptions", "options_from"]

T = TypeVar("T")


def options_from(cls: Type[T], name: str, given: Union[T, Mapping[str, Any], None]) -> T:
    """``given`` (an instance, a mapping of field values, or None for the defaults) as ``cls``: an unknown key, or a
    value the field's type does not take, is a one-line ``ValueError`` naming ``name`` and the valid options."""
    if isinstance(given, cls):
        return given
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), dict(given or {})))  # type: ignore
    except ConfigKeyError as err:  # the key's path within name, and the fields of the dataclass it is not in
        *parents, key = str(err.full_key).split(".")
        owner = ".".join([name, *parents])
        reject_unknown(owner, [key], [f.name for f in dataclasses.fields(err.object_type or cls)])
        raise
    except ValidationError as err:
        what = str(err.msg).splitlines()[0]
        if "is not a ListConfig" in what:  # OmegaConf names its node types; say what to write instead
            what = f"give a list, e.g. {err.key}=[{err.value}]"
        raise ValueError(f"{name}.{err.full_key}={err.value!r}: {what}") from None

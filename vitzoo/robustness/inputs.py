"""The val split each evaluated model reads: the eval transform its checkpoint recorded (the recipe and the deit
recipe's crop, :meth:`~vitzoo.data.ImageDataModule.eval_transform`) and its mean / std, with the fields the caller
gives over them (eval.py: ``data.recipe``, ``data.crop_pct``, ``data.interpolation``, ``data.mean``, ``data.std`` on
its command line). A checkpoint written before the record, or a model, reads the data's own transform.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from vitzoo.options import reject_unknown

__all__ = ["FIELDS", "Inputs", "inputs_of"]

FIELDS = ("recipe", "crop_pct", "interpolation", "mean", "std")


@dataclass(frozen=True)
class Inputs:
    """How one model's val split is built and normalised, and the words the start-up line says about it."""

    data_kwargs: Tuple[Tuple[str, Any], ...]  # recipe / crop_pct / interpolation for the data module
    pretrained_cfg: Optional[Tuple[Tuple[str, Any], ...]]  # the recorded crop, where data_kwargs lack one
    mean: Tuple[float, ...]
    std: Tuple[float, ...]
    note: str

    def data_module(self, data: Callable[..., Any], **kwargs: Any) -> Any:
        """``data(**kwargs)`` with this model's recipe and crop."""
        dm = data(**kwargs, **dict(self.data_kwargs))
        if self.pretrained_cfg is not None:
            dm.pretrained_cfg = dict(self.pretrained_cfg)
        return dm


def _spell(transform: Mapping[str, Any]) -> str:
    if transform["recipe"] != "deit":
        return f"{transform['recipe']} recipe"
    return (
        f"deit recipe (crop_pct {transform['crop_pct']:g}, {transform['interpolation']}, {transform['crop_mode']} crop)"
    )


def inputs_of(hparams: Mapping[str, Any], given: Mapping[str, Any], data: Callable[..., Any]) -> Inputs:
    """The :class:`Inputs` of a model with ``hparams`` (its ``eval_transform``, ``mean``, ``std``, ``img_size``) on
    the data module factory ``data``, ``given`` (fields of :data:`FIELDS`) over what it recorded."""
    reject_unknown("transform", given, FIELDS)
    recorded: Optional[Dict[str, Any]] = hparams.get("eval_transform")
    kwargs = {k: given[k] for k in ("recipe", "crop_pct", "interpolation") if k in given}
    crop = None
    if recorded is not None:
        kwargs.setdefault("recipe", recorded["recipe"])
        crop = tuple((k, v) for k, v in recorded.items() if k != "recipe")
    if "recipe" in kwargs:
        kwargs["aug"] = None  # the data config's training options belong to its own recipe; evaluation takes none
    inputs = Inputs(
        tuple(kwargs.items()),
        crop,
        tuple(given.get("mean", hparams["mean"])),
        tuple(given.get("std", hparams["std"])),
        "",
    )
    dm = inputs.data_module(data, img_size=hparams["img_size"])
    transform = dm.eval_transform() if hasattr(dm, "eval_transform") else None
    what = _spell(transform) if transform is not None else "the data's own transform"
    named = [f"data.{k}={given[k]}" for k in FIELDS if k in given]
    given_words = " ".join(named)
    if recorded is None and not named:
        note = (
            f"the data config's {what}, as it records no eval transform (a checkpoint written before eval.py read "
            f"it, or a model): pass data.recipe=... data.crop_pct=... data.interpolation=... as it was trained"
        )
    elif recorded is None:
        note = f"{what}: {given_words} given (it records no eval transform)"
    elif named:
        note = f"{what}: {given_words} given over its checkpoint's {_spell(recorded)}"
    else:
        note = f"{what} as trained (its checkpoint's)"
    return replace(inputs, note=note)

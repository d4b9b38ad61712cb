"""Hybrid stacks: a mechanism per block.

``attention`` for a backbone is one spec (every block), a list of specs (one per block, in order), or the short
form, a mapping from block ranges to specs plus options shared by all of them::

    {":6": "linear", "6:": "softmax"}                  # blocks 0..5 linear, 6 to the last softmax
    {":-3": "rala", "-3:": "softmax", "logit_noise": 0.1}  # softmax in the last three blocks, whatever the depth

A range is a Python slice of the blocks (``a:b``, ``a:``, ``:b``, negative from the end) or one block index
``i``; together the ranges must cover every block once (a slice may be empty at a small depth).
"""

from __future__ import annotations

import re
from itertools import groupby
from typing import Any, Callable, Dict, List, Mapping, Sequence

from .registry import AttentionSpec, resolve_attention

__all__ = ["is_stack", "block_specs", "stage_specs", "check_attention", "per_block", "describe"]

_RANGE = re.compile(r"^(-?\d+)$|^(-?\d*):(-?\d*)$")


def is_stack(attention: Any) -> bool:
    """Whether ``attention`` chooses per block (a list, or a mapping of block ranges) rather than one spec."""
    if isinstance(attention, str):
        return False
    if isinstance(attention, Mapping):
        return "name" not in attention
    return isinstance(attention, Sequence)


def _blocks(key: Any, count: int) -> range:
    match = _RANGE.match(str(key).strip())
    if match is None:
        raise ValueError(f"attention block range {key!r} is not a block index or a slice; write e.g. ':6' or '6:'")
    if match.group(1) is not None:
        index = int(match.group(1))
        if not -count <= index < count:
            raise ValueError(f"attention block {index} lies outside blocks 0-{count - 1} ({count} blocks)")
        return range(index % count, index % count + 1)
    start, stop = (int(g) if g else None for g in match.group(2, 3))
    return range(count)[slice(start, stop)]


def _with(spec: AttentionSpec, shared: Mapping[str, Any]) -> AttentionSpec:
    if not shared:
        return spec
    return {"name": spec, **shared} if isinstance(spec, str) else {**shared, **spec}


def block_specs(attention: Any, count: int) -> List[AttentionSpec]:
    """One spec per block for ``count`` blocks; a wrong length, a gap, an overlap or a bad spec is a ValueError."""
    if not is_stack(attention):
        specs = [attention] * count
    elif isinstance(attention, Mapping):
        ranges = {k: v for k, v in attention.items() if _RANGE.match(str(k).strip())}
        shared = {k: v for k, v in attention.items() if k not in ranges}
        if not ranges:
            raise ValueError(
                f"attention {dict(attention)} has neither a 'name' nor block ranges; give one spec "
                "({'name': ...}), a list with one spec per block, or ranges ({':6': ..., '6:': ...})"
            )
        owner: Dict[int, Any] = {}
        for key, spec in ranges.items():
            for block in _blocks(key, count):
                if block in owner:
                    raise ValueError(f"attention block {block} is in two ranges, {owner[block]!r} and {key!r}")
                owner[block] = key
        missing = [b for b in range(count) if b not in owner]
        if missing:
            raise ValueError(
                f"attention ranges {list(ranges)} leave blocks {missing} without a mechanism; cover "
                f"blocks 0-{count - 1} (e.g. end with 'i:')"
            )
        specs = [_with(ranges[owner[b]], shared) for b in range(count)]
    else:
        specs = list(attention)
        if len(specs) != count:
            raise ValueError(
                f"attention lists {len(specs)} specs for {count} blocks; give one per block (or the "
                "short form {':6': ..., '6:': ...})"
            )
    for spec in specs:
        resolve_attention(spec)
    return specs


def stage_specs(attention: Any, depths: Sequence[int]) -> List[List[AttentionSpec]]:
    """One spec per block, grouped by stage, for a pyramid of ``depths`` blocks per stage.

    ``attention`` is one spec (every block), a list of one entry per stage (each a spec or a stack for that stage's
    blocks), or a per-block form over all ``sum(depths)`` blocks of the model (a list, or block ranges).
    """
    total = sum(depths)
    if is_stack(attention) and not isinstance(attention, Mapping) and len(attention) == len(depths) != total:
        return [block_specs(entry, depth) for entry, depth in zip(attention, depths)]
    try:
        flat = block_specs(attention, total)
    except ValueError as err:
        if is_stack(attention) and not isinstance(attention, Mapping) and len(attention) != total:
            raise ValueError(
                f"attention lists {len(attention)} entries for {len(depths)} stages of {list(depths)} blocks; give one "
                f"per stage ({len(depths)}) or one per block ({total})"
            ) from None
        raise err
    starts = [sum(depths[:i]) for i in range(len(depths))]
    return [flat[start : start + depth] for start, depth in zip(starts, depths)]


def check_attention(attention: Any) -> None:
    """Resolve every spec ``attention`` names (one spec or a stack), whatever the block count: a ValueError if one
    is bad."""
    if not is_stack(attention):
        specs = [attention]
    elif isinstance(attention, Mapping):
        shared = {k: v for k, v in attention.items() if not _RANGE.match(str(k).strip())}
        specs = [_with(v, shared) for k, v in attention.items() if k not in shared]
    else:
        specs = list(attention)
    for spec in specs:
        resolve_attention(spec)


def per_block(block_fn: Callable[..., Any], layers: Sequence[type]) -> Callable[..., Any]:
    """timm's ``block_fn`` building block i with ``layers[i]`` as its ``attn_layer`` (timm passes each block's index
    as ``depth``)."""

    def build(*args, depth: int = 0, **kwargs):
        return block_fn(*args, **{**kwargs, "attn_layer": layers[depth], "depth": depth})

    return build


def _name(spec: AttentionSpec) -> str:
    return spec if isinstance(spec, str) else str(spec["name"])


def describe(attention: Any) -> str:
    """A short name: the mechanism's, or a stack's (``rala x4 + softmax x5``, ``rala :-3 + softmax -3:``)."""
    if not is_stack(attention):
        return _name(attention)
    if isinstance(attention, Mapping):
        return " + ".join(f"{_name(v)} {k}" for k, v in attention.items() if _RANGE.match(str(k).strip()))
    return " + ".join(f"{name} x{len(list(run))}" for name, run in groupby(_name(spec) for spec in attention))

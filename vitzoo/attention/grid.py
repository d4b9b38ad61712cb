"""Token layouts (prefix tokens + an h x w patch grid) and what is tied to the one a model was built for.

``resample_tokens`` moves a token axis from one ``Layout`` to another (prefix entries kept, grid
entries bilinear). A ``GridModule`` holds tensors that index the built layout's tokens (Synthesizer
logits, Linformer's E, F); its persistent ``layout`` buffer lets a state dict saved at another grid
be resampled on load. A ``GridBoundAttention`` is a mechanism built from such modules: at another
token count it resamples them (``interpolate: true``) or raises a ValueError naming the option.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple, Optional, Sequence, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from . import functional as AF
from .base import ZooAttention
from .canvas import tables_on_canvas

__all__ = ["Layout", "resample_tokens", "GridModule", "GridBoundAttention"]


class Layout(NamedTuple):
    """Token layout: ``prefix`` tokens (class / register) followed by an ``h x w`` patch grid."""

    prefix: int
    h: int
    w: int

    @property
    def tokens(self) -> int:
        return self.prefix + self.h * self.w

    def __str__(self) -> str:
        return f"{self.prefix} prefix + {self.h}x{self.w} grid"


def resample_tokens(t: torch.Tensor, dim: int, src: Layout, dst: Layout) -> torch.Tensor:
    """Resample token axis ``dim`` of ``t`` from ``src`` to ``dst``: prefix kept, grid bilinear."""
    if src == dst:
        return t
    if src.prefix != dst.prefix:
        raise ValueError(
            f"cannot resample {src.prefix} prefix tokens to {dst.prefix}; the prefix token count must match"
        )
    # non-negative axes: the TorchScript ONNX exporter copies a negative movedim axis into Transpose's perm
    last, dim = t.dim() - 1, dim % t.dim()
    t = t.movedim(dim, last)
    lead = t.shape[:-1]
    grid = t[..., src.prefix :].reshape(1, -1, src.h, src.w)
    grid = F.interpolate(grid, size=(dst.h, dst.w), mode="bilinear", align_corners=False)
    return torch.cat([t[..., : src.prefix], grid.reshape(*lead, dst.h * dst.w)], dim=last).movedim(last, dim)


class GridModule(nn.Module):
    """A module whose tensors index the tokens of the layout it was built for (logit generators, Linformer's E, F).

    A logit generator's ``forward(x, q, k, layout)`` returns the logits at ``layout``. The built layout
    lives in the persistent buffer ``layout``; a state dict saved at another one is resampled on load.
    """

    layout: torch.Tensor  # buffer, registered in __init__

    def __init__(self, layout: Layout, device=None):
        super().__init__()
        self.built = layout
        self.register_buffer("layout", torch.tensor(layout, dtype=torch.long, device=device))
        self.register_load_state_dict_pre_hook(_resample_on_load)

    def resample_state(self, state: dict, prefix: str, src: Layout) -> None:
        """Resample this generator's entries of ``state`` from layout ``src`` to ``self.built``."""
        raise NotImplementedError

    def _resample_entry(self, state: dict, key: str, src: Layout, dims: Sequence[int], heads: Optional[int] = None):
        """Resample the token axes ``dims`` of ``state[key]`` (dim 0 split as (heads, -1) if given)."""
        if key not in state:
            return
        t = state[key]
        out = AF.acc(t) if heads is None else AF.acc(t).unflatten(0, (heads, -1))
        for d in dims:
            out = resample_tokens(out, d, src, self.built)
        state[key] = (out if heads is None else out.flatten(0, 1)).to(t.dtype)

    def extra_repr(self) -> str:
        return f"layout={self.built}"


def _resample_on_load(module: GridModule, state_dict, prefix, *args) -> None:
    key = prefix + "layout"
    if key not in state_dict:
        return
    src = Layout(*(int(v) for v in state_dict[key].tolist()))
    if src == module.built:
        return
    if src.prefix != module.built.prefix:
        raise ValueError(
            f"{prefix or 'module'}: state dict has {src.prefix} prefix tokens, this model "
            f"{module.built.prefix}; build the model with the same class/register tokens"
        )
    module.resample_state(state_dict, prefix, src)
    state_dict[key] = module.layout.clone()


class GridBoundAttention(ZooAttention):
    """A mechanism whose parameters index the tokens of the layout it was built for (``built_layout``).

    ``interpolate``: at another layout, resample them as a 2-D grid (True) or raise a ValueError
    (False). Needs the layout it is built for (``num_tokens`` / ``grid_size``, supplied by the vitzoo
    backbones). ``resampled`` names what is resampled, for the error message.
    """

    resampled = "logits"

    def __init__(self, dim: int, num_heads: int = 8, *args, interpolate: bool = True, **kwargs):
        super().__init__(dim, num_heads, *args, **kwargs)
        self.interpolate = interpolate
        self.built_layout = _built_layout(self.num_tokens, self.num_prefix_tokens, self.grid_size, type(self).__name__)

    def layout_table(self, table: Callable[[Layout], torch.Tensor], num_tokens: int, dim: int) -> torch.Tensor:
        """``table(layout)`` (token axis ``dim``) at the current input; for a variable-size batch (``image_grids``)
        each image's table at its own grid, on the canvas, with a leading batch axis."""
        if self.image_grids is None:
            return table(self.target_layout(num_tokens))
        built, canvas = self.built_layout, self.current_grid(num_tokens)
        layouts = {g: Layout(built.prefix, *g) for g in self.image_grids}
        moved = [g for g, layout in layouts.items() if layout != built]
        if moved and not self.interpolate:
            raise ValueError(
                f"{type(self).__name__} was built for {built} but this batch has images of grids {sorted(moved)}; set "
                f"interpolate: true to resample its {self.resampled} to each image's grid"
            )
        tables = {g: table(layout) for g, layout in layouts.items()}
        return tables_on_canvas([tables[g] for g in self.image_grids], self.image_grids, canvas, built.prefix, dim)

    def target_layout(self, num_tokens: int) -> Layout:
        """The layout of an input of ``num_tokens`` tokens (the built one when nothing changed)."""
        built = self.built_layout
        grid = self.token_grid
        if num_tokens == built.tokens and (grid is None or grid[0] * grid[1] != built.h * built.w):
            return built  # no grid given for this input (a plain token sequence): the built layout
        if num_tokens != built.tokens and not self.interpolate:
            raise ValueError(
                f"{type(self).__name__} was built for {built.tokens} tokens ({built}) but got "
                f"{num_tokens}; set interpolate: true to resample its {self.resampled} to the new grid"
            )
        target = Layout(built.prefix, *self.current_grid(num_tokens))
        if target != built and not self.interpolate:
            raise ValueError(
                f"{type(self).__name__} was built for {built} but got {target} ({num_tokens} tokens); "
                f"set interpolate: true to resample its {self.resampled} to the new grid"
            )
        return target

    def extra_repr(self) -> str:
        return super().extra_repr() + f", layout={self.built_layout}, interpolate={self.interpolate}"


def _built_layout(num_tokens: Optional[int], prefix: int, grid_size: Optional[Tuple[int, int]], name: str) -> Layout:
    if grid_size is None:
        if num_tokens is None:
            raise ValueError(
                f"{name} needs the token count it is built for: build it inside a vitzoo model "
                f"(vitzoo.create_model) or pass num_tokens=<tokens incl. prefix> / grid_size=(h, w)"
            )
        n = num_tokens - prefix
        side = math.isqrt(max(n, 0))
        grid_size = (side, side) if side * side == n else (1, n)
    layout = Layout(prefix, *(int(g) for g in grid_size))
    if layout.h < 1 or layout.w < 1:
        raise ValueError(f"{name} needs at least one grid token, got {layout}; pass num_tokens > num_prefix_tokens")
    if num_tokens is not None and num_tokens != layout.tokens:
        raise ValueError(
            f"num_tokens={num_tokens} does not match {layout} ({layout.tokens} tokens); "
            f"pass a consistent num_tokens / grid_size"
        )
    return layout

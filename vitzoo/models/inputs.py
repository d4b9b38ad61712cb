"""What a zoo model's call takes, said in one line when it is handed something else (a numpy array, one image
without its batch axis, uint8 pixels, channels last) instead of torch's or timm's error from deep inside."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_images"]


def check_images(x: Any, in_chans: int) -> None:
    """Raise TypeError / ValueError naming the expected input unless ``x`` is a float (B, in_chans, H, W) tensor;
    anything else that is neither a tensor nor an array (a tracer's proxy) passes."""
    expected = f"a float tensor (B, {in_chans}, H, W) of normalised images"
    if type(x).__module__ == "numpy":
        raise TypeError(
            f"the model takes {expected}, not a numpy array: torch.from_numpy(images) (permuted to channels first, "
            "as float, normalised with model.pretrained_cfg's mean and std)"
        )
    if not isinstance(x, torch.Tensor):
        return
    if x.dim() != 4:
        fix = "; add the batch axis: model(image.unsqueeze(0))" if x.dim() == 3 else ""
        raise ValueError(f"the model takes {expected}, not a {x.dim()}-D tensor of shape {tuple(x.shape)}{fix}")
    if not x.is_floating_point():
        raise ValueError(
            f"the model takes {expected}, not {x.dtype} pixels: x.float() / 255, then normalise with "
            "model.pretrained_cfg's mean and std"
        )
    if x.shape[1] != in_chans:
        fix = "; channels last? x.permute(0, 3, 1, 2)" if x.shape[-1] == in_chans else ""
        raise ValueError(f"the model takes {expected}, not shape {tuple(x.shape)}{fix}")

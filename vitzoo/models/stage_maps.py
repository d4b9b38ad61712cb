"""timm's forward and feature API over a backbone's stages, written once for the pyramids that do not inherit them
from timm (PVT v1, MLLA, RAVLT): ``forward_intermediates`` (so ``features_only`` and smp ``tu-`` encoders work)
checks its arguments here, and each model says how its stages run in ``stage_maps``."""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

import torch
from timm.models._features import feature_take_indices

__all__ = ["StageMaps"]


class StageMaps:
    """Mixed into an ``nn.Module`` with ``forward_features``, ``forward_head``, ``num_stages`` and ``stage_maps``."""

    num_stages: int

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        raise NotImplementedError

    def stage_maps(
        self, x: torch.Tensor, take: List[int], stages: int, norm: bool
    ) -> Tuple[torch.Tensor, List[torch.Tensor]]:
        """Run the first ``stages`` stages on the image ``x``: the last one's output (normed as ``forward_features``
        norms it when every stage ran) and the NCHW map of each stage in ``take`` (normed too with ``norm``)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: Optional[Union[int, List[int]]] = None,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: str = "NCHW",
        intermediates_only: bool = False,
    ):
        """timm's: the NCHW output map of each stage ``indices`` takes and, unless ``intermediates_only``, the output
        of the last stage run (all of them unless ``stop_early``)."""
        if output_fmt != "NCHW":
            raise ValueError(
                f"output_fmt={output_fmt!r}: {type(self).__name__}'s stage outputs are NCHW maps; give "
                "output_fmt='NCHW'"
            )
        take, max_index = feature_take_indices(self.num_stages, indices)
        x, maps = self.stage_maps(x, take, max_index + 1 if stop_early else self.num_stages, norm)
        return maps if intermediates_only else (x, maps)

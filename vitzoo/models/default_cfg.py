"""What every zoo architecture's timm ``default_cfgs`` entry shares, and the CIFAR-10 normalisation its CIFAR
variants declare: one place for the licence (exports declare it too, ``vitzoo.export.card``) and the statistics."""

from __future__ import annotations

from typing import Any, Mapping

__all__ = ["LICENSE", "CIFAR_MEAN", "CIFAR_STD", "ZOO_CFG"]

LICENSE = "apache-2.0"  # the repository's LICENSE
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
# a pretrained_cfg's common part: no download url, 1000 classes at 3 x 224 x 224, the repository's licence; each
# backbone's _cfg adds its crop, interpolation, normalisation and layer names, a variant its own sizes
ZOO_CFG: Mapping[str, Any] = {"url": "", "num_classes": 1000, "input_size": (3, 224, 224), "license": LICENSE}

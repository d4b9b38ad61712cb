"""Train an image classifier: ``python train.py model=vit_linear`` (configs in configs/, see README)."""

from typing import Optional

from launch import check_paths, check_types, launch, refused_start_leaves_nothing  # first: names a missing train extra

import hydra
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="configs", config_name="train")
def main(cfg: DictConfig) -> Optional[float]:
    with refused_start_leaves_nothing(cfg):
        check_paths(cfg, files=["ckpt_path"] if cfg.get("ckpt_path") else [])
        check_types(cfg)
        from vitzoo.training import train  # torch, timm, Lightning: after the cheap checks
        from vitzoo.utils import user_errors

        with user_errors():
            metrics = train(cfg)
    return metrics.get(cfg.get("optimized_metric"))


if __name__ == "__main__":
    launch(main, resume=True)

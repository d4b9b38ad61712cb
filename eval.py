"""Evaluate checkpoints: ``python eval.py ckpt_path=<run dir>/checkpoints/last.ckpt`` (several: a list or a
mapping) -> clean accuracy, input corruptions, attention-logit noise and resolution sweeps (docs/robustness.md)."""

from launch import check_paths, launch, refused_start_leaves_nothing  # first: names a missing train extra

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    with refused_start_leaves_nothing(cfg):
        check_paths(cfg, files=["ckpt_path"])
        from vitzoo.robustness.run import evaluate_checkpoints  # torch, timm, Lightning: after the cheap checks
        from vitzoo.runtime import retain_freed_memory, size_thread_pools
        from vitzoo.utils import user_errors

        size_thread_pools()
        if cfg.retain_freed_memory:
            retain_freed_memory()
        with user_errors():
            # logs its results table and the paths of its files (console and eval.log); the command line's
            # data.recipe / crop_pct / interpolation / mean / std win over each checkpoint's own
            evaluate_checkpoints(cfg, HydraConfig.get().overrides.task)


if __name__ == "__main__":
    launch(main)

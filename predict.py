"""Segment images with a segmentation checkpoint: ``python predict.py ckpt_path=... input=... output=...``
(configs/predict.yaml; see docs/segmentation.md). In Python: ``vitzoo.segmentation.predict(...)``."""

from dataclasses import fields

import hydra
from omegaconf import DictConfig

from launch import check_paths, launch, refused_start_leaves_nothing


@hydra.main(version_base="1.3", config_path="configs", config_name="predict")
def main(cfg: DictConfig) -> None:
    with refused_start_leaves_nothing(cfg):
        check_paths(cfg, files=["ckpt_path"], inputs=["input", *(["masks"] if cfg.get("masks") else [])])
        from vitzoo.options import PredictOptions
        from vitzoo.segmentation import format_scores, predict  # torch, timm: after the cheap checks
        from vitzoo.utils import user_errors

        options = {f.name: cfg[f.name] for f in fields(PredictOptions)}
        with user_errors():
            summary = predict(cfg.ckpt_path, cfg.input, cfg.output, **options)
    print(
        f"{summary['images']} images -> {summary['output']} in {summary['seconds']:.1f} s "
        f"({summary['images_per_s']:.2f} images/s on {summary['device']}), peak "
        f"{summary['peak_memory_kind']} {summary['peak_memory_mib']:.0f} MiB"
    )
    if "scores" in summary:
        print("scores:", format_scores(summary["scores"]))


if __name__ == "__main__":
    launch(main)

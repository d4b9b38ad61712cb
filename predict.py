"""Segment images with a segmentation checkpoint: ``python predict.py ckpt_path=... input=... output=...``
(configs/predict.yaml; see the README's segmentation section)."""
import hydra
from omegaconf import DictConfig

from vitzoo.segmentation.predict import predict
from vitzoo.training import user_errors


@hydra.main(version_base="1.3", config_path="configs", config_name="predict")
def main(cfg: DictConfig) -> None:
    with user_errors():
        summary = predict(cfg)
    line = (f"{summary['images']} images -> {summary['output']} in {summary['seconds']:.1f} s "
            f"({summary['images_per_s']:.2f} images/s on {summary['device']}), peak "
            f"{summary['peak_memory_kind']} {summary['peak_memory_mib']:.0f} MiB")
    print(line)
    if "scores" in summary:
        print("scores:", {k: round(v, 4) for k, v in summary["scores"].items()})


if __name__ == "__main__":
    main()

"""Evaluate a checkpoint: ``python eval.py ckpt_path=<run dir>/checkpoints/last.ckpt`` -> metrics.json."""
import hydra
from omegaconf import DictConfig

from vitzoo.training import evaluate_checkpoint, user_errors


@hydra.main(version_base="1.3", config_path="configs", config_name="eval")
def main(cfg: DictConfig) -> None:
    with user_errors():
        metrics = evaluate_checkpoint(cfg)
    print({k: v for k, v in metrics.items() if k in ("acc1", "acc5", "loss", "num_images")})


if __name__ == "__main__":
    main()

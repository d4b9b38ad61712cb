"""Lightning training: ``fit`` from Python, the classifier module, optimiser/schedule, callbacks, evaluation,
the Hydra run (train.py)."""

from vitzoo.extras import extra_error

try:
    from .callbacks import AttentionEntropy
    from .evaluate import evaluate, load_classifier, read_checkpoint, run_record
    from .fit import FitResult, build_classifier_for, fit
    from .module import ImageClassifier, build_model
    from .optim import build_optimizer, build_scheduler, scaled_lr, warmup_cosine
    from .options import ClassifierOptions, MixupOptions, OptimOptions, TransferOptions
    from .progress import EpochLog, ThrottledProgressBar
    from .run import build_classifier, build_run, train
except ImportError as err:  # the core install: one line naming the extra
    raise extra_error("train", "vitzoo.training", err) from None

__all__ = [
    "fit",
    "FitResult",
    "build_classifier_for",
    "ClassifierOptions",
    "OptimOptions",
    "MixupOptions",
    "TransferOptions",
    "ImageClassifier",
    "build_model",
    "AttentionEntropy",
    "evaluate",
    "load_classifier",
    "read_checkpoint",
    "build_optimizer",
    "build_scheduler",
    "scaled_lr",
    "warmup_cosine",
    "train",
    "build_classifier",
    "build_run",
    "run_record",
    "EpochLog",
    "ThrottledProgressBar",
]

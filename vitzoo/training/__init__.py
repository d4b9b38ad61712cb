"""Lightning training: the classifier module, optimiser/schedule, callbacks, evaluation, run helpers."""
from .callbacks import AttentionEntropy
from .evaluate import evaluate, load_classifier, read_checkpoint, run_record
from .module import ImageClassifier, build_model
from .optim import build_optimizer, build_scheduler, warmup_cosine
from .progress import EpochLog, ThrottledProgressBar
from .run import build_classifier, instantiate_config, train, user_errors, write_json

__all__ = [
    "ImageClassifier", "build_model", "AttentionEntropy", "evaluate", "load_classifier", "read_checkpoint",
    "build_optimizer", "build_scheduler", "warmup_cosine", "train", "build_classifier", "instantiate_config", "write_json",
    "user_errors", "run_record", "EpochLog", "ThrottledProgressBar",
]

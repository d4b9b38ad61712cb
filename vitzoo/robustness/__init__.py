"""Robustness evaluation: input corruptions, attention-logit noise at eval time, resolution sweeps.

``corrupt`` and ``attention_noise`` are the building blocks; ``Sweep`` / ``run_pass`` evaluate one
model, ``summarize`` turns records into mean corrupted accuracy, relative drop and mCE; ``evaluate`` runs a
whole sweep over several models and returns a ``RobustnessResult`` that writes eval.py's files
(``vitzoo.robustness.run.evaluate_checkpoints``, what ``eval.py`` runs, wraps it).
"""

from vitzoo.extras import extra_error

try:
    from .api import RobustnessResult, evaluate
    from .attention_noise import attention_noise
    from .corruptions import CORRUPTIONS, PROTOCOLS, corrupt, list_corruptions
    from .report import summarize
    from .sweep import Pass, Sweep, run_pass, sweep_passes
except ImportError as err:  # the core install: one line naming the extra
    raise extra_error("train", "vitzoo.robustness", err) from None

__all__ = [
    "evaluate",
    "RobustnessResult",
    "CORRUPTIONS",
    "PROTOCOLS",
    "corrupt",
    "list_corruptions",
    "attention_noise",
    "Sweep",
    "Pass",
    "run_pass",
    "sweep_passes",
    "summarize",
]

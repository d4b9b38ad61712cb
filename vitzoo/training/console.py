"""The console of a run: Lightning's and timm's lines that inform nobody are silenced at their source
(logger filters and one warning filter) so that what matters stands out: the GPU/TPU availability lines,
the logging-service tip, "Loading `train_dataloader` to estimate ...", "`Trainer.fit` stopped: ..." (the
run's own closing line says more), timm's "Loaded  from checkpoint ..." (a backbone read from an export)
and torch's pytree deprecation warning raised inside Lightning.
Where logging is configured (train.py: console + train.log), Lightning's messages and Python warnings
go through it, once each, so train.log holds them too."""

from __future__ import annotations

import logging
import warnings

__all__ = ["quiet_lightning"]

_NOISE = (
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "\U0001f4a1 Tip:",
    "Loading `train_dataloader` to estimate",
    "`Trainer.fit` stopped:",
    "Loaded  from checkpoint",
)
_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero", "timm.models._helpers")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_NOISE)


_FILTER = _DropNoise()


def quiet_lightning() -> None:
    """Install the filters; with root handlers, route Lightning and warnings through them (idempotent)."""
    for name in _LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    if logging.getLogger().handlers:
        own = logging.getLogger("lightning")  # its "INFO: ..." stderr handler would print every line twice
        for handler in [h for h in own.handlers if type(h) is logging.StreamHandler]:
            own.removeHandler(handler)
        logging.captureWarnings(True)

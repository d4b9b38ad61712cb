"""Progress for runs that live in a log file: a heartbeat while an epoch runs, one plain line per epoch,
and the run's closing sentence.

Lines go through ``logging`` (to the console and ``<run dir>/train.log`` under train.py), so nohup,
SLURM and CI logs show how a run is doing while it runs, not only when it ends.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import lightning as L
import torch
from lightning.pytorch.callbacks import RichProgressBar

from vitzoo.attention.stack import describe

__all__ = ["EpochLog", "ThrottledProgressBar", "console_is_terminal", "opening_line", "closing_summary"]

log = logging.getLogger(__name__)
WHEN = ("auto", "always", "never")


def console_is_terminal() -> bool:
    """Whether stdout is a terminal (a progress bar can redraw there; a log file needs plain lines)."""
    return sys.stdout.isatty()


def _duration(seconds: float) -> str:
    return str(timedelta(seconds=round(seconds)))


def _batch_size(batch: Any) -> int:
    while isinstance(batch, (list, tuple, dict)) and len(batch):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return int(batch.shape[0]) if isinstance(batch, torch.Tensor) and batch.dim() else 0


def _epoch_metrics(metrics: Dict[str, torch.Tensor]) -> str:
    """``train/...`` epoch means and ``val/...`` values, in that order, 4 significant digits."""
    shown = {}
    for name in sorted(metrics, key=lambda n: (not n.startswith("train/"), n)):
        if name.startswith(("train/", "val/")) and not name.endswith("_step"):
            shown[name.removesuffix("_epoch")] = float(metrics[name])
    return " ".join(f"{name} {value:.4g}" for name, value in shown.items())


def _rate(images: float, seconds: float) -> str:
    rate = images / max(seconds, 1e-9)
    return f"{rate:.0f} img/s" if rate >= 100 else f"{rate:.3g} img/s"  # 251, 12.4, 0.837


class EpochLog(L.Callback):
    """After every training epoch (validation included) log ``epoch E/N step S | metrics | img/s |
    elapsed, ETA`` (epochs counted from 1; img/s: training images over the epoch's wall time, validation
    included). While an epoch runs, every ``heartbeat_s`` seconds (null or 0: never) log ``epoch E/N batch
    B/M step S | img/s | train/loss | epoch ETA``, so a long epoch in a log file is not a silent one.

    ``when``: ``auto`` (when stdout is not a terminal; train.py turns the progress bar off there),
    ``always`` or ``never``.
    """

    def __init__(self, when: str = "auto", heartbeat_s: Optional[float] = 60.0):
        if when not in WHEN:
            raise ValueError(f"callbacks.epoch_log.when={when!r}; choose one of {list(WHEN)}")
        if heartbeat_s is not None and (
            isinstance(heartbeat_s, bool) or not isinstance(heartbeat_s, (int, float)) or heartbeat_s < 0
        ):
            raise ValueError(f"callbacks.epoch_log.heartbeat_s={heartbeat_s!r}; give seconds >= 0 (0 or null: off)")
        self.when, self.heartbeat_s = when, heartbeat_s or 0.0
        self._fit_start = self._epoch_start = self._beat_at = 0.0
        self._first_epoch, self._images, self._beat_images = 0, 0, 0

    @property
    def active(self) -> bool:
        return self.when == "always" or (self.when == "auto" and not console_is_terminal())

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._fit_start, self._first_epoch = time.monotonic(), trainer.current_epoch

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._epoch_start = self._beat_at = time.monotonic()
        self._images = self._beat_images = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self._images += _batch_size(batch)
        now = time.monotonic()
        if self.heartbeat_s and now - self._beat_at >= self.heartbeat_s and self.active and trainer.is_global_zero:
            self._heartbeat(trainer, batch_idx, now)

    def _heartbeat(self, trainer: L.Trainer, batch_idx: int, now: float) -> None:
        rate = _rate((self._images - self._beat_images) * trainer.world_size, now - self._beat_at)
        line = f"{_epoch_text(trainer)} batch {batch_idx + 1}"
        total = trainer.num_training_batches
        if isinstance(total, int) and total > 0:
            line += f"/{total}"
        line += f" step {trainer.global_step} | {rate}"
        loss = trainer.callback_metrics.get("train/loss_step")
        if loss is not None:
            line += f" | train/loss {float(loss):.4g}"
        if isinstance(total, int) and total > 0:
            spent = now - self._epoch_start
            line += f" | epoch ETA {_duration(spent / (batch_idx + 1) * (total - batch_idx - 1))}"
        log.info(line)
        self._beat_at, self._beat_images = now, self._images

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not (self.active and trainer.is_global_zero):
            return
        now, epoch = time.monotonic(), trainer.current_epoch
        elapsed = now - self._fit_start
        timing = f"{_rate(self._images * trainer.world_size, now - self._epoch_start)} | elapsed {_duration(elapsed)}"
        if trainer.max_epochs and trainer.max_epochs > 0:
            left = trainer.max_epochs - 1 - epoch
            timing += f" ETA {_duration(elapsed / (epoch - self._first_epoch + 1) * left)}"
        log.info(
            "%s step %d | %s | %s",
            _epoch_text(trainer),
            trainer.global_step,
            _epoch_metrics(trainer.callback_metrics),
            timing,
        )


def _epoch_text(trainer: L.Trainer) -> str:
    """``epoch E/N``, counted from 1 (``epoch E`` without a set number of epochs)."""
    epoch = trainer.current_epoch + 1
    return f"epoch {epoch}/{trainer.max_epochs}" if trainer.max_epochs and trainer.max_epochs > 0 else f"epoch {epoch}"


class ThrottledProgressBar(RichProgressBar):
    """Lightning's rich progress bar without a host sync per step. A metric logged with ``prog_bar=True`` on
    every step is turned into a number after every step, by Lightning itself: on a GPU the host then waits for
    the step to finish before it can queue the next. So step metrics are logged without ``prog_bar`` and this
    bar reads the ones named in ``live_metrics`` from the callback metrics at most every ``metrics_interval_s``
    seconds while training (epoch-level ones, such as ``val/acc1``, as Lightning shows them)."""

    def __init__(
        self, metrics_interval_s: float = 1.0, live_metrics: Sequence[str] = ("train/loss_step",), **kwargs: Any
    ):
        if not metrics_interval_s >= 0:
            raise ValueError(
                f"callbacks.rich_progress_bar.metrics_interval_s={metrics_interval_s!r}; give seconds >= 0"
            )
        super().__init__(**kwargs)
        self.metrics_interval_s, self.live_metrics = metrics_interval_s, tuple(live_metrics)
        self._metrics: Optional[Dict[str, Any]] = None
        self._read_at = 0.0

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """The bar's last frame stays, and it lets go of the terminal before the lines that end a run (the
        export's, the closing sentence): while it is live, a line written past it is overwritten or sits
        between two copies of the bar."""
        self._stop_progress()

    def _get_train_description(self, current_epoch: int) -> str:
        """``Epoch E/N`` counted from 1, as the log lines count (Lightning's bar shows ``Epoch 0/0`` for one epoch)."""
        text = f"Epoch {current_epoch + 1}" + (f"/{self.trainer.max_epochs}" if self.trainer.max_epochs else "")
        return f"{text:{len(self.validation_description)}}"

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> Dict[str, Any]:
        now = time.monotonic()
        if self._metrics is None or not trainer.training or now - self._read_at >= self.metrics_interval_s:
            live = trainer.callback_metrics
            self._metrics = {
                **super().get_metrics(trainer, pl_module),
                **{name: float(live[name]) for name in self.live_metrics if name in live},
            }
            self._read_at = now
        return self._metrics


def opening_line(
    run_dir: Path,
    module: L.LightningModule,
    checkpoint: Optional[Dict[str, Any]],
    ckpt_path: Optional[str],
    threads: int,
    seed: Any,
) -> str:
    """The run's opening line: where it writes, what it trains, from where it resumes."""
    params = sum(p.numel() for p in module.parameters())
    what = module.hparams.get("arch", type(module).__name__)
    attention = module.hparams.get("attention")
    if attention is not None:
        what += f" ({describe(attention)} attention)"
    line = (
        f"run directory {run_dir.resolve()}: {what}, {params / 1e6:.2f}M parameters, {threads} CPU thread(s), "
        f"seed {seed}"
    )
    if checkpoint is not None:
        place = "continuing this run" if Path(ckpt_path).resolve().is_relative_to(run_dir.resolve()) else "resuming"
        line += f"; {place} from {ckpt_path} (epoch {checkpoint.get('epoch')}, step {checkpoint.get('global_step')})"
    return line


def _best_epoch(path: str) -> Optional[int]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("epoch")
    except Exception:  # the summary names the file either way
        return None


def closing_summary(trainer: L.Trainer, run_dir: Path, seconds: float) -> str:
    """One sentence: the best monitored value and its epoch, the checkpoint and export paths (relative to
    ``run_dir``), the time taken."""

    def rel(path: Any) -> str:
        path = Path(path).resolve()
        return str(path.relative_to(run_dir)) if path.is_relative_to(run_dir) else str(path)

    run_dir = run_dir.resolve()
    parts = [f"finished {trainer.current_epoch} epoch(s), step {trainer.global_step}, in {_duration(seconds)}"]
    best = trainer.checkpoint_callback
    if best is not None and best.best_model_path and best.best_model_score is not None:
        epoch = _best_epoch(best.best_model_path)
        at = f" at epoch {epoch + 1}" if epoch is not None else ""  # counted from 1, as the log lines are
        parts.append(f"best {best.monitor} {float(best.best_model_score):.4g}{at} ({rel(best.best_model_path)})")
    elif best is not None and best.best_model_path:  # a checkpoint without a monitor: the newest
        parts.append(f"checkpoint {rel(best.best_model_path)}")
    written = [p for c in trainer.checkpoint_callbacks for p in (c.last_model_path, c.best_model_path) if p]
    last = next((p for p in written if Path(p).name == "last.ckpt"), None)
    if last:
        parts.append(f"last checkpoint {rel(last)}")
    export = next((c.export_dir for c in trainer.callbacks if getattr(c, "export_dir", None)), None)
    if export is not None:
        parts.append(f"timm export in {rel(export)}/")
    return "; ".join(parts) + f"; all in {run_dir}"

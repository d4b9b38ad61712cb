"""train.py as a log file sees it: per-epoch lines and a closing sentence, resuming in the run's own
directory, thread pools sized from the CPUs the process may use."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from conftest import ROOT, run_python
from vitzoo.training import read_checkpoint

# 64 images, batch 16: 4 steps an epoch
RUN = ["debug=tiny_vit", "model=vit_softmax", "callbacks.attention_entropy=null"]
NOISE = ("GPU available", "TPU available", "Tip:", "FLOPs", "LeafSpec", "Trainer.fit` stopped", "INFO: ")


def _train(args, log_file: Path, cwd: Path) -> str:
    """train.py with stdout and stderr in ``log_file`` (not a terminal), as under nohup or SLURM."""
    with open(log_file, "w") as out:
        proc = subprocess.run(
            [sys.executable, str(ROOT / "train.py"), *RUN, *args],
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=600,
        )
    text = log_file.read_text()
    assert proc.returncode == 0, text[-3000:]
    return text


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """Two epochs into ``run/``, started from ``cwd`` (where a new run directory would appear under logs/)."""
    root = tmp_path_factory.mktemp("runs")
    run = root / "run"
    text = _train(
        ["trainer.max_epochs=2", f"hydra.run.dir={run}", "callbacks.epoch_log.heartbeat_s=1e-6"],
        root / "first.out",
        cwd=root,
    )
    return root, run, text


@pytest.mark.slow
def test_a_redirected_run_logs_every_epoch_and_a_closing_sentence(first_run):
    _, run, text = first_run
    assert f"run directory {run}: vit_cifar (softmax attention)" in text
    epochs = re.findall(
        r"epoch (\d)/2 step (\d+) \| train/acc1 \S+ train/acc5 \S+ train/loss \S+ val/acc1 \S+ "
        r"val/acc5 \S+ val/loss \S+ \| [\d.]+ img/s \| elapsed \d:\d\d:\d\d ETA \d:\d\d:\d\d",
        text,
    )
    assert epochs == [("1", "4"), ("2", "8")], text
    # a heartbeat after every batch here (heartbeat_s=1e-6; a minute by default)
    beats = re.findall(
        r"epoch (\d)/2 batch (\d)/4 step (\d) \| [\d.]+ img/s \| train/loss [\d.]+ \| "
        r"epoch ETA \d:\d\d:\d\d",
        text,
    )
    assert beats == [(str(e), str(b), str(4 * (e - 1) + b)) for e in (1, 2) for b in range(1, 5)], text
    closing = re.search(
        r"finished 2 epoch\(s\), step 8, in \S+; best val/acc1 (\S+) at epoch (\d) "
        r"\(checkpoints/best-epoch00(\d).ckpt\); last checkpoint checkpoints/last.ckpt; "
        r"timm export in export/; all in (\S+)",
        text,
    )
    assert closing and int(closing[2]) == int(closing[3]) + 1 and closing[4] == str(run), text
    assert not [line for line in text.splitlines() if any(n in line for n in NOISE)], text
    log = (run / "train.log").read_text()  # the same lines reach the run's log file
    assert "epoch 2/2 step 8 |" in log and "finished 2 epoch(s)" in log


def _steps(event_file: Path, tag: str):
    events = EventAccumulator(str(event_file), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def _files(folder: Path) -> dict:
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_resuming_a_finished_run_says_so_in_one_line_and_rewrites_nothing(first_run):
    root, run, _ = first_run
    last = run / "checkpoints" / "last.ckpt"
    done = read_checkpoint(last)["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"]
    before = _files(run)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *RUN, f"trainer.max_epochs={done}", f"ckpt_path={last}"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip() == (
        f"error: ckpt_path={str(last)!r} is of a run that already finished its {done} epoch(s) (trainer.max_epochs="
        f"{done}); nothing is left to train: to train it further, resume with a larger trainer.max_epochs (e.g. "
        f"trainer.max_epochs={2 * done})"
    )
    assert _files(run) == before  # metrics.json, train.log, .hydra/ as they were; no resume config left
    assert not (root / "logs").exists()


@pytest.mark.slow
def test_resuming_from_last_ckpt_continues_in_the_same_run_dir(first_run):
    root, run, _ = first_run
    text = _train(
        ["trainer.max_epochs=3", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"], root / "resumed.out", cwd=root
    )
    assert not (root / "logs").exists(), "the resumed run opened a new run directory"
    assert "continuing this run from" in text and "won't be reloaded" not in text, text
    assert json.loads((run / "metrics.json").read_text())["global_step"] == 12
    log = (run / "train.log").read_text()
    assert "finished 2 epoch(s)" in log and "finished 3 epoch(s)" in log  # appended, not replaced

    # TensorBoard: the second event file continues the first one's curves, step after step.
    first, second = sorted((run / "tensorboard").glob("events.out.tfevents.*"), key=lambda p: p.stat().st_mtime)
    loss = [step for step, _ in _steps(first, "train/loss_step") + _steps(second, "train/loss_step")]
    assert loss == list(range(12))
    val = _steps(first, "val/acc1") + _steps(second, "val/acc1")
    assert len(val) == 3 and val[1][0] < val[2][0]

    # Best-k tracking survived: the best checkpoint is the first epoch with the highest val/acc1 over all 3
    # (ties keep the earlier one; a run that forgot the first two epochs would pick epoch 2).
    scores = [value for _, value in val]
    best = scores.index(max(scores))
    assert sorted(p.name for p in (run / "checkpoints").glob("best-*.ckpt")) == [f"best-epoch{best:03d}.ckpt"]
    assert read_checkpoint(run / "checkpoints" / f"best-epoch{best:03d}.ckpt")["epoch"] == best

    # The run's own .hydra/ still says how it was started; this start's config sits beside it.
    assert "ckpt_path" not in (run / ".hydra" / "overrides.yaml").read_text()
    assert any("ckpt_path" in p.read_text() for p in (run / ".hydra").glob("resume-*/overrides.yaml"))


_PINNED = textwrap.dedent("""
    import logging, os, sys
    import torch
    logging.basicConfig(stream=sys.stdout, format="%(message)s")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # torch is loaded: its pool was sized before this
    from vitzoo.data import SyntheticDataModule
    from vitzoo.runtime import size_thread_pools
    print("threads", size_thread_pools(), torch.get_num_threads())
    print("workers", *(SyntheticDataModule(num_workers=n).num_workers for n in ("auto", 4)))
""")


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_pools_follow_a_one_core_affinity():
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    proc = run_python("-c", _PINNED, env=env, check=True)
    lines = proc.stdout.splitlines()
    assert "threads 1 1" in lines and "workers 0 4" in lines, proc.stdout
    assert any(
        line.startswith("num_workers=4 but this process may use 1 CPU(s); set num_workers=auto (= 0)") for line in lines
    ), proc.stdout


def test_cpu_model_names_the_processor_the_benchmarks_ran_on(monkeypatch):
    """vitzoo.runtime.cpu_model: /proc/cpuinfo's first "model name" on Linux (what /proc says, not the machine type),
    the processor or machine type where the file is missing."""
    import builtins
    import platform

    from vitzoo.runtime import cpu_model

    if os.path.exists("/proc/cpuinfo"):
        names = [line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")]
        if names:
            assert cpu_model() == names[0]
    real_open = builtins.open

    def no_proc(path, *args, **kwargs):
        if str(path) == "/proc/cpuinfo":
            raise FileNotFoundError(path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    assert cpu_model() == (platform.processor() or platform.machine() or "unknown CPU")

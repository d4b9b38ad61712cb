"""benchmarks/zoo.py end to end on a tiny JPEG tree: train, profile, eval and report fill every column."""
from __future__ import annotations

import csv
import subprocess
import sys

import cv2
import numpy as np
import torch

from conftest import ROOT

CLASSES = [f"c{i}" for i in range(10)]


def _jpeg_tree(root, per_class=12):
    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        (root / "train" / name).mkdir(parents=True)
        for i in range(per_class):  # a class-dependent tint, so the labels carry some signal
            image = rng.integers(0, 96, (32, 32, 3), dtype=np.uint8) + np.uint8(16 * (label % 10))
            cv2.imwrite(str(root / "train" / name / f"{i}.jpg"), image)


def _zoo(*args):
    return subprocess.run([sys.executable, "benchmarks/zoo.py", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)


def test_harness_trains_profiles_evaluates_and_tabulates(tmp_path):
    _jpeg_tree(tmp_path / "data")
    work, out = tmp_path / "work", tmp_path / "report"
    args = ["--budget", "cpu", "--data", tmp_path / "data", "--work", work, "--out", out,
            "--presets", "vit_softmax,nonlocal_resnet_linear", "--batch-size", 8, "--steps", 1,
            "--override", "trainer.max_epochs=1", "--override", "data.batch_size=16", "--override", "data.num_workers=0"]
    result = _zoo(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["preset"], r["seed"]) for r in rows] == [("vit_softmax", "0"), ("vit_softmax", "1"),
                                                         ("nonlocal_resnet_linear", "0")]
    for row in rows:
        assert all(value not in ("", "None") for value in row.values()), row
        assert 0.0 <= float(row["val acc"]) <= 1.0 and 0.0 < float(row["entropy init"]) <= 1.0 + 1e-6
    table = (out / "results.md").read_text()
    assert "| softmax | `vit_softmax` | 0,1 |" in table and "--override trainer.max_epochs=1" in table
    assert "img/s (training step, batch 8)" in table and f"torch {torch.__version__} for every row" in table
    assert {row["torch"] for row in rows} == {torch.__version__}
    for png in ("summary.png", "corruptions.png", "logit_noise.png", "resolution.png"):
        assert (out / png).stat().st_size > 0

    again = _zoo(*args)  # every phase resumes: nothing is retrained or re-evaluated
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(": done") == 3 and "[eval] done" in again.stdout

    # A later invocation (another work dir) adds its preset; the earlier rows and plots stay in the report, each
    # row with the torch it was profiled under.
    for row in rows:
        row["torch"] = "0.0.1" if row["preset"] == "nonlocal_resnet_linear" else row["torch"]
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    more = [a if a != work else tmp_path / "work2" for a in args]
    more[more.index("vit_softmax,nonlocal_resnet_linear")] = "vit_efficient"
    added = _zoo(*more)
    assert added.returncode == 0, added.stdout[-3000:] + added.stderr[-3000:]
    with open(out / "results.csv") as f:
        presets = [r["preset"] for r in csv.DictReader(f)]
    assert presets == ["vit_softmax", "vit_softmax", "vit_efficient", "nonlocal_resnet_linear"]
    table = (out / "results.md").read_text()
    assert "Rows kept from the earlier report" in table and "`nonlocal_resnet_linear`" in table
    assert f"torch {torch.__version__} for `vit_softmax`, `vit_efficient`; torch 0.0.1 for `nonlocal_resnet_linear`" \
        in table
    assert (out / "corruptions.png").is_file() and (out / "corruptions_vit_efficient.png").is_file()
    assert "corruptions_vit_efficient.png" in table

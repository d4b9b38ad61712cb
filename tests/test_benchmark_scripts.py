"""The data-path benchmarks run end to end on a tiny generated image folder and print their tables."""

from __future__ import annotations

import csv

import pytest

from conftest import run_python, write_image_folder

pytestmark = pytest.mark.slow  # each runs a benchmark script end to end in a fresh interpreter


def _folder(root):
    return write_image_folder(root, per_class=10)


def _run(*args):
    return run_python(*args, check=True).stdout


def test_data_path_benchmark_compares_both_paths(tmp_path):
    out = _run(
        "benchmarks/data_path.py",
        "--data",
        _folder(tmp_path),
        "--img-size",
        16,
        "--batch-size",
        4,
        "--batches",
        6,
        "--workers",
        1,
    )  # 18 training images: the loaders wrap around epochs
    rows = [line for line in out.splitlines() if line.startswith("| ") and "img/s" not in line]
    assert [r.split(" | ")[0] for r in rows] == [
        "| albumentations, 0 worker(s)",
        "| albumentations, 1 worker(s)",
        "| device path on cpu, cache build",
        "| device path on cpu, cache read",
    ]


def test_train_throughput_feeds_the_model_from_both_data_paths(tmp_path):
    out = _run(
        "benchmarks/train_throughput.py",
        "--data",
        _folder(tmp_path),
        "--img-size",
        16,
        "--batch-size",
        4,
        "--steps",
        6,
        "--rounds",
        1,
        "--warmup",
        1,
        "--device",
        "cpu",
        "--workers",
        0,
    )
    for row in (
        "vitzoo vit_softmax ",
        "timm VisionTransformer",
        "vitzoo vit_softmax <- albumentations, 0 worker(s)",
        "vitzoo vit_softmax <- device path",
    ):
        assert any(line.startswith(row) for line in out.splitlines()), out


def test_inference_throughput_compares_the_zoo_vit_with_timm():
    options = "--inference --img-size 16 --batch-size 2 --steps 1 --rounds 2 --warmup 1 --device cpu"
    out = _run("benchmarks/train_throughput.py", *options.split())
    assert "inference, 2 rounds" in out, out
    timm_row = next(line for line in out.splitlines() if line.startswith("timm VisionTransformer"))
    assert timm_row.split()[-3:] == ["1.000", "1.000", "1.000"], out  # the baseline's own ratios
    assert any(line.startswith("vitzoo vit_softmax ") for line in out.splitlines()), out


def test_attention_end_to_end_reports_inference_and_training_step(tmp_path):
    out = _run(
        "benchmarks/attention.py",
        "--device",
        "cpu",
        "--e2e-only",
        "--e2e-img-size",
        32,
        "--e2e-batch",
        2,
        "--e2e-reps",
        1,
        "--e2e-modes",
        "inference,train",
        "--out",
        tmp_path,
    )
    assert "ViT-Tiny 32x32 patch 8 (16 tokens), batch 2" in out
    with open(tmp_path / "attention_cpu_e2e.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["mode"], r["model"]) for r in rows] == [
        ("inference", "vit_linear"),
        ("inference", "vit_softmax"),
        ("train", "vit_linear"),
        ("train", "vit_softmax"),
    ]
    assert all(float(r["img_per_s"]) > 0 and r["peak_mb"] == "" for r in rows)  # peak memory: CUDA only

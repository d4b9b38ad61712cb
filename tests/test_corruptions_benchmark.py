"""benchmarks/corruption_speed.py runs end to end on a tiny CIFAR-like folder and prints its tables
(in this process: a fresh interpreter would spend most of the time importing)."""

from __future__ import annotations

import csv
import importlib.util

from conftest import write_image_folder
import corruption_speed  # a benchmark script (tests/conftest.py puts benchmarks/ on the path)

NAMES = ["glass_blur", "zoom_blur", "spatter"]  # a random, a deterministic and an extra one (all 19 by default)


def test_corruption_speed_prints_each_corruption_beside_the_forward_pass(tmp_path, capsys):
    write_image_folder(tmp_path, [f"class{c}" for c in range(10)], per_class=2, size=(32, 32), suffix=".jpg")
    corruption_speed.main(
        [
            "--data",
            str(tmp_path),
            "--images",
            "20",
            "--batch",
            "10",
            "--reference-images",
            "2",
            "--forward-repeats",
            "1",
            "--corruptions",
            ",".join(NAMES),
            "--out",
            str(tmp_path / "speed.csv"),
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# 20 CIFAR-10 images (32 px), batch 10;")
    assert any(line.startswith("zoo ViT (vit_cifar, softmax) forward:") for line in lines)
    assert any(line.startswith("the 2 x 5 sweep: corruptions ") for line in lines)
    with open(tmp_path / "speed.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["corruption"] for r in rows] == NAMES  # the 15 first, then the extra ones
    assert all(float(r["vitzoo_cifar_img_s"]) > 0 and float(r["pass_over_forward"]) > 0 for r in rows)
    if importlib.util.find_spec("imagecorruptions"):
        assert all(float(r["imagecorruptions_img_s"]) > 0 for r in rows)
        assert sum(line.startswith("| ") and line.endswith("x |") for line in lines) == len(rows)

"""benchmarks/transfer_table.py: stage budgets as trainer overrides, and the report from run folders' files."""
from __future__ import annotations

import csv
import json

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

import transfer_table  # a benchmark script (tests/conftest.py puts benchmarks/ on the path)


@pytest.mark.parametrize("epochs, expected", [(0.25, ("1", "0.25")), (1.0, ("1", "1.0")), (1.5, ("2", "0.75")),
                                              (15, ("15", "1.0"))])
def test_epochs_of_images_become_whole_epochs_of_equal_fractions(epochs, expected):
    overrides = transfer_table.epoch_overrides(epochs)
    assert overrides == [f"trainer.max_epochs={expected[0]}", f"++trainer.limit_train_batches={expected[1]}"]
    # Hydra must hand Lightning a float: an int limit is a batch count (1 would train one batch per epoch)
    limit = OverridesParser.create().parse_overrides(overrides[1:])[0].value()
    assert isinstance(limit, float)


def _write(path, payload):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


def test_report_sets_each_stage_beside_scratch_and_teacher(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    _write(work / "teacher" / "metrics.json", {"val/acc1": 0.48, "best_score": 0.5})
    _write(work / "vit_linear" / "loaded.json", {"val/acc1": 0.1, "num_images": 5000})
    _write(work / "vit_linear" / "stage1" / "metrics.json", {"val/acc1": 0.3, "val/transfer_loss": 0.02,
                                                             "global_step": 4})
    _write(work / "vit_linear" / "stage1" / "wall_s.json", {"wall_s": 120.0})
    _write(work / "vit_linear" / "stage2" / "metrics.json", {"val/acc1": 0.48, "global_step": 8})
    _write(work / "vit_hedgehog" / "loaded.json", {"val/acc1": 0.2, "num_images": 5000})  # stages not run

    rows = transfer_table.collect(work, ["vit_linear", "vit_hedgehog", "vit_agent"])
    transfer_table.write_report(rows, out, work)

    with open(out / "results.csv") as f:
        table = {row["preset"]: row for row in csv.DictReader(f)}
    assert set(table) == {"vit_linear", "vit_hedgehog"}  # nothing run for agent: no row
    linear = table["vit_linear"]
    assert float(linear["% of teacher"]) == pytest.approx(96.0)  # stage 2 over the teacher's exported checkpoint
    assert float(linear["from scratch"]) == pytest.approx(transfer_table.scratch_accuracy()["vit_linear"])
    assert float(linear["stage 1 min"]) == pytest.approx(2.0)
    assert table["vit_hedgehog"]["stage 2"] == "" and table["vit_hedgehog"]["% of teacher"] == ""
    md = (out / "results.md").read_text()
    assert "| linear (elu+1) | vit_linear | 10.0 | 30.0 | 48.0 |" in md
    assert "| 20.0 | - | - |" in md
    assert (out / "transfer.png").stat().st_size > 0

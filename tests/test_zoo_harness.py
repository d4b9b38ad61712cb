"""benchmarks/zoo.py end to end on a tiny JPEG tree: train, profile, eval and report fill every column."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import cv2
import numpy as np
import pytest
import torch

from conftest import ROOT
from vitzoo.robustness.mce import BENCHMARK
from zoo_plan import BUDGETS
from zoo_results import CORRUPTION_15X5, PGD_2, PGD_CHECK

CLASSES = [f"c{i}" for i in range(10)]


def _jpeg_tree(root, per_class=12):
    rng = np.random.default_rng(0)
    for label, name in enumerate(CLASSES):
        (root / "train" / name).mkdir(parents=True)
        for i in range(per_class):  # a class-dependent tint, so the labels carry some signal
            image = rng.integers(0, 96, (32, 32, 3), dtype=np.uint8) + np.uint8(16 * (label % 10))
            cv2.imwrite(str(root / "train" / name / f"{i}.jpg"), image)


# the recipe of the tiny runs: a run merges into a table only when trained with the same overrides
RECIPE = "--override trainer.max_epochs=1 --override data.batch_size=16 --override data.num_workers=0".split()


def _zoo(*args):
    return subprocess.run(
        [sys.executable, "benchmarks/zoo.py", *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=900
    )


@pytest.mark.slow
def test_harness_trains_profiles_evaluates_and_tabulates(tmp_path):
    _jpeg_tree(tmp_path / "data")
    work, out = tmp_path / "work", tmp_path / "report"
    args = ["--budget", "cpu", "--data", tmp_path / "data", "--work", work, "--out", out]
    args += [*"--presets vit_softmax --batch-size 8 --steps 1".split(), *RECIPE]
    result = _zoo(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]

    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["preset"], r["seed"]) for r in rows] == [
        ("vit_softmax", "0"),
        ("vit_softmax", "1"),
    ]
    for row in rows:
        assert all(value not in ("", "None") for value in row.values()), row
        assert 0.0 <= float(row["val acc"]) <= 1.0 and 0.0 < float(row["entropy init"]) <= 1.0 + 1e-6
    table = (out / "results.md").read_text()
    assert "| softmax | `vit_softmax` | 0,1 |" in table and "with `trainer.max_epochs=1 data.batch_size=16" in table
    assert "img/s (training step, batch 8)" in table and f"torch {torch.__version__} for every row" in table
    assert {row["torch"] for row in rows} == {torch.__version__}
    for png in ("summary.png", "corruptions.png", "logit_noise.png", "resolution.png"):
        assert (out / png).stat().st_size > 0

    again = _zoo(*args)  # every phase resumes: nothing is retrained or re-evaluated
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stdout.count(": done") == 2 and "[eval] done" in again.stdout

    for row in rows:  # the table's numbers are those of the run's eval records
        saved = json.loads((out / "per-run" / f"{row['preset']}-s{row['seed']}.json").read_text())
        records = saved["robustness"]["records"]
        gauss = [r["acc1"] for r in records if r["test"] == "gaussian_noise"]
        assert float(row["gauss sev1-5"]) == pytest.approx(sum(gauss) / len(gauss)) and len(gauss) == 5
        largest = max(r["level"] for r in records if r["test"] == "resolution")
        assert largest == 2 * saved["robustness"]["img_size"]
        assert float(row["2x res"]) == pytest.approx(
            next(r["acc1"] for r in records if r["test"] == "resolution" and r["level"] == largest)
        )
        corrupted = [r["acc1"] for r in records if r["test"] in BENCHMARK]
        assert len(corrupted) == 75 and float(row[CORRUPTION_15X5]) == pytest.approx(sum(corrupted) / 75)
        pgd = next(r for r in records if r["test"] == "pgd_linf")
        assert pgd["level"] == 2 and float(row[PGD_2]) == pytest.approx(pgd["acc1"]) and row[PGD_CHECK] == "ok"

    # Another call (another machine: its own work and out dirs) trains one more preset; its result files merge into
    # the first table, which then holds every row and draws every run's curves.
    work2, out2 = tmp_path / "work2", tmp_path / "report2"
    more = [work2 if a == work else out2 if a == out else a for a in args]
    more[more.index("vit_softmax")] = "nonlocal_resnet_linear"
    added = _zoo(*more, "--per-run")  # as on a GPU loan: the run's eval and result file before any next run
    assert added.returncode == 0, added.stdout[-3000:] + added.stderr[-3000:]
    assert (work2 / "nonlocal_resnet_linear" / "seed0" / "eval" / "robustness.json").is_file()
    assert not (work2 / "eval").exists()
    shipped = json.loads((out2 / "per-run" / "nonlocal_resnet_linear-s0.json").read_text())
    assert len(shipped["robustness"]["records"]) == len(saved["robustness"]["records"])  # the same sweep
    shipped["profile"]["torch"] = shipped["row"]["torch"] = "0.0.1"  # as if profiled under another torch
    (out2 / "per-run" / "nonlocal_resnet_linear-s0.json").write_text(json.dumps(shipped))
    merged = _zoo(
        "--budget", "cpu", "--phases", "report", "--work", work, "--out", out, *RECIPE, "--merge", out2 / "per-run"
    )
    assert merged.returncode == 0, merged.stdout[-3000:] + merged.stderr[-3000:]
    assert "nonlocal_resnet_linear-s0.json: added from" in merged.stdout
    with open(out / "results.csv") as f:
        presets = [r["preset"] for r in csv.DictReader(f)]
    assert presets == ["vit_softmax", "vit_softmax", "nonlocal_resnet_linear"]
    table = (out / "results.md").read_text()
    assert "3 runs, one result file each" in table and "No sweep curves" not in table
    assert f"torch {torch.__version__} for `vit_softmax`; " in table
    assert "torch 0.0.1 for `nonlocal_resnet_linear`" in table

    # A run trained with another recipe does not merge into this table; nothing is written.
    shipped["overrides"] = ["trainer.max_epochs=3"]
    (tmp_path / "other.json").write_text(json.dumps(shipped))
    before = sorted(p.read_text() for p in (out / "per-run").iterdir())
    refused = _zoo(
        "--budget",
        "cpu",
        "--phases",
        "report",
        "--work",
        tmp_path / "none",
        "--out",
        out,
        "--merge",
        tmp_path / "other.json",
    )
    assert refused.returncode != 0 and "report it into another --out" in refused.stderr
    assert sorted(p.read_text() for p in (out / "per-run").iterdir()) == before


def _evaluated(preset, seed, corrupted, pgd, fgsm):
    """A result file whose eval records hold the 15 corruptions x 5 severities (accuracy ``corrupted(c, s)``) and
    PGD / FGSM at 2/255, as the zoo's eval phase writes them."""
    import zoo_results

    key, rec = f"{preset}_s{seed}", {"num_images": 100}
    records = [{**rec, "checkpoint": key, "test": "clean", "level": 0, "acc1": 0.6}]
    records += [
        {**rec, "checkpoint": key, "test": c, "level": s, "acc1": corrupted(i, s)}
        for i, c in enumerate(BENCHMARK)
        for s in range(1, 6)
    ]
    records.append({**rec, "checkpoint": key, "test": "pgd_linf", "level": 2.0, "acc1": pgd, "fgsm_acc1": fgsm})
    return zoo_results.build(
        "cpu",
        preset,
        preset,
        seed,
        "zoo_cpu",
        [],
        {"val/acc1": 0.6},
        {},
        {"sweep": {}, "img_size": 32, "protocol": "cifar", "records": records},
    )


def test_table_takes_15x5_and_pgd_from_the_records_and_says_why_a_cell_is_empty(tmp_path):
    import zoo_results
    import zoo_table

    good = _evaluated("vit_softmax", 0, lambda i, s: 0.5 - 0.01 * i - 0.02 * s, pgd=0.2, fgsm=0.3)
    # mean over 15 x 5 of 0.5 - 0.01 i - 0.02 s = 0.5 - 0.01 * 7 - 0.02 * 3
    assert good["row"][CORRUPTION_15X5] == pytest.approx(0.37) and good["row"][PGD_2] == 0.2
    broken = _evaluated("vit_linear", 0, lambda i, s: 0.4, pgd=0.5, fgsm=0.3)  # PGD above FGSM: a broken attack
    assert broken["row"][PGD_2] is None and broken["row"][PGD_CHECK].startswith("failed: PGD above FGSM")
    assert broken["row"][CORRUPTION_15X5] == pytest.approx(0.4)
    old = zoo_results.build("cpu", "agent", "vit_agent", 0, "zoo_cpu", [], {"val/acc1": 0.5}, {}, None)
    kept = zoo_results.build("cpu", "hydra", "vit_hydra", 0, "zoo_cpu", [], {"val/acc1": 0.5}, {}, None)
    del old["row"][CORRUPTION_15X5], old["row"][PGD_2]  # a result file written before these columns existed
    # a second seed whose attack check failed: its PGD cell is "-" beside seed 0's, and no mean is made of one value
    second = _evaluated("vit_softmax", 1, lambda i, s: 0.41, pgd=0.5, fgsm=0.3)
    for run in (good, second):  # the softmax runs were profiled, the others not
        run["profile"], run["row"]["torch"] = {"hardware": "Test CPU, 2 cores"}, "9.9"
    results = sorted([second, good, broken, old, kept], key=zoo_table.order)
    checkpoints = {("vit_hydra", 0)}  # only this run's checkpoint is in the work dir

    zoo_table.write_csv(results, checkpoints, tmp_path / "results.csv")
    with open(tmp_path / "results.csv") as f:
        rows = {r["preset"]: r for r in csv.DictReader(f) if r["seed"] == "0"}
    assert float(rows["vit_softmax"][CORRUPTION_15X5]) == pytest.approx(0.37)
    assert rows["vit_linear"][PGD_2].startswith("attack check failed: PGD above FGSM")
    assert rows["vit_agent"][CORRUPTION_15X5] == rows["vit_agent"][PGD_2] == "not run: no checkpoint"
    assert rows["vit_hydra"][PGD_2] == "not run: eval phase pending"

    zoo_table.write_markdown(results, "cpu", BUDGETS["cpu"], "cmd", checkpoints, [], tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    cells = {line.split(" | ")[1]: line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    at = {name: zoo_table.COLUMNS.index(name) for name in (CORRUPTION_15X5, PGD_2)}
    assert [cells["`vit_softmax`"][i] for i in at.values()] == ["37.0 / 41.0 (mean 39.0)", "20.0 / -"]
    assert cells["`vit_softmax`"][zoo_table.COLUMNS.index("val acc")] == "60.0 / 60.0 (mean 60.0)"
    assert zoo_table._fmt("val acc", [0.5, None, 0.6]) == "50.0 / - / 60.0 (mean 55.0 of 2 seeds)"
    assert zoo_table._fmt("entropy end", [0.81234, None]) == "0.812 / -"
    assert (
        "Profiled on Test CPU, 2 cores, torch 9.9 for `vit_softmax`; not profiled: `vit_agent`, `vit_hydra`, "
        "`vit_linear`." in text
    )
    zoo_table.write_markdown([old, kept], "cpu", BUDGETS["cpu"], "cmd", checkpoints, [], tmp_path / "unprofiled.md")
    assert "Not profiled (the profile phase did not run)" in (tmp_path / "unprofiled.md").read_text()
    assert [cells["`vit_linear`"][i] for i in at.values()] == [
        "40.0",
        "attack check failed: PGD above FGSM at 2/255 (0.500 > 0.300)",
    ]
    assert [cells["`vit_agent`"][i] for i in at.values()] == ["not run: no checkpoint"] * 2
    assert [cells["`vit_hydra`"][i] for i in at.values()] == ["not run: eval phase pending"] * 2
    assert "`not run: no checkpoint`: the run's result file holds no records of these tests" in text
    assert "`not run: eval phase pending`: the run's checkpoint is in the work dir" in text

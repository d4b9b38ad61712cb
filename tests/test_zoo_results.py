"""The zoo's per-run result files: the row follows the records, merging replaces a run, refuses what it cannot use."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import ROOT, run_python

import zoo_results  # noqa: E402

METRICS = {
    "val/acc1": 0.5,
    "entropy_init/blocks.0.attn": 1.0,
    "entropy_init/blocks.1.attn": 0.9,
    "entropy/blocks.0.attn": 0.6,
    "entropy/blocks.1.attn": 0.4,
    "best_ckpt": "/somewhere/best.ckpt",
}
PROFILE = {"params": 10, "flops_per_image": 2e6, "train_img_per_s": 100.0, "peak_train_mb": 50.0, "torch": "9.9"}


def _records(key="p_s0"):
    rec = [{"checkpoint": key, "test": "clean", "level": 0, "acc1": 0.52, "entropy": 0.7}]
    rec += [{"checkpoint": key, "test": "gaussian_noise", "level": s, "acc1": 0.5 - 0.05 * s} for s in range(1, 6)]
    rec += [{"checkpoint": key, "test": "logit_noise", "level": lv, "acc1": 0.5 - 0.1 * lv} for lv in (0, 0.5, 1, 2)]
    rec += [
        {"checkpoint": key, "test": "resolution", "level": px, "acc1": 0.8 - px / 100, "entropy": px / 100}
        for px in (64, 48)
    ]  # out of order: the largest size is the 2x column
    return {"sweep": {"severities": [1, 2, 3, 4, 5]}, "img_size": 32, "records": rec}


def _result(preset="vit_softmax", seed=0, overrides=(), budget="gpu", acc=0.5):
    return zoo_results.build(
        budget, "softmax", preset, seed, "zoo_gpu", list(overrides), {**METRICS, "val/acc1": acc}, PROFILE, _records()
    )


def test_row_follows_records_metrics_and_profile():
    row = _result()["row"]
    assert row["gauss sev1-5"] == pytest.approx(0.5 - 0.05 * 3)
    assert row["logit sigma=1"] == pytest.approx(0.4) and row["eval clean acc"] == 0.52
    assert row["2x res"] == pytest.approx(0.16) and row["entropy 2x res"] == pytest.approx(0.64)
    assert row["entropy init"] == pytest.approx(0.95) and row["entropy end"] == pytest.approx(0.5)
    assert row["MFLOPs/img"] == 2.0 and row["torch"] == "9.9"
    assert "best_ckpt" not in _result()["metrics"]  # no local paths travel
    untested = zoo_results.build("gpu", "softmax", "p", 0, "zoo_gpu", [], METRICS, {}, None)["row"]
    assert untested["val acc"] == 0.5 and untested["gauss sev1-5"] is None and untested["params"] is None


def test_merge_adds_replaces_and_keeps(tmp_path):
    folder, incoming = tmp_path / "per-run", tmp_path / "in"
    zoo_results.write(_result("vit_softmax"), incoming)
    zoo_results.write(_result("vit_linear"), incoming)
    lines = zoo_results.merge([incoming], folder, "gpu")
    assert [line.split(":")[0] for line in lines] == ["vit_linear-s0.json", "vit_softmax-s0.json"]
    assert all("added from" in line for line in lines)
    assert zoo_results.merge([incoming / "vit_linear-s0.json"], folder, "gpu") == ["vit_linear-s0.json: unchanged"]
    zoo_results.write(_result("vit_linear", acc=0.9), tmp_path / "newer")
    assert "replaced" in zoo_results.merge([tmp_path / "newer"], folder, "gpu")[0]
    by_preset = {r["preset"]: r["row"]["val acc"] for r in zoo_results.load_all(folder, "gpu")}
    assert by_preset == {"vit_softmax": 0.5, "vit_linear": 0.9}
    # The same training without its eval (a work dir whose eval was deleted) does not replace the evaluated file.
    bare = zoo_results.build(
        "gpu", "softmax", "vit_linear", 0, "zoo_gpu", [], {**METRICS, "val/acc1": 0.9}, PROFILE, None
    )
    (line,) = zoo_results.add([("bare", bare)], folder, "gpu")
    assert line.startswith("vit_linear-s0.json: kept") and "eval missing" in line
    assert zoo_results.load_all(folder, "gpu")[0]["robustness"]["records"]


def test_merge_refuses_another_recipe_budget_or_format_and_writes_nothing(tmp_path):
    folder = tmp_path / "per-run"
    zoo_results.write(_result("vit_softmax"), folder)
    before = sorted(p.read_text() for p in folder.iterdir())
    cases = {
        "recipe.json": (_result("vit_linear", overrides=["trainer.max_epochs=3"]), "report it into another --out"),
        "budget.json": (_result("vit_linear", budget="cpu"), "merge it with --budget cpu"),
        "format.json": ({**_result("vit_linear"), "format": 99}, "this harness reads format 1"),
        "other.json": ({"hello": 1}, "not a zoo result file (no format, budget"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_text(json.dumps(content))
        good = tmp_path / "good" / "vit_efficient-s0.json"
        zoo_results.write(_result("vit_efficient"), good.parent)
        with pytest.raises(SystemExit, match=message.replace("(", r"\(")):
            zoo_results.merge([good, tmp_path / name], folder, "gpu")  # the good file first: still not written
        assert sorted(p.read_text() for p in folder.iterdir()) == before
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(SystemExit, match="not a readable zoo result file"):
        zoo_results.merge([tmp_path / "broken.json"], folder, "gpu")
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="no result files"):
        zoo_results.merge([tmp_path / "empty"], folder, "gpu")
    with pytest.raises(SystemExit, match="no such file or folder"):
        zoo_results.merge([tmp_path / "missing.json"], folder, "gpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_gpu_budget_without_a_gpu_is_one_line_naming_the_ways_on():
    result = run_python("benchmarks/zoo.py", "--budget", "gpu", "--data", ROOT, "--presets", "vit_softmax")
    assert result.returncode != 0 and result.stderr.strip().count("\n") == 0
    assert "--budget cpu, or --phases report --merge" in result.stderr

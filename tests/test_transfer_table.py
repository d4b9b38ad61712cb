"""benchmarks/transfer_table.py: stage budgets as trainer overrides, and the report from run folders' files."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser

import transfer_table  # a benchmark script (tests/conftest.py puts benchmarks/ on the path)


@pytest.mark.parametrize(
    "epochs, expected", [(0.25, ("1", "0.25")), (1.0, ("1", "1.0")), (1.5, ("2", "0.75")), (15, ("15", "1.0"))]
)
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
    _write(
        work / "vit_linear" / "stage1" / "metrics.json", {"val/acc1": 0.3, "val/transfer_loss": 0.02, "global_step": 4}
    )
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


def _robustness(folder, label, corruption=0.4, pgd=0.1, check="ok"):
    summary = {
        "published": {"mean_corruption_acc1": corruption},
        "pgd_linf_acc1": {"2/255": pgd},
        "attack_check": check,
    }
    _write(folder / "robustness" / "robustness.json", {"summary": {label: summary}})


def test_report_sets_each_rows_robustness_beside_the_teachers_and_says_why_a_cell_is_empty(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    _write(work / "teacher" / "metrics.json", {"best_score": 0.7, "epoch": 15, "global_step": 5265})
    (work / "teacher" / ".hydra").mkdir(parents=True)
    (work / "teacher" / ".hydra" / "config.yaml").write_text("data:\n  batch_size: 128\ntrainer:\n  max_epochs: 15\n")
    _robustness(work / "teacher", "teacher", 0.46, 0.135)
    for preset in ("vit_linear", "vit_agent", "vit_window", "vit_hedgehog"):
        _write(work / preset / "loaded.json", {"val/acc1": 0.1, "num_images": 5000})
    for preset in ("vit_linear", "vit_agent", "vit_window"):  # hedgehog's stage 2 has not finished
        _write(work / preset / "stage2" / "metrics.json", {"val/acc1": 0.6, "global_step": 8})
    _robustness(work / "vit_linear", "vit_linear", 0.44, 0.189)
    _robustness(work / "vit_window", "vit_window", 0.41, 0.3, check="failed: PGD above FGSM at 2/255 (0.300 > 0.200)")

    rows = transfer_table.collect(work, ["vit_linear", "vit_agent", "vit_window", "vit_hedgehog"])
    transfer_table.write_report(rows, out, work)
    with open(out / "results.csv") as f:
        table = {row["preset"]: row for row in csv.DictReader(f)}
    corruption, pgd = "mean corruption accuracy (15x5)", "PGD L-inf 2/255"
    assert float(table["vit_linear"][corruption]) == 0.44 and float(table["vit_linear"][pgd]) == 0.189
    assert all(
        float(row[f"teacher {corruption}"]) == 0.46 and float(row[f"teacher {pgd}"]) == 0.135 for row in table.values()
    )
    assert (table["vit_agent"][corruption], table["vit_agent"][pgd]) == ("not evaluated", "not evaluated")
    assert (table["vit_hedgehog"][corruption], table["vit_hedgehog"][pgd]) == ("no checkpoint", "no checkpoint")
    assert (table["vit_window"][corruption], table["vit_window"][pgd]) == ("0.41", "attack check failed")
    md = (out / "results.md").read_text()
    assert "| 44.0 | 18.9 | 46.0 | 13.5 |" in md
    assert "- teacher: vit_softmax, 15 epochs, 673,920 training images, val top-1 70.0%" in md  # from its run
    assert transfer_table.teacher_training(tmp_path / "nothing") is None


def test_robustness_phase_evaluates_the_best_checkpoint_on_the_tables_split_once(tmp_path, monkeypatch):
    run = tmp_path / "work" / "vit_linear" / "stage2"
    _write(run / "metrics.json", {"best_ckpt": str(run / "checkpoints" / "best.ckpt")})
    (run / ".hydra").mkdir()
    (run / ".hydra" / "config.yaml").write_text("data:\n  val_fraction: 0.1\n  split_seed: 3\n  batch_size: 128\n")
    calls = []

    def eval_py(cmd, log):
        calls.append(cmd)
        _write(run.parent / "robustness" / "robustness.json", {"summary": {}})

    monkeypatch.setattr(transfer_table, "run_logged", eval_py)
    for _ in range(2):  # the second call finds the record: done
        transfer_table.evaluate_robustness("vit_linear", run, tmp_path / "data")
    transfer_table.evaluate_robustness("vit_agent", tmp_path / "work" / "vit_agent" / "stage2", tmp_path / "data")
    assert len(calls) == 1  # agent's stage 2 has not finished: skipped
    cmd = calls[0][1:]
    assert cmd[:2] == ["eval.py", f"ckpt_path={{vit_linear: {run / 'checkpoints' / 'best.ckpt'}}}"]
    assert {
        "data.val_fraction=0.1",
        "data.split_seed=3",
        f"data.root={tmp_path / 'data'}",
        "robustness=benchmark",
        "robustness.adversarial=[2]",
        "robustness.max_images=1000",
        "robustness.logit_noise=[]",
        f"hydra.run.dir={run.parent / 'robustness'}",
    } <= set(cmd)
    assert (run.parent / "robustness" / "wall_s.json").is_file()


def test_a_tagged_variant_is_its_own_row_beside_the_plain_run(tmp_path, monkeypatch):
    work, out = tmp_path / "work", tmp_path / "out"
    _write(work / "teacher" / "metrics.json", {"best_score": 0.5})
    for name, acc in (("vit_linear", 0.45), (transfer_table.run_name("vit_linear", "distill"), 0.47)):
        _write(work / name / "loaded.json", {"val/acc1": 0.1, "num_images": 5000})
        _write(work / name / "stage2" / "metrics.json", {"val/acc1": acc, "global_step": 8})
    assert transfer_table.run_name("vit_linear", "distill") == "vit_linear-distill"
    assert transfer_table.split_name("vit_linear_relu-qk_freeze") == ("vit_linear_relu", "qk_freeze")

    rows = transfer_table.collect(work, ["vit_linear", "vit_linear-distill"])
    transfer_table.write_report(rows, out, work)
    plain, variant = rows
    assert (plain["mechanism"], variant["mechanism"]) == ("linear (elu+1)", "linear (elu+1), distill")
    assert variant["preset"] == "vit_linear-distill" and variant["stage 2"] == 0.47
    assert variant["from scratch"] == plain["from scratch"] == transfer_table.scratch_accuracy()["vit_linear"]

    # a tagged call's report sets the variant under its plain run (it does not drop the plain rows)
    monkeypatch.setattr(
        "sys.argv",
        [
            "transfer_table.py",
            "--phases",
            "report",
            "--work",
            str(work),
            "--out",
            str(out / "tagged"),
            "--presets",
            "vit_linear",
            "--tag",
            "distill",
        ],
    )
    transfer_table.main()
    with open(out / "tagged" / "results.csv") as f:
        assert [row["preset"] for row in csv.DictReader(f)] == ["vit_linear", "vit_linear-distill"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--override", "transfer.distill=1.0"], "give it a --tag"),
        (["--tag", "kd/1", "--override", "transfer.distill=1.0"], "letters, digits and _ only"),
    ],
)
def test_a_variant_needs_a_plain_tag(args, message, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["transfer_table.py", "--phases", "report", *args])
    with pytest.raises(SystemExit, match=message):
        transfer_table.main()


def test_the_pyramid_budget_converts_its_rows_from_the_zoos_softmax_row(tmp_path):
    """--budget pyramid: the teacher is the pyramid zoo's softmax PVTv2-b0 (trained as the zoo trains it), and each
    student is its zoo row's model and attention under the 64 px transfer recipe, started from the teacher's export;
    the cpu budget's arguments are the ViT table's."""
    from zoo_plan import BUDGETS, budget_rows, compose

    data, teacher = tmp_path / "data", tmp_path / "teacher"
    row = transfer_table.teacher_row("pyramid")
    assert (row.preset, row.model) == ("pvt_v2_b0_softmax", "pvt_v2_b0")
    assert transfer_table.teacher_args("pyramid", data, 2) == [
        "experiment=zoo_pyramid",
        "model=pvt_v2_b0",
        f"data.root={data}",
        "++model.attention={name:softmax}",
        "++model.kwargs.drop_path_rate=0.0",
        "trainer.max_epochs=2",
        "++trainer.limit_train_batches=1.0",
    ]
    zoo = {r.preset: r for r in budget_rows(BUDGETS["pyramid"])}
    for preset, attention in (
        ("pvt_v2_b0_focused_linear", "focused_linear"),
        ("pvt_v2_b0_pola", "pola"),
        ("pvt_v2_b0_linear", "linear"),
    ):
        args = transfer_table.stage_args(preset, data, teacher, budget="pyramid")
        assert args == [
            "experiment=transfer_pyramid",
            "model=pvt_v2_b0",
            f"data.root={data}",
            f"model.init_from={teacher / 'export'}",
            *zoo[preset].overrides,  # the zoo row's attention in every stage, no drop-path
        ]
        assert f"++model.attention={{name:{attention}," in args[4]
    cfg = compose("train", [*args, "transfer.stage=1"])  # the last row's, composed as train.py sees it
    assert cfg.data.img_size == 64 and cfg.data.batch_size == 128 and cfg.module.optim.lr == 2e-3
    assert cfg.transfer.stage == 1 and cfg.transfer.distill == 0 and cfg.model.attention.feature_map == "elu"
    assert transfer_table.stage_args("vit_linear", data, teacher) == [  # the ViT table's, unchanged
        "experiment=transfer_cpu",
        "model=vit_linear",
        f"data.root={data}",
        f"model.init_from={teacher / 'export'}",
        "++model.kwargs.embed_dim=128",
        "++model.kwargs.depth=6",
        "++model.kwargs.num_heads=4",
        "++model.kwargs.mlp_ratio=2.0",
        "++model.kwargs.drop_path_rate=0.0",
    ]
    assert transfer_table.teacher_args("cpu", data, 2)[:3] == [
        "experiment=zoo_cpu",
        "model=vit_softmax",
        f"data.root={data}",
    ]
    with pytest.raises(SystemExit, match="not a row of the pyramid budget"):
        transfer_table.stage_args("vit_linear", data, teacher, budget="pyramid")


def test_a_pyramid_report_reads_the_given_teacher_run_and_the_pyramid_zoos_scratch_rows(tmp_path, monkeypatch):
    work, out, zoo_run = tmp_path / "work", tmp_path / "out", tmp_path / "zoo" / "pvt_v2_b0_softmax" / "seed0"
    _write(zoo_run / "metrics.json", {"best_score": 0.55, "epoch": 2, "global_step": 702})
    (zoo_run / ".hydra").mkdir()
    (zoo_run / ".hydra" / "config.yaml").write_text("data:\n  batch_size: 128\n  img_size: 64\ntrainer: {}\n")
    _robustness(work / "teacher", "teacher", 0.5, 0.2)  # the teacher's record: in the work folder, not the zoo's run
    _write(work / "pvt_v2_b0_pola" / "loaded.json", {"val/acc1": 0.1, "num_images": 5000})
    _write(work / "pvt_v2_b0_pola" / "stage2" / "metrics.json", {"val/acc1": 0.44, "global_step": 8})
    per_run = tmp_path / "docs" / "pyramid" / "per-run"
    for preset, seed, acc in (("pvt_v2_b0_pola", 0, 0.5), ("pvt_v2_b0_pola", 1, 0.3)):
        _write(
            per_run / f"{preset}-s{seed}.json",
            {
                **dict(format=1, budget="pyramid", label="PolaFormer", preset=preset, seed=seed),
                **dict(recipe="zoo_pyramid", overrides=[], row={"val acc": acc}),
                **dict(metrics={"global_step": 702}, profile={"batch_size": 128}),
            },
        )
    monkeypatch.setattr(transfer_table, "scratch_dir", lambda budget: tmp_path / "docs" / budget / "per-run")

    _write(work / "pvt_v2_b0_softmax" / "loaded.json", {"val/acc1": 0.55, "num_images": 5000})
    _write(work / "pvt_v2_b0_softmax" / "stage2" / "metrics.json", {"val/acc1": 0.54, "global_step": 8})

    rows = transfer_table.collect(work, ["pvt_v2_b0_pola", "pvt_v2_b0_softmax"], "pyramid", zoo_run)
    transfer_table.write_report(rows, out, work, "pyramid", zoo_run)
    row, control = rows
    assert control["mechanism"] == "softmax (control)"  # the teacher's own mechanism through the same stages
    assert (row["mechanism"], row["teacher"], row["from scratch"]) == ("PolaFormer", 0.55, 0.5)  # seed 0's
    assert row["% of teacher"] == pytest.approx(80.0)
    assert (row["teacher mean corruption accuracy (15x5)"], row["teacher PGD L-inf 2/255"]) == (0.5, 0.2)
    md = (out / "results.md").read_text()
    assert "- teacher: pvt_v2_b0_softmax, 2 epochs, 89,856 training images, val top-1 55.0%" in md
    assert "from scratch: docs/zoo/pyramid, 89,856 training images" in md


def test_a_report_on_a_machine_without_the_runs_keeps_their_rows_and_reads_from_scratch_again(tmp_path, monkeypatch):
    """The table is made where the runs are; a report elsewhere (once the zoo has a from-scratch row the table lacked)
    keeps each row and the notes as they were and fills the from-scratch cell, rather than writing an empty table."""
    work, out, zoo_run = tmp_path / "work", tmp_path / "out", tmp_path / "zoo" / "pvt_v2_b0_softmax" / "seed0"
    _write(zoo_run / "metrics.json", {"best_score": 0.55, "epoch": 2, "global_step": 702})
    (zoo_run / ".hydra").mkdir()
    (zoo_run / ".hydra" / "config.yaml").write_text("data:\n  batch_size: 128\n  img_size: 64\ntrainer: {}\n")
    _write(work / "pvt_v2_b0_pola" / "loaded.json", {"val/acc1": 0.1, "num_images": 5000})
    _write(work / "pvt_v2_b0_pola" / "stage2" / "metrics.json", {"val/acc1": 0.44, "global_step": 8})
    _robustness(work / "pvt_v2_b0_pola", "pvt_v2_b0_pola", 0.4, 0.1)
    per_run = tmp_path / "docs" / "pyramid" / "per-run"
    monkeypatch.setattr(transfer_table, "scratch_dir", lambda budget: per_run)
    names = ["pvt_v2_b0_pola", "pvt_v2_b0_linear"]
    transfer_table.report(work, names, "pyramid", zoo_run, out)
    before = (out / "results.md").read_text()
    assert "| PolaFormer | pvt_v2_b0_pola | 10.0 | - | 44.0 | - | 55.0 | 80.0 |" in before
    assert "pvt_v2_b0_linear" not in before  # not run: no row

    _write(
        per_run / "pvt_v2_b0_pola-s0.json",
        {
            **dict(format=1, budget="pyramid", label="PolaFormer", preset="pvt_v2_b0_pola", seed=0),
            **dict(recipe="zoo_pyramid", overrides=[], row={"val acc": 0.5}),
            **dict(metrics={"global_step": 702}, profile={"batch_size": 128}),
        },
    )
    shutil.rmtree(work)
    shutil.rmtree(zoo_run)
    transfer_table.report(work, names, "pyramid", zoo_run, out)
    after = (out / "results.md").read_text()
    assert "| PolaFormer | pvt_v2_b0_pola | 10.0 | - | 44.0 | 50.0 | 55.0 | 80.0 |" in after  # from scratch filled
    assert after.replace(" 50.0 |", " - |", 1) == before.replace(
        "from scratch: docs/zoo/pyramid", "from scratch: docs/zoo/pyramid, 89,856 training images"
    )  # everything else as it was: the robustness cells, the teacher's note
    assert "| 40.0 | 10.0 |" in after
    assert json.loads((out / "context.json").read_text())["val images"] == 5000

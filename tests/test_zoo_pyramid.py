"""The zoo's pyramid budget: its rows build what they name at the recipe's size, beside the ViT rows."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import vitzoo
import zoo_results
import zoo_table
from vitzoo.attention import ZooAttention
from vitzoo.attention.registry import resolve_attention
from zoo_plan import BUDGETS, PRESETS, budget_rows, compose, plan, recipe_data

PYRAMID = BUDGETS["pyramid"]


def _built(row):
    cfg = compose("train", [f"experiment={PYRAMID.experiment}", f"model={row.model}", *row.overrides])
    kwargs = OmegaConf.to_container(cfg.model.kwargs)
    attention = OmegaConf.to_container(cfg.model.attention)
    return cfg, vitzoo.create_model(
        cfg.model.arch, attention=attention, img_size=cfg.data.img_size, num_classes=10, **kwargs
    )


def test_the_pyramid_recipe_is_the_cpu_recipe_at_64_px():
    cpu, pyramid = (OmegaConf.to_container(recipe_data(BUDGETS[b])) for b in ("cpu", "pyramid"))
    assert pyramid.pop("img_size") == 64 and cpu.pop("img_size") == 32
    assert pyramid == cpu


def test_the_vit_budgets_train_no_pyramid():
    names = {row.preset for row in budget_rows(BUDGETS["cpu"])}
    assert names == {p for _, p in PRESETS if p.startswith(("vit_", "nonlocal_"))}
    assert "pvt_v2_b0" not in names and len(names) > 30


@pytest.mark.parametrize("row", budget_rows(PYRAMID), ids=lambda r: r.preset)
def test_each_pyramid_row_runs_its_mechanism_in_every_stage(row):
    cfg, model = _built(row)
    layers = [m for m in model.modules() if isinstance(m, ZooAttention)]
    assert len(layers) == 8  # two blocks in each of four stages
    if row.model == "pvt_v2_b0":  # the ViT row's mechanism, as its preset spells it
        wanted = OmegaConf.load(Path("configs/model") / f"{row.mechanism}.yaml").attention.name
        assert {type(m) for m in layers} == {resolve_attention(wanted)[0]}
    assert cfg.model.kwargs.drop_path_rate == 0.0  # as the cpu ViTs: no drop-path in 2 epochs
    logits = model(torch.randn(2, 3, 64, 64))
    assert logits.shape == (2, 10) and torch.isfinite(logits).all()
    assert 2.8e6 < sum(p.numel() for p in model.parameters()) < 3.5e6  # PVTv2-b0's size (3.4M with 10 classes)


def test_every_row_has_its_first_seed_before_any_second(tmp_path):
    runs = plan(PYRAMID, tmp_path, None)
    first_second = next(i for i, r in enumerate(runs) if r.seed == 1)
    assert all(r.seed == 0 for r in runs[:first_second]) and all(r.seed == 1 for r in runs[first_second:])
    assert {r.preset for r in runs if r.seed == 1} == {"pvt_v2_b0_softmax", "pvt_v2_b0_linear"}


def test_seeds_picks_the_second_seeds_alone_and_names_the_seeds_a_preset_has(tmp_path):
    runs = plan(PYRAMID, tmp_path, None, seeds=[1])
    assert [(r.preset, r.seed) for r in runs] == [("pvt_v2_b0_softmax", 1), ("pvt_v2_b0_linear", 1)]
    assert runs[0].dir == tmp_path / "pvt_v2_b0_softmax" / "seed1"
    with pytest.raises(SystemExit, match=r"seed\(s\) \[1\]; their seeds are \[0\]"):
        plan(PYRAMID, tmp_path, ["pvt_v2_b0_pola"], seeds=[1])


def test_the_table_sets_each_row_beside_the_vit_row_of_its_mechanism(tmp_path):
    (tmp_path / "cpu").mkdir()
    with open(tmp_path / "cpu" / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["mechanism", "preset", "seed", "val acc", zoo_results.CORRUPTION_15X5, zoo_results.PGD_2])
        writer.writerow(["linear (elu+1)", "vit_linear", 0, 0.453, 0.41, "not run: no checkpoint"])
        writer.writerow(["linear (elu+1)", "vit_linear", 1, 0.44, 0.40, 0.1])
    result = zoo_results.build(
        "pyramid", "linear (elu+1)", "pvt_v2_b0_linear", 0, "zoo_pyramid", [], {"val/acc1": 0.5}, {}, None
    )
    lines = zoo_table.beside([result], PYRAMID, tmp_path)
    mine = next(i for i, line in enumerate(lines) if "`pvt_v2_b0_linear`" in line)
    assert lines[mine].startswith("| linear (elu+1) | `pvt_v2_b0_linear` | 0 | 50.0 | - | - |")
    assert lines[mine + 1] == (
        "| beside it: linear (elu+1) | `vit_linear` (cpu) | 0,1 | 45.3 / 44.0 | 41.0 / 40.0 | "
        "not run: no checkpoint / 10.0 |"
    )


def test_a_row_profiled_on_two_machines_shows_each_seeds_img_s_not_their_mean():
    def result(seed, hardware, img_s):
        profile = dict(params=3.4e6, flops_per_image=8.7e7, train_img_per_s=img_s, peak_train_mb=670.0 + seed)
        return zoo_results.build(
            "pyramid",
            "softmax",
            "pvt_v2_b0_softmax",
            seed,
            "zoo_pyramid",
            [],
            {"val/acc1": 0.6},
            {**profile, "hardware": hardware, "torch": "2.14.1"},
            None,
        )

    cells = lambda results: zoo_table._table(zoo_table.by_preset(results), set())[2].split(" | ")  # noqa: E731
    at = zoo_table.COLUMNS.index("train img/s")
    mixed = cells([result(0, "Intel(R) Xeon(R) Processor, 2 cores", 298.0), result(1, "AMD EPYC, 2 cores", 190.0)])
    assert (mixed[at], mixed[at + 1]) == ("298 / 190", "670 / 671")
    same = cells([result(0, "AMD EPYC, 2 cores", 298.0), result(1, "AMD EPYC, 2 cores", 190.0)])
    assert (same[at], same[at + 1]) == ("244", "670")  # one machine: the mean

"""data=shards and python -m vitzoo.data.pack: packing, refusals, disjoint ranks, learning, mid-epoch resume."""

from __future__ import annotations

import json
import re
import tarfile
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.utilities import rank_zero_only
from litdata.utilities.env import _DistributedEnv

from conftest import compose_config
from vitzoo.data import shards
from vitzoo.data.pack import main as pack_main, pack
from vitzoo.data.shards import ShardsDataModule
from vitzoo.training import read_checkpoint, train

COLOURS = [(200, 40, 40), (40, 200, 40), (40, 40, 200)]


def _colour_folder(root: Path, per_class: int = 40, size: int = 24) -> Path:
    """train/c<k>/*.jpg: noisy images of one colour per class (learnable through any crop, flip or erasing)."""
    rng = np.random.default_rng(0)
    for label, colour in enumerate(COLOURS):
        folder = root / "train" / f"c{label}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            image = np.clip(np.array(colour)[None, None] + rng.normal(0, 30, (size, size, 3)), 0, 255)
            cv2.imwrite(str(folder / f"{i}.jpg"), image.astype(np.uint8))
    return root


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    counts = pack(_colour_folder(root / "src"), root / "shards", val_fraction=0.25, chunk_bytes="20KB")
    assert counts == {"train": 90, "val": 30}
    return root


def _run(tmp_path: Path, root: Path, *extra: str) -> list:
    return [
        "data=shards",
        f"data.root={root / 'shards'}",
        "data.img_size=16",
        "data.batch_size=15",
        "data.num_workers=0",
        "model=vit_softmax",
        "+model.kwargs.depth=1",
        "+model.kwargs.embed_dim=32",
        "+model.kwargs.num_heads=2",
        "debug=quiet",
        "module.optim.lr=3e-3",
        "callbacks.export_best=null",
        *extra,
    ]


def test_pack_writes_litdata_splits_and_the_classes(packed):
    meta = json.loads((packed / "shards" / "vitzoo.json").read_text())
    assert meta["classes"] == ["c0", "c1", "c2"] and meta["splits"] == {"train": 90, "val": 30}
    assert len(list((packed / "shards" / "train").glob("chunk-*.bin"))) > 1  # several shards to spread over ranks
    src_bytes = sum(f.stat().st_size for f in (packed / "src").rglob("*.jpg"))
    packed_bytes = sum(f.stat().st_size for f in (packed / "shards").rglob("chunk-*.bin"))
    assert src_bytes <= packed_bytes < src_bytes * 1.1  # the files as they are, not re-encoded


def test_an_archive_packs_like_its_folder(packed, tmp_path):
    archive = tmp_path / "src.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(packed / "src" / "train", arcname="train")
    assert pack(archive, tmp_path / "out", val_fraction=0.25, chunk_bytes="20KB") == {"train": 90, "val": 30}
    dm = ShardsDataModule(str(tmp_path / "out"), img_size=16, num_workers=0)
    assert dm.num_classes == 3


def test_pack_refuses_what_it_cannot_read_with_one_line(tmp_path, capsys):
    flat = tmp_path / "flat"
    flat.mkdir()
    cv2.imwrite(str(flat / "a.png"), np.zeros((4, 4, 3), np.uint8))
    broken = _colour_folder(tmp_path / "broken", per_class=3)
    (broken / "train" / "c1" / "9.jpg").write_bytes(b"not an image")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    cases = {
        tmp_path / "missing": "does not exist",
        flat: "is not in a class folder",
        broken: r"cannot read image .*9\.jpg.*remove it or convert it",
        tmp_path / "notes.txt": "nor a tar",
    }
    (tmp_path / "notes.txt").write_text("hello")
    for src, reason in cases.items():
        assert pack_main([str(src), str(tmp_path / "out")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: "), err
        assert re.search(reason, err[0]), err[0]
    assert pack_main([str(_colour_folder(tmp_path / "good", per_class=3)), str(tmp_path / "full")]) == 2
    assert "is not empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_shards_module_names_the_fix_without_a_packed_root(tmp_path):
    with pytest.raises(ValueError, match=r"has no vitzoo.json; pack an image folder first .*-m vitzoo.data.pack"):
        ShardsDataModule(str(tmp_path), num_workers=0)
    with pytest.raises(ValueError, match="data=shards streams its images; set data.device_cache=false"):
        ShardsDataModule(str(tmp_path), num_classes=3, device_cache=True, recipe="cifar")


def test_two_ranks_read_disjoint_shards_covering_the_split(packed):
    dm = ShardsDataModule(str(packed / "shards"), img_size=16, batch_size=5, num_workers=0)
    dm.setup("fit")
    seen = []
    for rank in range(2):
        dataset = dm._split("val", dm.build_recipe(), augment=False)
        dataset.distributed_env = _DistributedEnv(world_size=2, global_rank=rank, num_nodes=1)
        seen.append({image.numpy().tobytes() for images, _ in dm._loader(dataset, train=False) for image in images})
    assert seen[0].isdisjoint(seen[1]) and len(seen[0]) + len(seen[1]) == 30


@pytest.mark.slow
def test_a_packed_set_trains_and_val_accuracy_rises(packed, tmp_path):
    metrics = train(compose_config(tmp_path, _run(tmp_path, packed, "trainer.max_epochs=2")))
    assert metrics["global_step"] == 12 and metrics["val/acc1"] > 0.8, metrics  # 3 classes: chance is 1/3


@pytest.mark.slow
def test_a_run_resumed_mid_epoch_from_shards_equals_the_uninterrupted_one(packed, tmp_path):
    """Crash after step 9 of 12 (epoch 1, batch 3); the resumed run logs and ends with the uninterrupted run's
    numbers: litdata's loader resumes its position (one loader worker), each image's (RandAugment, erasing) draw
    is seeded."""
    base = _run(
        tmp_path,
        packed,
        "trainer.max_epochs=2",
        "data.num_workers=1",
        "data.img_size=32",
        "callbacks.attention_entropy=null",
    )
    full = train(compose_config(tmp_path / "full", base))
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(
            compose_config(
                tmp_path / "crash", [*base, "+callbacks.crash._target_=conftest.CrashAtStep", "+callbacks.crash.step=9"]
            )
        )
    last = tmp_path / "crash" / "checkpoints" / "last.ckpt"
    crashed = read_checkpoint(last)
    assert crashed["global_step"] == 9 and crashed["train_loader"]["num_samples_yielded"] == 45
    resumed = train(compose_config(tmp_path / "resumed", [*base, f"ckpt_path={last}"]))
    same = {key: value for key, value in full.items() if key.startswith(("train/", "val/"))}
    assert {key: resumed[key] for key in same} == same
    final, expected = (read_checkpoint(tmp_path / run / "checkpoints" / "last.ckpt") for run in ("resumed", "full"))
    assert all(torch.equal(final["state_dict"][k], v) for k, v in expected["state_dict"].items())


def test_the_imagenet_recipe_composes_with_shards_and_says_once_what_it_cannot_apply(
    packed, tmp_path, caplog, monkeypatch
):
    """One warning per process (a second data module, another rank: none), naming the setting that drops it."""
    monkeypatch.setattr(shards, "_WARNED", set())
    cfg = compose_config(tmp_path, ["experiment=imagenet_deit", "data=shards", f"data.root={packed / 'shards'}"])
    with caplog.at_level("WARNING"):
        dm = instantiate(cfg.data)
        instantiate(cfg.data)
    assert isinstance(dm, ShardsDataModule) and dm.recipe == "deit" and dm.num_classes == 3
    said = [r.getMessage() for r in caplog.records if "repeated_aug" in r.getMessage()]
    assert said == [
        "data.repeated_aug=3 is not applied by data=shards (litdata draws each image once per epoch): set "
        "data.repeated_aug=1 to run without this warning, or use data=imagefolder for repeated augmentation"
    ]
    caplog.clear()
    monkeypatch.setattr(shards, "_WARNED", set())
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    with caplog.at_level("WARNING"):
        instantiate(cfg.data)
    assert "repeated_aug" not in caplog.text


def test_loader_benchmark_times_both_paths_and_compares_sizes(tmp_path, capsys):
    from loader_throughput import main as benchmark

    benchmark(
        [
            "--work",
            str(tmp_path),
            "--images",
            "24",
            "--classes",
            "3",
            "--measure",
            "8",
            "--batch-size",
            "4",
            "--workers",
            "0",
            "--rounds",
            "1",
            "--out",
            str(tmp_path / "table"),
        ]
    )
    rows = (tmp_path / "table.csv").read_text().splitlines()
    assert rows[0] == "path,workers,images_per_s,vs_imagefolder" and [r.split(",")[:2] for r in rows[1:]] == [
        ["imagefolder", "0"],
        ["shards", "0"],
    ]
    assert float(rows[1].split(",")[3]) == 1.0 and float(rows[2].split(",")[2]) > 0
    assert "shard folder" in (tmp_path / "table.txt").read_text() and "vs folder" in capsys.readouterr().out


def test_a_url_root_passes_the_entry_points_path_check(tmp_path):
    from launch import check_paths

    check_paths(compose_config(tmp_path, ["data=shards", "data.root=s3://bucket/imagenet-shards"]))
    with pytest.raises(SystemExit, match="data.root='/no/such/folder' is not a folder"):
        check_paths(compose_config(tmp_path, ["data=shards", "data.root=/no/such/folder"]))

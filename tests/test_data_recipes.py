"""The deit recipe (timm's transforms), repeated augmentation, and the LR scaling rule of experiment=imagenet_deit."""

from __future__ import annotations

import math
import random
import re
from dataclasses import asdict

import lightning as L
import numpy as np
import pytest
import torch
from hydra.utils import instantiate
from PIL import Image
from timm.data import create_transform, resolve_data_config
from timm.data.random_erasing import RandomErasing
from timm.models import get_pretrained_cfg

from conftest import compose_config, run_python, write_image_folder
from vitzoo.data import DigitsDataModule, ImageFolderDataModule, SyntheticDataModule, build_train_transform
from vitzoo.data.recipes import DEIT_AUG, build_recipe, recipe_aug, source_pretrained_cfg
from vitzoo.data.sampling import EpochSampler, RepeatAugEpochSampler
from vitzoo.options import CifarAugOptions
from vitzoo.training import ImageClassifier, build_run, scaled_lr, train

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _photo(h: int, w: int, seed: int = 0) -> np.ndarray:
    """A smooth colour image (gradients and a disc), more like a photo than noise for resampling checks."""
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    disc = ((y - 0.5) ** 2 + (x - 0.4) ** 2 < 0.05).astype(float)
    rng = np.random.default_rng(seed)
    image = np.stack([x, y, disc * 0.8 + 0.1 * rng.random((h, w))], -1)
    return (image * 255).astype(np.uint8)


def test_deit_train_transform_shape_and_seeding_leave_the_global_generators_alone():
    recipe = build_recipe("deit", 64, MEAN, STD)
    image = _photo(90, 120)
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    outs = []
    for seed in (7, 7, 8):
        recipe.train.set_random_seed(seed)
        outs.append(recipe.train(image=image)["image"])
    assert outs[0].shape == (3, 64, 64) and outs[0].dtype == torch.float32
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    assert random.getstate() == states[0] and np.array_equal(np.random.get_state()[1], states[1])
    assert torch.equal(torch.get_rng_state(), states[2])


def test_randaugment_posterize_at_full_magnitude_keeps_zero_bits():
    """Magnitude 10 (which m9 mstd0.5 draws 2% of the time) asks posterize for 0 bits: a black image, not Pillow's
    'bits must be between 1 and 8' in the middle of an epoch."""
    recipe = build_recipe(
        "deit", 32, (0.0,) * 3, (1.0,) * 3, aug=dict(auto_augment="rand-m10-n3-mstd0-inc1", re_prob=0.0)
    )
    op = next(op for op in recipe.train.transform.transforms[2].ops if op.name == "PosterizeIncreasing")
    assert op.aug_fn(Image.fromarray(_photo(20, 20)), 0).getextrema() == ((0, 0),) * 3
    for seed in range(80):
        recipe.train.set_random_seed(seed)
        assert recipe.train(image=_photo(40, 40, seed))["image"].shape == (3, 32, 32)


def test_deit_erasing_rate_and_area_follow_the_recipe():
    """RandAugment off, a grey image: every pixel normalises to one value except where random erasing wrote noise.
    Erased in 25% of the images (re_prob), each time 2-33% of the area (timm's bounds)."""
    recipe = build_recipe("deit", 32, MEAN, STD, aug=dict(auto_augment=None, color_jitter=None))
    grey = np.full((48, 40, 3), 128, np.uint8)
    plain = (torch.tensor(128 / 255) - torch.tensor(MEAN)) / torch.tensor(STD)
    areas = []
    for seed in range(400):
        recipe.train.set_random_seed(seed)
        out = recipe.train(image=grey)["image"]
        changed = (out - plain[:, None, None]).abs().amax(0) > 1e-4
        if changed.any():
            areas.append(changed.float().mean().item())
    assert 0.18 < len(areas) / 400 < 0.32, len(areas)
    assert min(areas) > 0.015 and max(areas) < 1 / 3 + 0.02, (min(areas), max(areas))


def test_deit_train_statistics_random_resized_crop_and_flip():
    """Only the crop (scale 0.08-1) and the flip: a horizontal ramp comes out increasing or decreasing about half
    the time each, and the range of the ramp a crop keeps is the crop's width, so as often narrow as the scale says."""
    recipe = build_recipe(
        "deit", 32, (0.0,) * 3, (1.0,) * 3, aug=dict(auto_augment=None, color_jitter=None, re_prob=0.0)
    )
    ramp = np.repeat(np.repeat(np.linspace(0, 255, 256).astype(np.uint8)[None, :, None], 256, 0), 3, 2)
    flips, widths = 0, []
    for seed in range(300):
        recipe.train.set_random_seed(seed)
        row = recipe.train(image=ramp)["image"][0, 16]
        flips += int(row[0] > row[-1])
        widths.append(float((row.max() - row.min()).item()))
    assert 110 < flips < 190, flips
    widths = np.array(widths)  # width of the crop as a fraction of the image: sqrt(scale * ratio) in about 0.25-1
    assert widths.min() < 0.4 and widths.max() > 0.9, (widths.min(), widths.max())
    assert 0.5 < np.median(widths) < 0.85, np.median(widths)


@pytest.mark.parametrize("crop_pct", [None, 0.875])
def test_deit_eval_transform_is_timms_for_the_same_pretrained_cfg(tmp_path, crop_pct):
    """A JPEG read through the data module's val split gives the very tensor timm's own eval transform does for
    DeiT-T's pretrained_cfg (crop_pct 0.9, bicubic), or for an explicit data.crop_pct."""
    root = tmp_path / "folder"
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            Image.fromarray(_photo(300, 260, seed=len(name))).save(root / split / name / "0.jpg", quality=90)
    cfg = get_pretrained_cfg("deit_tiny_patch16_224.fb_in1k").to_dict()
    dm = ImageFolderDataModule(str(root), img_size=224, recipe="deit", crop_pct=crop_pct, num_workers=0, batch_size=1)
    dm.pretrained_cfg = cfg
    dm.setup("validate")
    args = {} if crop_pct is None else {"crop_pct": crop_pct}
    timm_tf = create_transform(**resolve_data_config(args, pretrained_cfg=cfg), is_training=False)
    path, label = dm.val_dataset.images[1], dm.val_dataset.labels[1]
    expected = timm_tf(Image.open(path).convert("RGB"))
    image, got_label = dm.val_dataset[1]
    assert torch.equal(image, expected) and got_label == label == 1
    assert image.shape == (3, 224, 224)


def test_source_pretrained_cfg_is_the_weights_own():
    model = ImageClassifier("vit_tiny", "softmax", num_classes=10, img_size=32).model
    assert source_pretrained_cfg("timm:deit_tiny_patch16_224.fb_in1k", model)["crop_pct"] == 0.9
    assert source_pretrained_cfg(None, model) == dict(model.pretrained_cfg)
    assert source_pretrained_cfg("timm:no_such_model.tag", model) == dict(model.pretrained_cfg)


def test_recipe_options_are_checked():
    with pytest.raises(ValueError, match=r"data.recipe='imagenet'.*one of \['cifar', 'deit'\]"):
        SyntheticDataModule(img_size=16, recipe="imagenet")
    with pytest.raises(ValueError, match=r"data.aug \(data.recipe=deit\) has no option.*'policy'"):
        build_recipe("deit", 32, MEAN, STD, aug=dict(policy="basic"))
    with pytest.raises(ValueError, match="data.crop_pct .* belong to data.recipe=deit"):
        build_recipe("cifar", 32, MEAN, STD, crop_pct=0.9)
    with pytest.raises(ValueError, match="data.device_cache=true .* set data.device_cache=false"):
        SyntheticDataModule(img_size=16, recipe="deit", device_cache=True)
    with pytest.raises(ValueError, match="data.repeated_aug=0"):
        SyntheticDataModule(img_size=16, repeated_aug=0)
    assert set(DEIT_AUG) <= set(create_transform.__code__.co_varnames)


def test_repeated_augmentation_spreads_copies_over_ranks_and_resumes():
    data = list(range(60))
    ranks = [RepeatAugEpochSampler(data, num_replicas=3, rank=r, seed=5, num_repeats=3) for r in range(3)]
    draws = [list(s) for s in ranks]
    assert all(len(d) == len(s) == 20 for d, s in zip(draws, ranks))  # an epoch stays len(data) / world per rank
    # world 3, 3 repeats: the ranks draw the same 20 images, each rank its own copy (and so its own augmentation)
    assert [[i for _, i, _ in d] for d in draws[1:]] == [[i for _, i, _ in draws[0]]] * 2
    assert [{c for _, _, c in d} for d in draws] == [{0}, {1}, {2}]
    assert list(RepeatAugEpochSampler(data, num_replicas=3, rank=0, seed=5)) == draws[0]
    assert list(RepeatAugEpochSampler(data, num_replicas=3, rank=0, seed=6)) != draws[0]
    resumed = RepeatAugEpochSampler(data, num_replicas=3, rank=0, seed=5)
    resumed.resume(0, 8)
    assert list(resumed) == draws[0][8:] and list(resumed) == draws[0]
    resumed.set_epoch(1)
    assert [e for e, _, _ in resumed] == [1] * 20 and list(resumed) != draws[0]
    assert isinstance(resumed, torch.utils.data.DistributedSampler)  # Lightning keeps it under DDP


def test_epoch_sampler_draws_are_unchanged_by_the_shared_resume_logic():
    sampler = EpochSampler(list(range(10)), seed=3)
    sampler.set_epoch(2)
    g = torch.Generator().manual_seed(3 + 2)
    assert list(sampler) == [(2, i) for i in torch.randperm(10, generator=g).tolist()]


def test_lr_scaling_rule():
    assert scaled_lr(5e-4, 1024, 512) == pytest.approx(1e-3)
    assert scaled_lr(5e-4, 128, 512) == pytest.approx(1.25e-4)
    with pytest.raises(ValueError, match="module.optim.lr_base_batch=0"):
        scaled_lr(5e-4, 128, 0)


def test_the_peak_lr_follows_the_global_batch(tmp_path):
    """lr_base_batch=8 with batch 16 and 2 accumulated batches: 4 x module.optim.lr, as the optimizer gets it."""
    module = ImageClassifier(
        "vit_cifar",
        "softmax",
        num_classes=10,
        img_size=16,
        optim=dict(lr=1e-3, lr_base_batch=8),
        model_kwargs=dict(depth=1, embed_dim=32, num_heads=2),
    )
    dm = SyntheticDataModule(img_size=16, num_train=64, num_val=16, batch_size=16)
    trainer = L.Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=2,
        accumulate_grad_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, datamodule=dm)
    assert trainer.optimizers[0].param_groups[0]["initial_lr"] == pytest.approx(4e-3)


def test_imagenet_deit_experiment_builds_the_recipe(tmp_path):
    root = write_image_folder(tmp_path / "data", per_class=2, size=(40, 30), suffix=".jpg")
    cfg = compose_config(
        tmp_path / "run",
        [
            "experiment=imagenet_deit",
            f"data.root={root}",
            "data.img_size=32",
            "data.val_fraction=0.5",
            "data.batch_size=2",
            "model=vit_softmax",
        ],
    )
    assert cfg.module.optim.lr_base_batch == 512 and cfg.trainer.max_epochs == 300 and cfg.data.repeated_aug == 3
    datamodule, module = build_run(cfg)
    assert module.mixup is not None and module.mixup.mixup_alpha == 0.8 and module.mixup.cutmix_alpha == 1.0
    assert module.mixup.label_smoothing == 0.1 and module.hparams.model_kwargs["drop_path_rate"] == 0.1
    assert datamodule.pretrained_cfg["crop_pct"] == module.model.pretrained_cfg["crop_pct"]
    datamodule.setup("fit")
    assert "RandAugment" in repr(datamodule.train_dataset.transform)
    assert datamodule.train_dataset[(0, 0)][0].shape == datamodule.val_dataset[0][0].shape == (3, 32, 32)


@pytest.mark.slow
def test_imagenet_deit_trains_on_the_cpu(tmp_path):
    """The whole recipe, shrunk: DeiT transforms, mixup / cutmix, the scaled LR, one CPU process."""
    root = write_image_folder(tmp_path / "data", per_class=8, size=(40, 30), suffix=".jpg")
    metrics = train(
        compose_config(
            tmp_path / "run",
            [
                "experiment=imagenet_deit",
                f"data.root={root}",
                "data.img_size=32",
                "data.val_fraction=0.25",
                "data.batch_size=4",
                "data.num_workers=0",
                "model=vit_softmax",
                "+model.kwargs.depth=1",
                "debug=quiet",
                "trainer.strategy=auto",
                "trainer.devices=1",
                "trainer.precision=32-true",
                "trainer.max_epochs=1",
                "callbacks.export_best=null",
            ],
        )
    )
    assert metrics["global_step"] == 3 and math.isfinite(metrics["train/loss_epoch"]), metrics


def _repr(transform) -> str:
    """A transform's repr without object addresses (timm's reprs name some callables)."""
    return re.sub(r" at 0x[0-9a-f]+", "", repr(transform))


def _erasing(transform) -> float:
    """The random-erasing probability of a deit training transform."""
    (erasing,) = [t for t in transform.transform.transforms if isinstance(t, RandomErasing)]
    return erasing.probability


def test_the_folder_data_takes_the_chosen_recipes_defaults(tmp_path):
    """data.aug is the chosen recipe's training options over its defaults: an image folder that leaves it out
    builds DeiT's transform with data.recipe=deit and the cifar recipe's defaults (CifarAugOptions) without, from
    Python as from data=imagefolder (and eval.py's documented data=imagefolder data.recipe=deit)."""
    root = write_image_folder(tmp_path / "data", per_class=2, size=(40, 30), suffix=".jpg")
    deit = _repr(build_recipe("deit", 32, MEAN, STD, aug=DEIT_AUG).train)
    python = ImageFolderDataModule(str(root), img_size=32, recipe="deit")
    assert python.aug == {} and _repr(python.build_recipe().train) == deit and "RandAugment" in deit
    for name in ("train", "eval"):
        cfg = compose_config(
            tmp_path / name,
            [*(["ckpt_path=x"] if name == "eval" else []), "data=imagefolder", f"data.root={root}", "data.recipe=deit"],
            name=name,
        )
        assert _repr(instantiate(cfg.data, img_size=32).build_recipe().train) == deit, name
    cifar = build_train_transform(32, MEAN, STD, **asdict(CifarAugOptions()))
    assert repr(ImageFolderDataModule(str(root), img_size=32).build_recipe().train) == repr(cifar)
    # a data set's own aug belongs to its own recipe (digits: the cifar recipe's, unmirrored); another starts afresh
    assert DigitsDataModule(recipe="deit").aug == {} and DigitsDataModule(recipe="cifar").aug["hflip"] is False


@pytest.mark.parametrize("experiment", [["experiment=imagenet_deit"], ["data=imagefolder", "data.recipe=deit"]])
def test_one_deit_option_from_the_command_line_reaches_the_transform(tmp_path, experiment):
    """docs/imagenet.md's +data.aug.re_prob=0.1: that key over DEIT_AUG, the others as they are."""
    root = write_image_folder(tmp_path / "data", per_class=2, size=(40, 30), suffix=".jpg")
    cfg = compose_config(
        tmp_path / "run", [*experiment, f"data.root={root}", "data.img_size=32", "+data.aug.re_prob=0.1"]
    )
    dm = instantiate(cfg.data)
    assert dm.aug == {"re_prob": 0.1} and recipe_aug("deit", dm.aug) == {**DEIT_AUG, "re_prob": 0.1}
    assert _erasing(dm.build_recipe().train) == 0.1 and _erasing(build_recipe("deit", 32, MEAN, STD).train) == 0.25


def test_a_cifar_option_from_the_command_line_reaches_the_transform(tmp_path):
    """docs/robustness.md's data.aug.gauss_noise=0.1 (no +: the cifar-only data configs list every option)."""
    cfg = compose_config(tmp_path, ["data.aug.gauss_noise=0.1", "data.aug.gauss_noise_p=0.5"])
    assert "GaussNoise" in repr(instantiate(cfg.data).build_recipe().train)


@pytest.mark.parametrize(
    "module, key, recipe",
    [
        (ImageFolderDataModule, "re_prb", "deit"),
        (ImageFolderDataModule, "polcy", "cifar"),
        (DigitsDataModule, "hlfip", "cifar"),
    ],
)
def test_a_mistyped_aug_option_is_one_line_naming_the_recipes_options(tmp_path, module, key, recipe):
    root = write_image_folder(tmp_path / "data", per_class=2, size=(8, 8))
    arguments = dict(root=str(root), recipe=recipe) if module is ImageFolderDataModule else {}
    with pytest.raises(ValueError) as err:
        module(**arguments, aug={key: 1})
    valid = sorted(DEIT_AUG if recipe == "deit" else asdict(CifarAugOptions()))
    assert str(err.value) == f"data.aug (data.recipe={recipe}) has no option(s) [{key!r}]; valid options: {valid}"


def test_a_mistyped_deit_option_on_the_command_line_is_one_line(tmp_path):
    root = write_image_folder(tmp_path / "data", per_class=2, size=(8, 8))
    proc = run_python(
        "train.py",
        "data=imagefolder",
        f"data.root={root}",
        "data.recipe=deit",
        "+data.aug.re_prb=0.1",
        f"hydra.run.dir={tmp_path / 'run'}",
    )
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: data.aug (data.recipe=deit) has no option(s) ['re_prb']; valid options: {sorted(DEIT_AUG)}"
    ], proc.stderr


_BASIC = dict(policy="basic", crop_padding=4, hflip=True, gauss_noise=0.0, gauss_noise_p=0.5)


@pytest.mark.parametrize(
    "overrides, options",
    [
        (["data=digits"], {**_BASIC, "crop_padding": 2, "hflip": False}),
        (["data=synthetic"], {**_BASIC, "policy": "none"}),
        (["data=cifar10"], _BASIC),
        (["data=cifar100"], _BASIC),
        (["experiment=cifar10"], {**_BASIC, "policy": "strong"}),
        (["data=imagefolder"], _BASIC),
        (["experiment=zoo_cpu"], _BASIC),
        (["experiment=zoo_gpu"], _BASIC),  # the device path's crop and flip read the same options
    ],
)
def test_the_cifar_recipe_configs_build_the_transforms_they_always_did(tmp_path, overrides, options):
    """The cifar recipe's options each config ran with before data.aug's default became the chosen recipe's
    (written out here, not read from CifarAugOptions), and the very transform they give."""
    root = write_image_folder(tmp_path / "data", per_class=2, size=(8, 8))
    folder = any("imagefolder" in o or "zoo" in o for o in overrides)
    cfg = compose_config(tmp_path / "run", [*overrides, *([f"data.root={root}"] if folder else [])])
    dm = instantiate(cfg.data)
    assert dm.recipe == "cifar" and recipe_aug(dm.recipe, dm.aug) == options
    expected = build_train_transform(dm.img_size, dm.mean, dm.std, **options)
    assert repr(dm.build_recipe().train) == repr(expected)

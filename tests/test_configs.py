"""configs/: every preset composes and trains one fast epoch; overrides reach the model; bad input is clear."""

from __future__ import annotations

import json
import math

import pytest
from hydra.errors import ConfigCompositionException, MissingConfigException
from omegaconf import OmegaConf

import vitzoo
from vitzoo.attention.stack import check_attention
from conftest import CONFIGS, QUIET, compose_config, run_python
from vitzoo.attention import ZooAttention
from vitzoo.training import build_classifier, train
from vitzoo.utils import user_errors

PRESETS = sorted(p.stem for p in (CONFIGS / "model").glob("*.yaml"))


def _instantiate_data(cfg):
    from hydra.utils import instantiate

    return instantiate(cfg.data)


def test_presets_cover_the_issue_list():
    required = {
        "vit_softmax",
        "vit_linear",
        "vit_efficient",
        "vit_taylor",
        "vit_synth_random",
        "vit_synth_dense",
        "vit_projected",
        "vit_noisy",
        "vit_logn",
        "nonlocal_resnet_softmax",
        "nonlocal_resnet_linear",
    }
    assert required <= set(PRESETS)


# Registered variants that share a preset's class and are reached by overriding it (no row of their own).
VARIANTS_WITHOUT_PRESET = {"synth_factorized_dense", "synth_factorized_random"}


def test_every_mechanism_has_a_labelled_vit_preset_in_the_zoo():
    """Adding a mechanism = its file + a preset: the zoo reads its rows from configs/model/."""
    from zoo_plan import zoo_presets

    rows = dict((preset, label) for label, preset in zoo_presets())
    assert set(rows) == set(PRESETS)
    used = {
        OmegaConf.load(CONFIGS / "model" / f"{p}.yaml").attention.get("name") for p in PRESETS if p.startswith("vit_")
    }  # a hybrid stack's preset has no single name
    assert set(vitzoo.list_attentions()) - VARIANTS_WITHOUT_PRESET <= used


# vit_linear (the default preset) in the fast run; every other preset in the slow one.
@pytest.mark.parametrize(
    "preset", [p if p == "vit_linear" else pytest.param(p, marks=pytest.mark.slow) for p in PRESETS]
)
def test_preset_trains_one_fast_epoch(preset, tmp_path):
    tiny = {"vit": "debug=tiny_vit", "nonlocal": "debug=tiny_resnet"}.get(preset.split("_")[0], "debug=tiny_pyramid")
    cfg = compose_config(tmp_path, [tiny, f"model={preset}"])
    check_attention(OmegaConf.to_container(cfg.model.attention))  # one spec or a hybrid stack, every name registered
    assert cfg.model.arch in vitzoo.list_models()
    metrics = train(cfg)
    assert metrics["global_step"] == 4 and math.isfinite(metrics["train/loss_epoch"])
    assert 0.0 <= metrics["val/acc1"] <= 1.0 and (tmp_path / "checkpoints" / "last.ckpt").is_file()


def test_attention_and_model_overrides_reach_the_network(tmp_path):
    cfg = compose_config(
        tmp_path,
        [
            "debug=tiny_vit",
            "model=vit_softmax",
            "model.attention.logit_noise=0.3",
            "model.attention.heads=projected",
            "model.kwargs.depth=3",
        ],
    )
    module = build_classifier(cfg, _instantiate_data(cfg))
    layers = [m for m in module.model.modules() if isinstance(m, ZooAttention)]
    assert len(layers) == 3 and all(m.logit_noise == 0.3 and m.heads == "projected" for m in layers)
    assert module.hparams.attention == {"name": "softmax", "heads": "projected", "head_dim": None, "logit_noise": 0.3}
    assert module.hparams.img_size == 16 and module.hparams.num_classes == 10


def test_default_is_digits_vit_linear_and_trainer_groups_compose(tmp_path):
    cfg = compose_config(tmp_path)
    assert cfg.data._target_.endswith("DigitsDataModule") and cfg.model.attention.name == "linear"
    for trainer in ("cpu", "gpu", "ddp"):
        assert compose_config(tmp_path, [f"trainer={trainer}"]).trainer._target_ == "lightning.pytorch.Trainer"
    assert compose_config(tmp_path, ["trainer=ddp"]).trainer.strategy == "ddp"
    cifar = compose_config(tmp_path, ["experiment=cifar10", "model=vit_softmax"])
    assert cifar.data._target_.endswith("CIFAR10DataModule") and cifar.module.mixup.cutmix_alpha == 1.0
    assert cifar.model.attention.name == "softmax" and cifar.trainer.precision == "bf16-mixed"


def test_unknown_preset_lists_the_available_ones(tmp_path):
    with pytest.raises(MissingConfigException, match="Could not find 'model/vit_nope'") as err:
        compose_config(tmp_path, ["model=vit_nope"])
    assert "vit_linear" in str(err.value.options)


def test_unknown_key_says_how_to_add_it(tmp_path):
    with pytest.raises(ConfigCompositionException, match=r"To append to your config use \+model.attention.bogus"):
        compose_config(tmp_path, ["model.attention.bogus=1"])


def test_unknown_mechanism_option_names_the_valid_ones(tmp_path):
    cfg = compose_config(tmp_path, ["debug=tiny_vit", "model=vit_linear", "+model.attention.temperature=2"])
    with pytest.raises(ValueError, match="temperature.*valid options"):
        build_classifier(cfg, _instantiate_data(cfg))


def test_misspelt_model_kwarg_and_non_numeric_option_name_the_fix(tmp_path):
    cfg = compose_config(tmp_path, ["debug=tiny_vit", "+model.kwargs.dept=6"])
    with pytest.raises(ValueError, match="unexpected keyword argument 'dept'.*model.kwargs"):
        build_classifier(cfg, _instantiate_data(cfg))
    with pytest.raises(ConfigCompositionException, match="Error merging override module.optim.lr=abc") as err:
        compose_config(tmp_path, ["debug=tiny_vit", "module.optim.lr=abc"])
    assert "could not be converted to Float" in str(err.value.__cause__)


def test_a_required_value_left_out_is_one_line_naming_it(tmp_path):
    for overrides, name, key in [([], "eval", "ckpt_path"), (["data=imagefolder"], "train", "data.root")]:
        cfg = compose_config(tmp_path, overrides, name=name)
        with pytest.raises(SystemExit, match=f"^error: {key} is required.*pass {key}=... on the command line$"):
            with user_errors():
                OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)


def test_missing_data_dir_names_the_fix(tmp_path):
    cfg = compose_config(tmp_path, ["data=imagefolder", f"data.root={tmp_path / 'missing'}", *QUIET])
    with pytest.raises(FileNotFoundError, match="data.root=.*train/<class>"):
        train(cfg)


def test_corrupted_resume_checkpoint_names_the_fix(tmp_path):
    bad = tmp_path / "last.ckpt"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="is not readable.*use another .ckpt"):
        train(compose_config(tmp_path, [f"ckpt_path={bad}", *QUIET]))
    with pytest.raises(ValueError, match="is a folder; pass one checkpoint file in it: last.ckpt"):
        train(compose_config(tmp_path, [f"ckpt_path={tmp_path}", *QUIET]))


@pytest.mark.slow
def test_multirun_sweeps_presets(tmp_path):
    run_python(
        "train.py", "-m", "model=vit_softmax,vit_linear", "debug=tiny_vit", f"hydra.sweep.dir={tmp_path}", check=True
    )
    for job in ("0", "1"):
        metrics = json.loads((tmp_path / job / "metrics.json").read_text())
        assert metrics["global_step"] == 4
    assert "linear" in (tmp_path / "1" / ".hydra" / "overrides.yaml").read_text()

"""The option dataclasses of vitzoo.options are the one place defaults are written: the YAML groups of configs/
build on them (Hydra's ConfigStore) and carry only what differs; unknown or mistyped options are one line
naming the valid ones, from Python as from the command line."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hydra.errors import ConfigCompositionException
from hydra.utils import get_class, instantiate
from omegaconf import OmegaConf

from conftest import CONFIGS, compose_config, run_python, write_image_folder
from vitzoo.options import (
    DEFAULT,
    SCHEMAS,
    DigitsDataOptions,
    MixupOptions,
    OptimOptions,
    PredictOptions,
    RobustnessOptions,
)
from vitzoo.training import ImageClassifier
from vitzoo.training.options import options_from


def _leaves(node, prefix=""):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}{key}.")
    else:
        yield prefix.rstrip("."), node


def _schema_files():
    """(yaml path, schema name, the node it fills, whether the schema follows _self_) for every config that names a
    schema in its defaults list."""
    for path in sorted(CONFIGS.rglob("*.yaml")):
        defaults = OmegaConf.to_container(OmegaConf.load(path)).get("defaults", [])
        for entry in defaults:
            if isinstance(entry, str) and entry.startswith("/schema/"):
                name, _, package = entry.removeprefix("/schema/").partition("@")
                after_self = "_self_" in defaults and defaults.index("_self_") < defaults.index(entry)
                yield path, name, None if package == "_here_" else package, after_self


def test_the_yaml_sets_only_what_differs_from_its_schema():
    files = list(_schema_files())
    assert {name for _, name, _, _ in files} == set(SCHEMAS)
    for path, name, package, after_self in files:
        own = OmegaConf.to_container(OmegaConf.load(path))
        own = own.get(package, {}) if package else {k: v for k, v in own.items() if k != "defaults"}
        default = OmegaConf.to_container(OmegaConf.structured(SCHEMAS[name]))
        repeated = [key for key, value in _leaves(own) if OmegaConf.select(OmegaConf.create(default), key) == value]
        assert not repeated, f"{path.relative_to(CONFIGS)} repeats the schema's defaults of {repeated}"
        # a schema merged after _self_ overwrites the file's own values of its keys
        overwritten = sorted(set(own) & set(default)) if after_self else []
        assert not overwritten, f"{path.relative_to(CONFIGS)} sets {overwritten}, which its schema overwrites"


def test_the_composed_configs_hold_the_dataclass_defaults(tmp_path):
    cfg = compose_config(tmp_path)
    assert OmegaConf.to_container(cfg.module.optim) == dataclasses.asdict(OptimOptions())
    data = {k: v for k, v in OmegaConf.to_container(cfg.data).items() if k != "_target_"}
    assert data == dataclasses.asdict(DigitsDataOptions())
    assert OmegaConf.to_container(cfg.module.mixup) == dataclasses.asdict(MixupOptions())
    transfer = compose_config(tmp_path, ["experiment=transfer", "transfer.stage=2"]).transfer
    assert transfer.stage == 2 and transfer.temperature == 1.0
    clean = compose_config(tmp_path, ["robustness=clean"], name="eval").robustness
    assert clean.corruptions == [] and clean.severities == RobustnessOptions().severities
    predict = compose_config(tmp_path, ["ckpt_path=a", "input=b", "output=c"], name="predict")
    assert {f.name: predict[f.name] for f in dataclasses.fields(PredictOptions)} == dataclasses.asdict(PredictOptions())


def _data_root(tmp_path, name):
    """A root the data module of configs/data/<name>.yaml accepts (a class tree, a packed folder's class list)."""
    root = tmp_path / "root"
    if name == "imagefolder":
        write_image_folder(root, per_class=2, size=(4, 4))
    root.mkdir(exist_ok=True)
    (root / "vitzoo.json").write_text(json.dumps({"classes": ["a", "b", "c"]}))
    return root


@pytest.mark.parametrize("name", sorted(path.stem for path in (CONFIGS / "data").glob("*.yaml")))
def test_a_data_module_built_in_python_equals_the_one_its_config_builds(tmp_path, name):
    """The module's own options dataclass (its config's schema) gives the Python defaults: built from
    configs/data/<name>.yaml or from its class with the same required arguments (a root) alone, every resolved
    attribute is the same (batch sizes, workers, size, aug, statistics, split options...)."""
    config = OmegaConf.load(CONFIGS / "data" / f"{name}.yaml")
    required = {"root": str(_data_root(tmp_path, name))} if "root" in config.keys() else {}
    cfg = compose_config(tmp_path, [f"data={name}", *(f"data.{k}={v}" for k, v in required.items())])
    built, plain = instantiate(cfg.data), get_class(cfg.data._target_)(**required)
    schema = next(e for e in config.defaults if str(e).startswith("/schema/")).removeprefix("/schema/").split("@")[0]
    assert type(built) is type(plain) and type(plain).options is SCHEMAS[schema]
    assert vars(plain) == vars(built)
    options = type(plain).options()
    assert (plain.batch_size, plain.img_size, plain.aug) == (options.batch_size, options.img_size, options.aug or {})
    assert plain.eval_batch_size == (options.eval_batch_size or options.batch_size)


def _segmentation_data_configs():
    """(config name, schema name) of every top-level config whose data node is built on a schema (--config-name
    segment, segment_shapes): the last schema its defaults list names for data."""
    for path in sorted(CONFIGS.glob("*.yaml")):
        defaults = OmegaConf.to_container(OmegaConf.load(path)).get("defaults", [])
        schemas = [e for e in defaults if isinstance(e, str) and e.startswith("/schema/") and e.endswith("@data")]
        if schemas:
            yield path.stem, schemas[-1].removeprefix("/schema/").removesuffix("@data")


def _plain(value):
    return json.loads(json.dumps(value, default=str))  # tuples as lists, paths as strings


@pytest.mark.parametrize("name, schema", list(_segmentation_data_configs()))
def test_a_segmentation_data_module_built_in_python_equals_the_one_its_config_builds(tmp_path, name, schema):
    """As for the image data: the class's options dataclass (its config's schema) gives the Python defaults, so the
    module built with the required arguments alone is the one --config-name <name> builds, and the hyperparameters
    a checkpoint keeps are the resolved values (never DEFAULT)."""
    cfg = compose_config(tmp_path, [f"data.root={tmp_path / 'data'}", "data.num_classes=4", "module.backbone=x"], name)
    cls = get_class(cfg.data._target_)
    built, plain = instantiate(cfg.data), cls(root=str(tmp_path / "data"), num_classes=4)
    assert type(built) is cls and cls.options is SCHEMAS[schema]
    hyper = {"_hparams", "_hparams_initial", "labels"}  # compared below: tuples vs lists, a LabelMap without __eq__
    assert {k: v for k, v in vars(plain).items() if k not in hyper} == {
        k: v for k, v in vars(built).items() if k not in hyper
    }
    assert vars(plain.labels) == vars(built.labels)
    assert _plain(dict(plain.hparams)) == _plain(dict(built.hparams))
    options = cls.options()
    assert {k: _plain(plain.hparams[k]) for k in cls.defaults()} == _plain(dataclasses.asdict(options))
    assert (plain.batch_size, plain.rescale, plain.seed) == (options.batch_size, tuple(options.rescale), options.seed)
    spelled = cls(root=str(tmp_path / "data"), num_classes=4, batch_size=DEFAULT, seed=DEFAULT)  # DEFAULT given
    assert _plain(dict(spelled.hparams)) == _plain(dict(plain.hparams))


def test_default_through_a_subclass_kwargs_is_resolved_once_in_the_base(tmp_path):
    """A TakesOptions subclass that passes its **kwargs on as they came (DEFAULT among them) needs no handling of its
    own: the base's hyperparameter saving records every argument at its value, for checkpoints and loggers alike."""
    from vitzoo.segmentation import SegmentationDataModule

    class Passing(SegmentationDataModule):
        def __init__(self, root, extra: int = 3, **kwargs):
            super().__init__(root, **kwargs)

    dm = Passing(str(tmp_path), num_classes=2, batch_size=DEFAULT, seed=DEFAULT)
    for saved in (dm.hparams, dm.hparams_initial):
        assert DEFAULT not in saved.values(), saved
        assert (saved["batch_size"], saved["seed"], saved["extra"]) == (
            SegmentationDataModule.options.batch_size,
            SegmentationDataModule.options.seed,
            3,
        )


def test_a_data_module_takes_the_arguments_given_and_fresh_defaults():
    from vitzoo.data import DigitsDataModule, SyntheticDataModule

    dm = DigitsDataModule(12, 0.5, batch_size=8, num_workers=1, aug={"policy": "none"})
    assert (dm.img_size, dm.val_fraction, dm.batch_size, dm.num_workers, dm.aug) == (12, 0.5, 8, 1, {"policy": "none"})
    assert (dm.eval_batch_size, dm.split_seed) == (DigitsDataOptions.eval_batch_size, DigitsDataOptions.split_seed)
    first, second = DigitsDataModule(), DigitsDataModule()
    first.aug["hflip"] = True  # each module's mapping is its own
    assert second.aug["hflip"] is False and DigitsDataModule.defaults()["aug"]["hflip"] is False
    assert SyntheticDataModule(num_classes=3).num_classes == 3 and SyntheticDataModule().num_classes == 10


@pytest.mark.parametrize(
    "override, message",
    [
        ("module.optim.lr=abc", "Value 'abc' of type 'str' could not be converted to Float"),
        ("module.optim.lrate=1", "Could not override 'module.optim.lrate'"),
        ("module.channels_last=maybe", "Value 'maybe' is not a valid bool"),
    ],
)
def test_the_schema_refuses_bad_overrides_when_the_config_composes(tmp_path, override, message):
    with pytest.raises(ConfigCompositionException) as err:
        compose_config(tmp_path, [override])
    assert message in f"{err.value} {err.value.__cause__}"


def test_the_command_line_names_a_mistyped_option_in_one_line():
    proc = run_python("train.py", "module.optim.lr=abc")
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        "error: Error merging override module.optim.lr=abc: Value 'abc' of type 'str' could not be converted to "
        "Float (module.optim.lr)"
    ], proc.stderr


def test_options_from_takes_instances_mappings_and_none_and_names_bad_keys():
    assert options_from(OptimOptions, "module.optim", None) == OptimOptions()
    assert options_from(OptimOptions, "module.optim", {"lr": 2}).lr == 2
    given = MixupOptions(mixup_alpha=0.8)
    assert options_from(MixupOptions, "module.mixup", given) is given and given.active
    with pytest.raises(ValueError, match=r"module.optim has no option\(s\) \['lrate'\]; valid options: .*'lr'"):
        options_from(OptimOptions, "module.optim", {"lrate": 1.0})
    with pytest.raises(ValueError, match="^module.optim.lr='abc': Value 'abc' of type 'str' could not be converted"):
        options_from(OptimOptions, "module.optim", {"lr": "abc"})
    with pytest.raises(ValueError, match=r"^robustness.corruptions='contrast': give a list, e.g. corruptions=\[contr"):
        options_from(RobustnessOptions, "robustness", {"corruptions": "contrast"})


def test_the_classifier_stores_plain_complete_options():
    module = ImageClassifier(
        "vit_cifar",
        "softmax",
        num_classes=10,
        img_size=16,
        optim=OptimOptions(lr=0.1),
        mixup={"cutmix_alpha": 1.0},
        model_kwargs=dict(depth=1, embed_dim=32, num_heads=2),
    )
    assert module.hparams.optim == {**dataclasses.asdict(OptimOptions()), "lr": 0.1}
    assert module.hparams.mixup["cutmix_alpha"] == 1.0 and module.mixup is not None
    with pytest.raises(ValueError, match=r"module.optim has no option\(s\) \['lrate'\]"):
        ImageClassifier("vit_cifar", "softmax", num_classes=10, img_size=16, optim={"lrate": 1.0})


def test_type_error_names_the_first_trainer_value_its_type_refuses():
    from omegaconf import OmegaConf

    from vitzoo.options import type_error

    assert type_error(OmegaConf.create({"trainer": {"max_epochs": 3, "precision": 32, "strategy": {"x": 1}}})) is None
    assert type_error(OmegaConf.create({"trainer": {"max_epochs": "3", "enable_progress_bar": "maybe"}})) == (
        "trainer.enable_progress_bar='maybe' is not a valid bool (Value 'maybe' is not a valid bool (type str)); "
        "pass trainer.enable_progress_bar=<bool>"
    )

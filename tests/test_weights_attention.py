"""An export's weights file names its attention (safetensors metadata): a builder handed the file alone
(``pretrained_cfg_overlay=dict(file=...)``) refuses weights of another mechanism in one line naming ``local-dir:``."""

import json

import pytest
import timm
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import vitzoo
from vitzoo.export import export_model

SHAPE = dict(depth=2, num_classes=10)


@pytest.fixture(scope="module")
def linear_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("linear")
    export_model(vitzoo.create_model("vit_cifar", attention="linear", **SHAPE), out)
    return out


def _from_file(arch, file, **kwargs):
    return timm.create_model(arch, pretrained=True, pretrained_cfg_overlay=dict(file=str(file)), **kwargs)


def test_the_weights_file_carries_the_attention_spec(linear_export):
    with safe_open(str(linear_export / "model.safetensors"), framework="pt") as f:
        assert json.loads(f.metadata()["vitzoo_attention"]) == "linear"


def test_weights_of_another_mechanism_are_refused_naming_local_dir(linear_export):
    file = linear_export / "model.safetensors"
    with pytest.raises(ValueError) as err:
        _from_file("vitzoo_vit_cifar", file, **SHAPE)  # softmax by default
    assert str(err.value) == (
        f"{file} holds weights of attention 'linear', not the 'softmax' this model is built with; "
        f"timm.create_model('local-dir:{linear_export}', pretrained=True) builds the attention its config.json "
        f"names (or pass attention='linear')"
    )
    model = _from_file("vitzoo_vit_cifar", file, attention="linear", **SHAPE).eval()  # the matching spec loads
    x = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), timm.create_model(f"local-dir:{linear_export}", pretrained=True)(x))


def test_other_options_of_the_same_mechanism_warn_once(linear_export):
    relu = {"name": "linear", "feature_map": "relu"}
    with pytest.warns(UserWarning, match=r"exported with attention 'linear'; this model is built with .*relu"):
        _from_file("vitzoo_vit_cifar", linear_export / "model.safetensors", attention=relu, **SHAPE)


def test_an_export_without_the_metadata_is_checked_against_its_config(linear_export, tmp_path):
    """Exports written before the metadata: the config.json beside the file names the attention."""
    for name in ("model.safetensors", "config.json"):
        (tmp_path / name).write_bytes((linear_export / name).read_bytes())
    save_file(load_file(str(tmp_path / "model.safetensors")), str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"holds weights of attention 'linear', not the 'softmax'"):
        _from_file("vitzoo_vit_cifar", tmp_path / "model.safetensors", **SHAPE)


def test_a_non_local_resnet_checks_its_weights_too(tmp_path):
    export_model(vitzoo.create_model("nonlocal_resnet18_cifar", attention="linear"), tmp_path)
    with pytest.raises(ValueError, match=r"holds weights of attention 'linear', not the 'softmax'.*local-dir:"):
        _from_file("vitzoo_nonlocal_resnet18_cifar", tmp_path / "model.safetensors")

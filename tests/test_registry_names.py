"""vitzoo's ViTs and non-local ResNets in timm's registry carry the prefix ``vitzoo_``; vitzoo keeps the short names,
and exports written under the old timm names still load."""

import json

import pytest
import timm
import torch

import vitzoo
from vitzoo.export import export_model, load_exported

SHORT = ["vit_cifar", "vit_tiny", "vit_small", "vit_base", "nonlocal_resnet18", "nonlocal_resnet50"]


def test_timm_lists_them_under_the_prefix_only():
    found = timm.list_models("*vitzoo*")
    assert {f"vitzoo_{name}" for name in [*SHORT, "nonlocal_resnet18_cifar"]} <= set(found)
    assert not set(SHORT) & set(timm.list_models())  # no generic name in timm's listing
    assert set(SHORT) <= set(vitzoo.list_models())  # vitzoo's own names stay short


def test_create_model_takes_the_short_name_and_timm_the_prefixed_one():
    model = vitzoo.create_model("vit_cifar", attention="linear", depth=1)
    assert model.pretrained_cfg["architecture"] == "vitzoo_vit_cifar"
    same = timm.create_model("vitzoo_vit_cifar", attention="linear", depth=1)
    assert type(same) is type(model) and same.pretrained_cfg["input_size"] == (3, 32, 32)


def test_an_export_under_the_old_name_still_loads(tmp_path):
    model = vitzoo.create_model("vit_cifar", attention="linear", depth=1).eval()
    export_model(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architecture"] == "vitzoo_vit_cifar"
    config["architecture"] = "vit_cifar"  # what an export written before the prefix holds
    (tmp_path / "config.json").write_text(json.dumps(config))
    x = torch.rand(1, 3, 32, 32)
    with pytest.warns(UserWarning, match="Mapping deprecated model name vit_cifar to current vitzoo_vit_cifar"):
        again = timm.create_model(f"local-dir:{tmp_path}", pretrained=True).eval()
    with torch.no_grad():
        torch.testing.assert_close(again(x), model(x))
        torch.testing.assert_close(load_exported(tmp_path).eval()(x), model(x))

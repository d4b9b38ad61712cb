"""The mmsegmentation recipe of docs/export.md, checked against TIMMBackbone without mmseg installed.

mmseg's models need mmcv's compiled ops, which do not install here (docs/export.md). ``TIMMBackbone`` (mmseg 1.2.2,
mmseg/models/backbones/timm_backbone.py) takes ``model_name, features_only=True, pretrained=True,
checkpoint_path='', in_channels=3, init_cfg=None, **kwargs`` and builds
``timm.create_model(model_name=..., features_only=..., pretrained=..., in_chans=in_channels,
checkpoint_path=checkpoint_path, **kwargs)``: the test makes that same call with the recipe's backbone
options on an export, and checks the neck and head channel counts and the preprocessor statistics.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import timm
import torch

import vitzoo
from vitzoo.export import export_model

EXPORT_DOC = Path(__file__).resolve().parents[1] / "docs" / "export.md"
TIMM_BACKBONE_ARGS = ("model_name", "features_only", "pretrained", "checkpoint_path", "in_channels", "init_cfg")


def _recipe() -> dict:
    blocks = re.findall(r"```python\n(.*?)```", EXPORT_DOC.read_text(), flags=re.S)
    (block,) = [b for b in blocks if "TIMMBackbone" in b]
    namespace: dict = {}
    exec(block, namespace)  # plain dicts: the mmseg config as docs/export.md gives it
    return namespace


def _timm_backbone(
    model_name, features_only=True, pretrained=True, checkpoint_path="", in_channels=3, init_cfg=None, **kwargs
):
    """TIMMBackbone.__init__'s timm call, as in mmseg 1.2.2."""
    return timm.create_model(
        model_name=model_name,
        features_only=features_only,
        pretrained=pretrained,
        in_chans=in_channels,
        checkpoint_path=checkpoint_path,
        **kwargs,
    )


def test_readme_mmseg_recipe_builds_the_export_through_timm_backbone_call(tmp_path):
    recipe = _recipe()
    assert recipe["custom_imports"]["imports"] == ["vitzoo"]
    model = dict(recipe["model"])
    backbone = dict(model["backbone"])
    assert backbone.pop("type") == "TIMMBackbone"
    assert set(backbone) <= set(TIMM_BACKBONE_ARGS) | {"out_indices"}, backbone
    assert backbone["model_name"] == "local-dir:/abs/path/exports/vit"

    torch.manual_seed(0)
    classifier = vitzoo.create_model("vit_cifar", attention="linear")  # the README's export: vit_cifar, patch 4
    export = export_model(classifier, tmp_path / "vit", head=False)
    config = json.loads((export / "config.json").read_text())
    C = recipe["C"]
    assert config["num_features"] == C
    net = _timm_backbone(**{**backbone, "model_name": f"local-dir:{export}"})
    torch.testing.assert_close(
        net.state_dict()["model.patch_embed.proj.weight"], classifier.state_dict()["patch_embed.proj.weight"]
    )  # the export's weights
    maps = net(torch.rand(1, 3, 128, 128))
    assert [tuple(m.shape) for m in maps] == [(1, C, 32, 32)] * 4  # stride 4 (the patch) at 4 depths

    neck, head = model["neck"], model["decode_head"]
    assert neck["in_channels"] == [C] * 4 and head["in_channels"] == [C] * 4
    assert [4 / scale for scale in neck["scales"]] == [4, 8, 16, 32]  # strides after MultiLevelNeck
    pre = model["data_preprocessor"]
    assert pre["mean"] == pytest.approx([255 * m for m in config["pretrained_cfg"]["mean"]], abs=0.06)
    assert pre["std"] == pytest.approx([255 * s for s in config["pretrained_cfg"]["std"]], abs=0.06)

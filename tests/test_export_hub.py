"""Hub conventions of an export: timm's ``attn.qkv`` names for split-head softmax (plain timm loads it), a model card
declaring the repository's licence, and ``push_to_hub`` in timm's hub layout (its upload mocked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from timm.models.vision_transformer import VisionTransformer

import vitzoo
from vitzoo.export import export_model, load_exported, push_to_hub
from vitzoo.models.vit import VIT_ARCHS

ROOT = Path(__file__).resolve().parents[1]
SHAPE = dict(img_size=16, depth=2, num_classes=4)


def _model(attention):
    torch.manual_seed(0)
    return vitzoo.create_model("vit_cifar", attention=attention, **SHAPE).eval()


def test_a_split_head_softmax_export_loads_in_plain_timm_and_back_in_vitzoo(tmp_path):
    model = _model("softmax")
    export_model(model, tmp_path / "softmax", metrics={"val/acc1": 0.5}, data="Digits")
    state = load_file(tmp_path / "softmax" / "model.safetensors")
    assert "blocks.0.attn.qkv.weight" in state and not any(".in_proj." in k for k in state)
    plain = VisionTransformer(**{**VIT_ARCHS["vit_cifar"], **SHAPE}).eval()
    plain.load_state_dict(state)  # strict: every key and shape is timm's
    image = torch.rand(2, 3, 16, 16)
    with torch.no_grad():
        expected = model(image)
        torch.testing.assert_close(plain(image), expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(load_exported(tmp_path / "softmax")(image), expected, rtol=0, atol=0)
    assert "blocks.0.attn.in_proj.proj.weight" in model.state_dict()  # the model's own names are untouched


def test_other_mechanisms_keep_their_own_names(tmp_path):
    for attention in ("linear", {"name": "softmax", "heads": "projected"}):
        model = _model(attention)
        export_model(model, tmp_path / "out")
        state = load_file(tmp_path / "out" / "model.safetensors")
        assert not any(".attn.qkv." in k for k in state), attention
        with torch.no_grad():
            image = torch.rand(1, 3, 16, 16)
            torch.testing.assert_close(load_exported(tmp_path / "out")(image), model(image), rtol=0, atol=0)


def test_every_export_has_a_model_card_with_the_repositorys_licence(tmp_path):
    export_model(_model("linear"), tmp_path / "card", metrics={"val/acc1": 0.9722}, data="Digits")
    card = (tmp_path / "card" / "README.md").read_text()
    config = json.loads((tmp_path / "card" / "config.json").read_text())
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License\n                           Version 2.0")
    assert "license: apache-2.0" in card.split("---")[1] and config["pretrained_cfg"]["license"] == "apache-2.0"
    for text in (
        "# Model card for card",
        "vit_cifar",
        "**Attention mechanism:** linear",
        "val/acc1: 0.9722",
        "datasets:\n- digits",
        "timm.create_model(",
        "vitzoo.export.load_exported(",
    ):
        assert text in card, text
    assert config["vitzoo"]["metrics"] == {"val/acc1": 0.9722} and config["vitzoo"]["data"] == "Digits"


def test_push_to_hub_uploads_the_export_through_timm(tmp_path, monkeypatch):
    import vitzoo.export.hub as hub

    uploaded = {}

    class FakeApi:  # what push_to_hub calls on huggingface_hub.HfApi; nothing leaves the machine
        def __init__(self, **kwargs):
            pass

        def create_repo(self, repo_id, **kwargs):
            return type("RepoUrl", (), {"repo_id": repo_id})()

        def file_exists(self, **kwargs):
            return False

        def upload_folder(self, repo_id, folder_path, **kwargs):
            uploaded.update({p.name: p.read_bytes() for p in Path(folder_path).iterdir()}, repo_id=repo_id)
            return "commit"

    monkeypatch.setattr(hub, "HfApi", FakeApi)
    folder = export_model(_model("softmax"), tmp_path / "export", metrics={"val/acc1": 0.5}, data="Digits")
    assert push_to_hub(folder, "someone/vit-softmax") == "commit"
    assert uploaded.pop("repo_id") == "someone/vit-softmax"
    assert sorted(uploaded) == ["README.md", "config.json", "model.safetensors"]
    assert uploaded["model.safetensors"] == (folder / "model.safetensors").read_bytes()
    sent, kept = json.loads(uploaded["config.json"]), json.loads((folder / "config.json").read_text())
    assert sent["vitzoo"] == kept["vitzoo"] and sent["model_args"] == kept["model_args"]
    card = uploaded["README.md"].decode()
    assert "license: apache-2.0" in card and "**Attention mechanism:** softmax" in card and "val/acc1: 0.5" in card


def test_push_to_hub_checks_the_export_first(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a vitzoo export"):
        push_to_hub(tmp_path, "someone/nothing")

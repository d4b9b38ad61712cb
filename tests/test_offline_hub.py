"""init_from=timm:... with an unreachable hub and no HF_HUB_OFFLINE: one line in seconds (not ~50 s of the hub
library's retries), and weights in the hub cache load from it."""

from __future__ import annotations

import socket
import time

import pytest
import timm
import torch
from huggingface_hub import constants
from safetensors.torch import save_file

import vitzoo
from vitzoo.models.hub_probe import hub_reachable

SOURCE = "timm:vit_tiny_patch16_224.augreg_in21k"


@pytest.fixture
def unreachable_hub(monkeypatch, tmp_path):
    """No connection opens (the probe's nor the hub library's) and the hub cache is an empty folder."""

    def refuse(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return tmp_path / "hub"


def test_an_unreachable_hub_is_one_line_in_seconds(unreachable_hub):
    started = time.monotonic()
    with pytest.raises(ValueError) as err:
        vitzoo.create_model("vit_tiny", attention="linear", num_classes=10, init_from=SOURCE)
    assert time.monotonic() - started < 15
    assert str(err.value).startswith(
        f"init_from={SOURCE!r}: the weights could not be downloaded ({constants.ENDPOINT} does not answer and they "
        f"are not in the hub cache); offline, pass a local file instead"
    )
    assert constants.HF_HUB_OFFLINE is False  # the hub library's mode put back


def test_cached_weights_load_with_an_unreachable_hub(unreachable_hub):
    name = SOURCE[len("timm:") :]
    repo = timm.models.get_pretrained_cfg(name).hf_hub_id
    commit = "0" * 40
    folder = unreachable_hub / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    (folder / "snapshots" / commit).mkdir(parents=True)
    torch.manual_seed(0)
    weights = timm.create_model(name.split(".")[0], num_classes=21843).state_dict()
    save_file(weights, folder / "snapshots" / commit / "model.safetensors")
    started = time.monotonic()
    model = vitzoo.create_model("vit_tiny", attention="linear", num_classes=10, init_from=SOURCE)
    assert time.monotonic() - started < 15
    assert torch.equal(model.patch_embed.proj.weight, weights["patch_embed.proj.weight"])


def test_the_probe_opens_a_connection_with_a_timeout(monkeypatch):
    opened = []
    monkeypatch.setattr(
        socket, "create_connection", lambda address, timeout: opened.append((address, timeout)) or socket.socket()
    )
    assert hub_reachable("https://huggingface.co") and hub_reachable("http://mirror.local:8080")
    assert opened == [(("huggingface.co", 443), 3.0), (("mirror.local", 8080), 3.0)]

"""vitzoo.export: checkpoint -> timm hub dir -> timm / smp rebuild the same network; bad input is clear."""

from __future__ import annotations

import json
import pickle
import sys
import textwrap
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file, save_file

import vitzoo
from conftest import compose_config, run_python
from vitzoo.export import WEIGHTS_NAME, export_checkpoint, export_model, load_exported
from vitzoo.export.__main__ import main as export_cli
from vitzoo.training import ImageClassifier, load_classifier, train

ROOT = Path(__file__).resolve().parents[1]
SMALL_VIT = dict(depth=4, embed_dim=32, num_heads=2, patch_size=4)
MECHANISMS = [{"name": name} for name in vitzoo.list_attentions()] + [
    {"name": "softmax", "scale": "log_n"},
    {"name": "linear", "rope": "mixed", "gate": "head"},  # RoPE's learned frequencies and the gate travel too
]


def _checkpoint(path: Path, arch: str = "vit_cifar", attention="softmax", model_kwargs=SMALL_VIT) -> Path:
    """A checkpoint in the pipeline's format (state_dict under ``model.`` + plain hyperparameters)."""
    torch.manual_seed(0)
    module = ImageClassifier(
        arch,
        attention,
        num_classes=5,
        img_size=32,
        mean=(0.1, 0.2, 0.3),
        std=(0.4, 0.5, 0.6),
        model_kwargs=model_kwargs,
    )
    torch.save({"state_dict": module.state_dict(), "hyper_parameters": dict(module.hparams)}, path)
    return path


def _small_vit(attention, **kwargs):
    torch.manual_seed(0)
    return vitzoo.create_model(
        "vit_cifar", attention=attention, img_size=32, num_classes=5, **SMALL_VIT, **kwargs
    ).eval()


_FRESH_PROCESS = textwrap.dedent("""
    import sys, timm, torch, vitzoo
    from safetensors.torch import load_file, save_file
    io = sys.argv[1]
    x = load_file(io + "/input.safetensors")["x"]
    out = {}
    for i, export_dir in enumerate(sys.argv[2:]):
        model = timm.create_model("local-dir:" + export_dir, pretrained=True).eval()
        with torch.no_grad():
            out[f"y{i}"] = model(x).contiguous()
    save_file(out, io + "/output.safetensors")
""")


def test_export_rebuilds_identical_logits_in_a_fresh_process(tmp_path):
    cases = [
        ("vit_cifar", "softmax", True),
        ("vit_cifar", {"name": "linear", "feature_map": "relu"}, True),
        ("vit_cifar", {"name": "synth_random", "heads": "projected"}, False),
        ("nonlocal_resnet18_cifar", "linear", True),
    ]
    x = torch.randn(2, 3, 32, 32)
    expected, dirs = [], []
    for i, (arch, attention, head) in enumerate(cases):
        ckpt = _checkpoint(tmp_path / f"{i}.ckpt", arch, attention, SMALL_VIT if arch == "vit_cifar" else {})
        net, _ = load_classifier(ckpt)
        with torch.no_grad():
            expected.append(net(x) if head else net.forward_head(net.forward_features(x), pre_logits=True))
        dirs.append(str(export_checkpoint(ckpt, tmp_path / f"export{i}", head=head)))
    save_file({"x": x}, str(tmp_path / "input.safetensors"))
    run_python("-c", _FRESH_PROCESS, tmp_path, *dirs, check=True)
    got = load_file(str(tmp_path / "output.safetensors"))
    for i, want in enumerate(expected):
        assert torch.equal(got[f"y{i}"], want), cases[i]


def test_config_is_timm_hub_layout_with_the_full_attention_spec(tmp_path):
    spec = {"name": "softmax", "heads": "projected", "head_dim": 8, "logit_noise": 0.2, "scale": "log_n"}
    out = export_checkpoint(_checkpoint(tmp_path / "a.ckpt", attention=spec), tmp_path / "export")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architecture"] == "vitzoo_vit_cifar" and cfg["num_classes"] == 5 and cfg["num_features"] == 32
    assert cfg["model_args"]["attention"] == {**spec, "train_tokens": 65}  # log-n pinned at 1 + (32 / 4)^2 tokens
    assert cfg["model_args"]["img_size"] == [32, 32] and cfg["model_args"]["depth"] == 4
    assert {k: cfg["model_args"][k] for k in ("patch_size", "embed_dim", "num_heads", "mlp_ratio")} == {
        "patch_size": 4,
        "embed_dim": 32,
        "num_heads": 2,
        "mlp_ratio": 2.0,
    }  # the shape, not only the defaults
    pcfg = cfg["pretrained_cfg"]
    assert pcfg["input_size"] == [3, 32, 32] and pcfg["num_classes"] == 5
    assert pcfg["mean"] == [0.1, 0.2, 0.3] and pcfg["std"] == [0.4, 0.5, 0.6]
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.json", "model.safetensors"]


def test_no_head_drops_the_classifier(tmp_path):
    out = export_checkpoint(_checkpoint(tmp_path / "a.ckpt"), tmp_path / "export", head=False)
    assert json.loads((out / "config.json").read_text())["num_classes"] == 0
    assert not any(k.startswith("head.") for k in load_file(str(out / WEIGHTS_NAME)))
    model = load_exported(out)
    assert model.num_classes == 0 and model(torch.randn(1, 3, 32, 32)).shape == (1, 32)
    # a fresh head for a new task is timm's usual num_classes=...
    assert load_exported(out, num_classes=7)(torch.randn(1, 3, 32, 32)).shape == (1, 7)


@pytest.mark.parametrize("attention", MECHANISMS, ids=lambda s: "-".join(map(str, s.values())))
def test_features_at_twice_the_training_resolution(attention, tmp_path):
    model = _small_vit(attention)
    export_model(model, tmp_path, head=False)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        want = model.forward_intermediates(x, indices=[0, 1, 2, 3], intermediates_only=True)
        features = timm.create_model(f"local-dir:{tmp_path}", pretrained=True, features_only=True).eval()(x)
        inter = load_exported(tmp_path).eval().forward_intermediates(x, indices=4, intermediates_only=True)
    assert [tuple(f.shape) for f in features] == [(2, 32, 16, 16)] * 4
    for got in (features, inter):
        assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_default_feature_levels_spread_over_depth(tmp_path):
    torch.manual_seed(0)
    model = vitzoo.create_model("vit_cifar", depth=12, embed_dim=16, num_heads=2, num_classes=0)
    export_model(model, tmp_path)
    features = load_exported(tmp_path, features_only=True)
    assert features.feature_info.out_indices == (2, 5, 8, 11)


def test_nonlocal_resnet_pyramid_and_smp_unet(tmp_path):
    import segmentation_models_pytorch as smp

    torch.manual_seed(0)
    export_model(vitzoo.create_model("nonlocal_resnet18", attention="linear", img_size=64, num_classes=0), tmp_path)
    features = load_exported(tmp_path, features_only=True, out_indices=(1, 2, 3, 4))
    assert features.feature_info.reduction() == [4, 8, 16, 32]
    assert [f.shape[-1] for f in features(torch.randn(1, 3, 128, 128))] == [32, 16, 8, 4]
    net = smp.Unet(
        encoder_name=f"tu-local-dir:{tmp_path}", encoder_weights=True, classes=3, decoder_channels=(32, 16, 16, 8, 8)
    )
    weights = load_file(str(tmp_path / WEIGHTS_NAME))
    encoder = net.encoder.model.state_dict()
    assert all(torch.equal(encoder[k], weights[k]) for k in encoder)
    assert net(torch.randn(1, 3, 64, 64)).shape == (1, 3, 64, 64)


def test_smp_dpt_builds_from_the_export_with_its_weights(tmp_path):
    import segmentation_models_pytorch as smp

    export_model(_small_vit({"name": "synth_factorized_random"}), tmp_path, head=False)
    net = smp.DPT(
        encoder_name=f"tu-local-dir:{tmp_path}",
        classes=3,
        decoder_intermediate_channels=(16, 32, 32, 32),
        decoder_fusion_channels=16,
    ).eval()
    weights = load_file(str(tmp_path / WEIGHTS_NAME))
    for name, value in net.encoder.model.state_dict().items():
        assert torch.equal(value, weights[name]), name
    assert net.encoder.output_strides == [4, 4, 4, 4] and net.encoder.has_prefix_tokens
    with torch.no_grad():
        assert net(torch.randn(1, 3, 64, 64)).shape == (1, 3, 64, 64)


def test_cli_writes_an_export_and_reports_bad_checkpoints(tmp_path, capsys):
    ckpt = _checkpoint(tmp_path / "a.ckpt")
    assert export_cli([str(ckpt), str(tmp_path / "out"), "--no-head"]) == 0
    assert load_exported(tmp_path / "out").num_classes == 0
    assert export_cli([str(tmp_path / "missing.ckpt"), str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_cli_in_the_core_install_is_one_line_naming_the_extra(tmp_path, capsys, monkeypatch):
    """Without Lightning: a missing checkpoint is still named first (before any import), then the extra."""
    monkeypatch.setitem(sys.modules, "lightning", None)  # not installed, to importlib
    assert export_cli([str(tmp_path / "missing.ckpt"), str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.startswith(f"error: checkpoint '{tmp_path / 'missing.ckpt'}' does not exist; ")
    (tmp_path / "a.ckpt").write_bytes(b"")
    assert export_cli([str(tmp_path / "a.ckpt"), str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "error: python -m vitzoo.export (a Lightning checkpoint) needs vitzoo's train extra (lightning not installed); "
        "in a clone of vitzoo: pip install -e '.[train]' (or pip install '<clone>[train]')"
    ]
    assert not (tmp_path / "x").exists()


def test_cli_keeps_an_existing_export_unless_forced(tmp_path, capsys):
    ckpt, out = _checkpoint(tmp_path / "a.ckpt"), tmp_path / "out"
    assert export_cli([str(ckpt), str(out)]) == 0
    weights = (out / WEIGHTS_NAME).read_bytes()
    assert (out / WEIGHTS_NAME).stat().st_mode & 0o777 == (out / "config.json").stat().st_mode & 0o777
    assert export_cli([str(ckpt), str(out), "--no-head"]) == 2
    assert f"error: {out} is not empty; pass another folder, or --force" in capsys.readouterr().err
    assert (out / WEIGHTS_NAME).read_bytes() == weights
    assert export_cli([str(ckpt), str(out), "--no-head", "--force"]) == 0
    assert load_exported(out).num_classes == 0

    assert export_cli([str(ckpt), str(ckpt)]) == 2  # OUT is a file
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {ckpt} is a file; the export is a folder (model.safetensors + config.json): pass a folder path"
    ]
    assert export_cli([str(tmp_path / "missing.ckpt"), str(tmp_path / "x")]) == 2
    assert "ckpt_path" not in capsys.readouterr().err  # the CLI takes the checkpoint as an argument, not a key


def test_training_run_exports_its_best_checkpoint(tmp_path):
    cfg = compose_config(
        tmp_path, ["debug=tiny_vit", "model=vit_softmax", "trainer.max_epochs=2", "callbacks.export_best.head=false"]
    )  # on by default
    metrics = train(cfg)
    best, _ = load_classifier(metrics["best_ckpt"])
    exported = load_exported(tmp_path / "export").eval()
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.equal(exported(x), best.forward_head(best.forward_features(x), pre_logits=True))


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_checkpoint_with_pickled_code_is_refused_not_run(tmp_path):
    marker = tmp_path / "pwned"
    ckpt = tmp_path / "evil.ckpt"
    with open(ckpt, "wb") as f:
        pickle.dump({"state_dict": {}, "hyper_parameters": _Payload(str(marker))}, f, protocol=2)
    with pytest.raises(ValueError, match="is not readable"):
        export_checkpoint(ckpt, tmp_path / "out")
    assert not marker.exists()


@pytest.fixture
def exported(tmp_path):
    return export_model(_small_vit("softmax"), tmp_path / "export")


def _smp_dpt(export_dir):
    import segmentation_models_pytorch as smp

    return smp.DPT(encoder_name=f"tu-local-dir:{export_dir}", encoder_weights=True, classes=2)


# Every way a user loads an export reports a damaged one the same way.
LOADERS = {
    "load_exported": load_exported,
    "timm": lambda d: timm.create_model(f"local-dir:{d}", pretrained=True),
    "timm_features": lambda d: timm.create_model(f"local-dir:{d}", pretrained=True, features_only=True),
    "smp_dpt": _smp_dpt,
}


@pytest.mark.parametrize("load", LOADERS.values(), ids=LOADERS)
def test_truncated_weights_name_the_fix(exported, load):
    weights = exported / WEIGHTS_NAME
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ValueError, match=r"truncated or corrupted.*python -m vitzoo.export"):
        load(exported)


@pytest.mark.parametrize("load", LOADERS.values(), ids=LOADERS)
def test_corrupted_weights_fail_the_checksum(exported, load):
    weights = exported / WEIGHTS_NAME
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"does not match the checksum.*python -m vitzoo.export"):
        load(exported)


@pytest.mark.parametrize("load", LOADERS.values(), ids=LOADERS)
def test_unknown_mechanism_in_config_names_the_valid_ones(exported, load):
    cfg_file = exported / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["model_args"]["attention"] = {"name": "softmaxx"}
    cfg_file.write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"unknown attention 'softmaxx'; choose one of .*softmax"):
        load(exported)


@pytest.mark.parametrize(
    "attention",
    [{"name": "softmax", "scale": "log_n"}, {"name": "synth_mix", "parts": ["random", "softmax"], "scale": "log_n"}],
    ids=["softmax", "synth_mix"],
)
def test_log_n_scale_keeps_its_training_length_when_a_loader_passes_img_size(attention, tmp_path):
    """smp / mmseg may pass img_size: the log-n scale must still be calibrated at the training token count."""
    model = _small_vit(attention)
    export_model(model, tmp_path, head=False)
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        want = model.forward_intermediates(x, indices=[3], intermediates_only=True)[0]
        resized = timm.create_model(f"local-dir:{tmp_path}", pretrained=True, img_size=64).eval()
        got = resized.forward_intermediates(x, indices=[3], intermediates_only=True)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_missing_export_dir_names_the_command(tmp_path):
    with pytest.raises(FileNotFoundError, match="python -m vitzoo.export"):
        load_exported(tmp_path / "nowhere")


def test_input_not_divisible_by_the_patch_is_a_clear_error(exported):
    features = load_exported(exported, features_only=True)
    with pytest.raises(AssertionError, match=r"Input height \(66\) should be divisible by patch size \(4\)"):
        features(torch.randn(1, 3, 66, 64))

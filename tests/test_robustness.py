"""Robustness evaluation: the sweep, its summary metrics, eval.py's outputs and its errors."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from conftest import ATTACKS, ROOT, compose_config
from test_corruptions_released import write_cifar_c, write_imagenet_c
from vitzoo import robustness
from vitzoo.data import DigitsDataModule
from vitzoo.diagnostics import attention_entropy
from vitzoo.robustness import Pass, Sweep, attention_noise, run_pass, summarize, sweep_passes
from vitzoo.robustness.run import evaluate_checkpoints
from vitzoo.robustness.report import write_results
from vitzoo.robustness.sweep import ENTROPY_IMAGES, resolution_size
from vitzoo.training import load_classifier, read_checkpoint, train


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Two small digits classifiers (softmax and linear attention), trained for real."""
    out = {}
    for preset in ("vit_softmax", "vit_linear"):
        run = tmp_path_factory.mktemp(preset)
        metrics = train(compose_config(run, [f"model={preset}", "debug=digits"]))
        assert metrics["val/acc1"] > 0.7, metrics
        out[preset] = run / "checkpoints" / "last.ckpt"
    return out


def unit_loader(img_size: int, max_images=None, batch_size=90):
    """Digits val split in [0, 1] at ``img_size`` (mean 0, std 1), as eval.py builds it."""
    dm = DigitsDataModule(img_size=img_size, mean=(0.0,) * 3, std=(1.0,) * 3, eval_batch_size=batch_size)
    dm.setup("validate")
    data = dm.val_dataset if max_images is None else torch.utils.data.Subset(dm.val_dataset, range(max_images))
    return torch.utils.data.DataLoader(data, batch_size=batch_size)


def sweep_pass(model, hp, step, sweep=Sweep(), loaders=None):
    loaders = loaders if loaders is not None else {}

    def loader_at(size):
        return loaders.setdefault(size, unit_loader(size))

    return run_pass(model, step, sweep, hp["img_size"], hp["mean"], hp["std"], loader_at, torch.device("cpu"))


# -- the sweep ----------------------------------------------------------------------------------
@pytest.mark.slow
def test_zero_logit_noise_reproduces_clean_accuracy_exactly_and_noise_changes_it(checkpoints):
    model, hp = load_classifier(checkpoints["vit_softmax"])
    clean = sweep_pass(model, hp, Pass("clean", 0))
    zero = sweep_pass(model, hp, Pass("logit_noise", 0.0))
    assert zero["acc1"] == clean["acc1"] and zero["loss"] == clean["loss"]  # bit-identical, not approximately
    loud = sweep_pass(model, hp, Pass("logit_noise", 8.0))
    assert loud["loss"] != clean["loss"]
    assert sweep_pass(model, hp, Pass("logit_noise", 8.0)) == loud  # seeded: repeats exactly
    assert all(m.eval_logit_noise == 0 for m in model.modules() if hasattr(m, "eval_logit_noise"))


@pytest.mark.slow
def test_clean_pass_matches_the_training_pipeline(checkpoints):
    """[0, 1] images normalised in the sweep == the data module's own normalised val images."""
    model, hp = load_classifier(checkpoints["vit_linear"])
    clean = sweep_pass(model, hp, Pass("clean", 0))
    assert clean["acc1"] == pytest.approx(
        json.loads((checkpoints["vit_linear"].parents[1] / "metrics.json").read_text())["val/acc1"], abs=1 / 360
    )
    assert clean["num_images"] == 360


@pytest.mark.slow
def test_accuracy_falls_monotonically_with_gaussian_severity(checkpoints):
    model, hp = load_classifier(checkpoints["vit_softmax"])
    sweep = Sweep(protocol="imagenet")  # digits are 16 px: the CIFAR strengths barely touch them
    acc = [sweep_pass(model, hp, Pass("clean", 0), sweep)["acc1"]]
    acc += [sweep_pass(model, hp, Pass("gaussian_noise", s), sweep)["acc1"] for s in range(1, 6)]
    assert all(b <= a + 0.02 for a, b in zip(acc, acc[1:])), acc  # within noise of 360 images
    assert acc[5] < acc[0] - 0.1, acc


def test_every_checkpoint_sees_the_same_corrupted_images():
    """Corruptions draw from a fresh generator per pass: two models, one pass each -> identical inputs."""
    seen = []

    class Recorder(nn.Module):
        def forward(self, x):
            seen.append(x.clone())
            return torch.zeros(len(x), 10)

    recorder, hp = Recorder(), {"img_size": 16, "mean": (0.3,) * 3, "std": (0.3,) * 3}
    loaders = {16: unit_loader(16, max_images=64, batch_size=32)}
    for _ in range(2):
        sweep_pass(recorder, hp, Pass("shot_noise", 3), Sweep(seed=5), loaders)
    first, second = torch.cat(seen[:2]), torch.cat(seen[2:])
    assert torch.equal(first, second)
    sweep_pass(recorder, hp, Pass("shot_noise", 3), Sweep(seed=6), loaders)
    assert not torch.equal(torch.cat(seen[4:]), first)
    clean_inputs = torch.cat([(x - 0.3) / 0.3 for x, _ in loaders[16]])
    assert not torch.equal(first, clean_inputs)


@pytest.mark.slow
def test_resolution_pass_runs_at_a_patch_multiple(checkpoints):
    model, hp = load_classifier(checkpoints["vit_linear"])  # 16 px, patch 4
    loaders = {}
    result = sweep_pass(model, hp, Pass("resolution", 1.6), loaders=loaders)
    assert result["level"] == 24 and set(loaders) == {24}  # 1.6 * 16 = 25.6 -> 24 (patch 4)
    assert 0.1 < result["acc1"] <= 1.0 and result["num_images"] == 360
    # ... and the attention entropy there: the layers' mean H / log n on the first images of the pass.
    images = next(iter(loaders[24]))[0][:ENTROPY_IMAGES]
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (hp["mean"], hp["std"]))
    layers = attention_entropy(model, (images - mean) / std)
    assert len(layers) == 2 and result["entropy"] == pytest.approx(sum(layers.values()) / 2, rel=1e-6)
    assert 0.0 < result["entropy"] < 1.0


def test_resolution_sizes_round_halves_up_to_the_patch():
    assert [resolution_size(20, f, 4) for f in (0.5, 0.7, 0.1, 1.5)] == [12, 16, 4, 32]  # 2.5 -> 3 patches, not 2


def test_results_are_strict_json_when_a_metric_is_nan(tmp_path):
    """A diverged checkpoint's NaN loss is written as null (a bare NaN is not JSON)."""
    record = {"checkpoint": "a", "test": "clean", "level": 0, "acc1": 0.1, "loss": float("nan")}
    write_results([record], {"a": {"mce": float("inf")}}, tmp_path, {"path": tmp_path})
    strict = json.loads(
        (tmp_path / "robustness.json").read_text(),
        parse_constant=lambda name: pytest.fail(f"{name} in robustness.json"),
    )
    assert strict["records"][0]["loss"] is None and strict["summary"]["a"]["mce"] is None
    assert strict["path"] == str(tmp_path)


def test_sweep_lists_every_pass_clean_first():
    passes = sweep_passes(Sweep(corruptions=("contrast",), severities=(1, 5), logit_noise=(0, 1), resolutions=(2,)))
    assert [str(p) for p in passes] == [
        "clean",
        "contrast 1",
        "contrast 5",
        "logit_noise 0",
        "logit_noise 1",
        "resolution 2",
    ]


def test_bad_sweep_options_name_the_fix():
    with pytest.raises(ValueError, match=r"unknown corruption\(s\) \['rain'\]; choose from \[.*'gaussian_noise'"):
        Sweep(corruptions=("gaussian_noise", "rain"))
    with pytest.raises(ValueError, match="severities are 1..5"):
        Sweep(severities=(0, 6))
    with pytest.raises(ValueError, match="negative sigma"):
        Sweep(logit_noise=(-1,))
    with pytest.raises(ValueError, match="must be a list.*corruptions=\\[contrast\\]"):
        Sweep(corruptions="contrast")
    with pytest.raises(ValueError, match="unknown protocol"):
        Sweep(protocol="tiny")
    with pytest.raises(ValueError, match=r"robustness.attack='apgd'; choose pgd .* or autoattack"):
        Sweep(adversarial=(8,), attack="apgd")
    with pytest.raises(
        ValueError,
        match=r"robustness.attack=autoattack attacks at the radii of robustness."
        r"adversarial, which is empty; add e.g. robustness.adversarial=\[8\]",
    ):
        Sweep(attack="autoattack")


def test_the_benchmark_sweep_is_one_word_and_the_default_stays_light(tmp_path):
    def sweep(*overrides):
        return compose_config(tmp_path, ["ckpt_path=x.ckpt", *overrides], name="eval").robustness

    assert list(sweep("robustness=benchmark").corruptions) == robustness.list_corruptions("benchmark")
    assert list(sweep("robustness=benchmark").logit_noise) == list(sweep().logit_noise)  # the rest as the default
    assert len(sweep().corruptions) == 8 and sweep().attack == "pgd"


# -- the summary --------------------------------------------------------------------------------
def _records(label, clean, corrupted):
    out = [{"checkpoint": label, "test": "clean", "level": 0, "acc1": clean}]
    for name, accs in corrupted.items():
        out += [{"checkpoint": label, "test": name, "level": s, "acc1": a} for s, a in enumerate(accs, 1)]
    return out


def test_summary_mean_drop_and_mce_follow_hendrycks():
    base = _records("base", 0.9, {"gaussian_noise": [0.8, 0.6], "contrast": [0.7, 0.5]})
    model = _records("model", 0.8, {"gaussian_noise": [0.75, 0.65], "contrast": [0.4, 0.2]})
    s = summarize(base + model, baseline="base")
    assert s["model"]["mean_corrupted_acc1"] == pytest.approx((0.75 + 0.65 + 0.4 + 0.2) / 4)
    assert s["model"]["relative_drop"] == pytest.approx((0.8 - 0.5) / 0.8)
    ce_noise = (0.25 + 0.35) / (0.2 + 0.4)
    ce_contrast = (0.6 + 0.8) / (0.3 + 0.5)
    assert s["model"]["ce"] == pytest.approx({"gaussian_noise": ce_noise, "contrast": ce_contrast})
    assert s["model"]["mce"] == pytest.approx((ce_noise + ce_contrast) / 2)
    rel_noise = ((0.25 - 0.2) + (0.35 - 0.2)) / ((0.2 - 0.1) + (0.4 - 0.1))
    rel_contrast = ((0.6 - 0.2) + (0.8 - 0.2)) / ((0.3 - 0.1) + (0.5 - 0.1))
    assert s["model"]["relative_mce"] == pytest.approx((rel_noise + rel_contrast) / 2)
    assert s["base"]["mce"] == pytest.approx(1.0) and s["base"]["relative_mce"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="baseline 'other' is not among the evaluated checkpoints"):
        summarize(base, baseline="other")


# -- eval.py --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_eval_compares_checkpoints_side_by_side(checkpoints, tmp_path):
    ckpts = f"{{softmax: {checkpoints['vit_softmax']}, linear: {checkpoints['vit_linear']}}}"
    cfg = compose_config(
        tmp_path,
        [
            f"ckpt_path={ckpts}",
            "robustness.corruptions=[gaussian_noise,contrast]",
            "robustness.severities=[1,3,5]",
            "robustness.logit_noise=[0,1]",
            "robustness.resolutions=[2]",
            "robustness.baseline=softmax",
            "robustness.progress=false",
        ],
        name="eval",
    )
    result = evaluate_checkpoints(cfg)
    payload = json.loads((tmp_path / "robustness.json").read_text())
    per_ckpt = 1 + 2 * 3 + 2 + 1
    assert len(payload["records"]) == 2 * per_ckpt == len(result["records"])
    assert {(r["checkpoint"], r["test"], r["level"]) for r in payload["records"]} >= {
        ("softmax", "clean", 0),
        ("linear", "contrast", 5),
        ("linear", "logit_noise", 1.0),
        ("softmax", "resolution", 32),
    }
    for label in ("softmax", "linear"):
        records = {(r["test"], r["level"]): r["acc1"] for r in payload["records"] if r["checkpoint"] == label}
        assert records[("logit_noise", 0.0)] == records[("clean", 0)]
        assert payload["summary"][label]["clean_acc1"] == records[("clean", 0)]
    assert payload["summary"]["softmax"]["mce"] == pytest.approx(1.0)
    assert payload["baseline"] == "softmax" and payload["checkpoints"]["linear"]["attention"]["name"] == "linear"
    with open(tmp_path / "robustness.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 2 * per_ckpt and set(rows[0]) >= {"checkpoint", "test", "level", "acc1", "entropy"}
    assert all((r["entropy"] != "") == (r["test"] in ("clean", "resolution")) for r in rows)
    for png in ("corruptions.png", "logit_noise.png", "resolution.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for label in ("softmax", "linear"):
        assert list((tmp_path / "tensorboard" / label).glob("events.out.tfevents.*"))
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert set(metrics) == {"softmax", "linear"} and metrics["linear"]["num_images"] == 360


@pytest.mark.slow
def test_val_split_held_in_memory_gives_the_streamed_results(checkpoints, tmp_path, monkeypatch):
    overrides = [
        f"ckpt_path={checkpoints['vit_linear']}",
        "robustness.corruptions=[shot_noise]",
        "robustness.severities=[5]",
        "robustness.logit_noise=[1]",
        "robustness.resolutions=[2]",
        "robustness.plots=false",
        "robustness.tensorboard=false",
        "robustness.progress=false",
    ]
    in_memory = evaluate_checkpoints(compose_config(tmp_path / "memory", overrides, name="eval"))["records"]
    monkeypatch.setattr(robustness.api, "MEMORY_BUDGET_BYTES", 0)
    streamed = evaluate_checkpoints(compose_config(tmp_path / "streamed", overrides, name="eval"))["records"]
    assert len(in_memory) == 4 and in_memory == streamed


@pytest.mark.slow
def test_listed_checkpoints_are_labelled_by_attention(checkpoints, tmp_path):
    cfg = compose_config(
        tmp_path,
        [
            f"ckpt_path=[{checkpoints['vit_softmax']},{checkpoints['vit_linear']}]",
            "robustness=clean",
            f"robustness.baseline={checkpoints['vit_linear']}",
            "robustness.progress=false",
        ],
        name="eval",
    )
    payload = evaluate_checkpoints(cfg)
    assert list(payload["metrics"]) == ["softmax", "linear"]
    assert payload["summary"]["linear"]["clean_acc1"] == payload["metrics"]["linear"]["acc1"]


@pytest.mark.slow
def test_eval_bad_input_is_one_line_naming_the_fix(checkpoints, tmp_path):
    ckpt = checkpoints["vit_softmax"]
    proc = subprocess.run(
        [
            sys.executable,
            "eval.py",
            f"ckpt_path={ckpt}",
            f"hydra.run.dir={tmp_path / 'eval'}",
            "robustness.corruptions=[gaussian_noise,rain]",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unknown corruption(s) ['rain']; choose from"), proc.stderr
    assert "'jpeg_compression'" in lines[0]

    def evaluate(*overrides):
        return evaluate_checkpoints(compose_config(tmp_path / "e", [*overrides, "robustness=clean"], name="eval"))

    with pytest.raises(FileNotFoundError, match="does not exist"):
        evaluate(f"ckpt_path={tmp_path / 'missing.ckpt'}")
    with pytest.raises(ValueError, match="neither a checkpoint label"):
        evaluate(f"ckpt_path={ckpt}", "robustness.baseline=nothing")
    with pytest.raises(ValueError, match="has 10 classes but the data has 3; pass the data"):
        evaluate(f"ckpt_path={ckpt}", "data=synthetic", "data.num_classes=3")
    with pytest.raises(
        ValueError,
        match=r"data.img_size=32, but each checkpoint is evaluated at the size it was "
        r"trained at: .*last.ckpt \(16 px\); drop data.img_size.*robustness.resolutions",
    ):
        evaluate(f"ckpt_path={ckpt}", "data.img_size=32")
    with pytest.raises(ValueError, match=r"resolutions=\[1.0, 1.1\] give the sizes \[16, 16\] px .*drop"):
        evaluate(f"ckpt_path={ckpt}", "robustness.resolutions=[1.0,1.1]")
    # A checkpoint whose weights belong to another architecture than the one it names.
    checkpoint = read_checkpoint(ckpt)
    checkpoint["hyper_parameters"]["arch"] = "nonlocal_resnet18_cifar"
    torch.save(checkpoint, tmp_path / "other.ckpt")
    with pytest.raises(ValueError, match="do not fit the architecture it names \\(nonlocal_resnet18_cifar"):
        evaluate(f"ckpt_path={tmp_path / 'other.ckpt'}")


def _released_digits(root, layout):
    """The digits val split as released files of ``fog``: severity 1 holds the images as they are, the other
    severities the images inverted (uint8, as the released files are); returns the images and labels."""
    loader = unit_loader(16)
    clean = (torch.cat([x for x, _ in loader]) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
    labels = torch.cat([y for _, y in loader])
    images = torch.cat([clean, *(255 - clean,) * 4]).numpy()
    labels = labels.repeat(5).numpy().astype("uint8")
    if layout == "cifar":
        write_cifar_c(root, names=("fog",), images=images, labels=labels)
    else:
        write_imagenet_c(root, classes=[str(c) for c in range(10)], names=("fog",), images=images, labels=labels)
    return torch.from_numpy(images), torch.from_numpy(labels)


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["cifar", "imagenet"])
def test_eval_reads_the_released_files_as_released(checkpoints, tmp_path, layout, monkeypatch):
    """source=files: the corruption passes score the files' images, only normalised (corrupt() is never
    called); clean and logit-noise passes stay on the val split; the JSON names source and root."""
    images, labels = _released_digits(tmp_path / "released", layout)

    def no_corrupt(*args, **kwargs):
        raise AssertionError("corrupt() called on a source=files pass")

    monkeypatch.setattr(robustness.sweep, "corrupt", no_corrupt)
    overrides = [
        f"ckpt_path={checkpoints['vit_softmax']}",
        "robustness.source=files",
        f"robustness.root={tmp_path / 'released'}",
        "robustness.corruptions=[fog]",
        "robustness.severities=[1,5]",
        "robustness.logit_noise=[1]",
        "robustness.resolutions=[]",
        "robustness.plots=false",
        "robustness.tensorboard=false",
        "robustness.progress=false",
    ]
    result = evaluate_checkpoints(compose_config(tmp_path / "eval", overrides, name="eval"))
    acc = {(r["test"], r["level"]): r for r in result["records"]}
    model, hp = load_classifier(checkpoints["vit_softmax"])
    mean, std = (torch.tensor(v).view(1, -1, 1, 1) for v in (hp["mean"], hp["std"]))
    per = len(images) // 5
    for severity, block in ((1, slice(0, per)), (5, slice(4 * per, 5 * per))):
        x = images[block].permute(0, 3, 1, 2).float() / 255
        with torch.no_grad():
            expected = (model((x - mean) / std).argmax(1) == labels[block].long()).sum().item() / per
        assert acc[("fog", severity)]["num_images"] == per == 360
        assert acc[("fog", severity)]["acc1"] == pytest.approx(expected, abs=1e-6)  # torchmetrics: float32
    assert acc[("fog", 5)]["acc1"] < acc[("fog", 1)]["acc1"] - 0.3  # inverted digits: a different pass indeed
    assert abs(acc[("clean", 0)]["acc1"] - acc[("fog", 1)]["acc1"]) <= 2 / 360  # the val split, as 8-bit files
    assert ("logit_noise", 1.0) in acc
    payload = json.loads((tmp_path / "eval" / "robustness.json").read_text())
    assert payload["source"] == "files" and payload["root"] == str((tmp_path / "released").resolve())


@pytest.mark.slow
def test_eval_released_files_refusals_name_the_fix(checkpoints, tmp_path):
    def evaluate(*overrides):
        return evaluate_checkpoints(
            compose_config(
                tmp_path / "e",
                [
                    f"ckpt_path={checkpoints['vit_softmax']}",
                    "robustness.logit_noise=[]",
                    "robustness.resolutions=[]",
                    *overrides,
                ],
                name="eval",
            )
        )

    _released_digits(tmp_path / "digits", "cifar")
    small = write_cifar_c(tmp_path / "small")  # 8 x 6 px images of fog and gaussian_noise
    with pytest.raises(ValueError, match=r"^robustness.source=files needs robustness.root=<the folder of CIFAR"):
        evaluate("robustness.source=files")
    with pytest.raises(ValueError, match=r"robustness.root=.* is read only with robustness.source=files; add"):
        evaluate(f"robustness.root={small}")
    with pytest.raises(
        ValueError,
        match=r"has no files for \['shot_noise'\]; it holds \['fog'\]: pass "
        r"robustness.corruptions=\[fog\]",
    ):
        evaluate(
            "robustness.source=files",
            f"robustness.root={tmp_path / 'digits'}",
            "robustness.corruptions=[fog,shot_noise]",
        )
    with pytest.raises(ValueError, match=r"holds 8x6 px images but softmax \(16 px\) took other sizes"):
        evaluate("robustness.source=files", f"robustness.root={small}", "robustness.corruptions=[fog]")
    with pytest.raises(ValueError, match=r"robustness.protocol=imagenet but .* holds the cifar benchmark's files"):
        evaluate(
            "robustness.source=files",
            f"robustness.root={tmp_path / 'digits'}",
            "robustness.corruptions=[fog]",
            "robustness.protocol=imagenet",
        )
    with pytest.raises(ValueError, match=r"robustness.source='disk'; choose computed"):
        evaluate("robustness.source=disk")


@pytest.mark.slow
def test_eval_refuses_a_missing_autoattack_install_before_the_first_pass(checkpoints, tmp_path, monkeypatch):
    """A sweep would die at its AutoAttack pass after minutes of others: the install is checked first; PGD and
    frost need nothing besides vitzoo."""

    def no_pass(*args, **kwargs):
        raise AssertionError("a pass ran before the install check")

    monkeypatch.setattr(robustness.api, "run_pass", no_pass)
    monkeypatch.setitem(sys.modules, "torchattacks", None)  # import torchattacks raises ImportError
    overrides = [
        f"ckpt_path={checkpoints['vit_softmax']}",
        "robustness=clean",
        "robustness.progress=false",
        "robustness.adversarial=[2]",
    ]
    with pytest.raises(ImportError, match=r"needs torchattacks: pip install --no-deps torchattacks==3.5.1"):
        evaluate_checkpoints(compose_config(tmp_path / "b", [*overrides, "robustness.attack=autoattack"], name="eval"))


@pytest.mark.slow
def test_eval_warns_when_the_run_trained_on_other_data(checkpoints, tmp_path, caplog):
    """Same class count, other data: the checkpoint's run (.hydra/config.yaml) says what it trained on."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".hydra").mkdir()
    shutil.copy(checkpoints["vit_softmax"], run / "checkpoints" / "last.ckpt")
    (run / ".hydra" / "config.yaml").write_text("data:\n  _target_: vitzoo.data.SyntheticDataModule\n")
    for data, warned in [([], True), (["data=synthetic", "data.img_size=16"], False)]:
        caplog.clear()
        evaluate_checkpoints(
            compose_config(
                tmp_path / "e",
                [
                    f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}",
                    "robustness=clean",
                    "robustness.progress=false",
                    *data,
                ],
                name="eval",
            )
        )
        said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert (
            any(
                "trained on SyntheticDataModule but is evaluated on DigitsDataModule: pass the data=" in m for m in said
            )
            == warned
        ), said


@pytest.mark.slow
def test_attention_noise_switches_every_layer_on_and_restores_it(checkpoints):
    model, _ = load_classifier(checkpoints["vit_linear"])
    layers = [m for m in model.modules() if hasattr(m, "eval_logit_noise")]
    with attention_noise(model, 0.7):
        assert [m.eval_logit_noise for m in layers] == [0.7, 0.7]
        assert [m.active_logit_noise for m in layers] == [0.7, 0.7]  # eval mode
    assert [m.eval_logit_noise for m in layers] == [0.0, 0.0]
    with pytest.raises(ValueError, match="sigma is a standard deviation"):
        with attention_noise(model, -1.0):
            pass
    with pytest.raises(ValueError, match="no vitzoo attention layers"):
        with robustness.attention_noise(nn.Linear(2, 2), 1.0):
            pass


@pytest.mark.slow
def test_eval_ends_with_a_table_and_the_paths_and_its_log_holds_them(checkpoints, tmp_path):
    """eval.py's closing lines: one row per checkpoint (accuracies in %, as in robustness.json), then every
    file's path (each exists) and the run directory; eval.log holds the same lines as the console."""
    run = tmp_path / "eval"
    ckpts = f"{{softmax: {checkpoints['vit_softmax']}, linear: {checkpoints['vit_linear']}}}"
    proc = subprocess.run(
        [
            sys.executable,
            "eval.py",
            f"ckpt_path={ckpts}",
            f"hydra.run.dir={run}",
            "robustness.corruptions=[gaussian_noise]",
            "robustness.severities=[5]",
            "robustness.logit_noise=[0,1]",
            "robustness.resolutions=[2]",
            "robustness.baseline=softmax",
            "robustness.progress=false",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line.split("] ", 1)[1] for line in proc.stdout.splitlines()]  # "[time][INFO] message"
    header = said.index(next(line for line in said if line.startswith("checkpoint ")))
    assert said[header - 1].split() == ["corruptions", "logit", "noise", "input", "size"]
    assert said[header].split() == "checkpoint clean mean 1 of 15 mean CE 1 of 15 vs softmax 1 2x".split()
    summary = json.loads((run / "robustness.json").read_text())["summary"]
    for line, label in zip(said[header + 1 : header + 3], ("softmax", "linear")):
        s = summary[label]
        expected = [
            s["clean_acc1"],
            s["mean_corrupted_acc1"],
            s["mce"],
            s["logit_noise_acc1"]["1"],
            s["resolution_acc1"]["32"],
        ]
        assert line.split() == [label, *(f"{100 * v:.1f}" for v in expected)], line
    assert (
        said[header + 3] == "corruptions: mean = accuracy over gaussian_noise x severities (1 of 15 at "
        "severities 5: not the 15 x 5)"
    )
    assert said[header + 4].startswith("  mean CE (not mCE, which needs the 15 at severities 1-5) vs softmax = ")
    assert "360 images per pass" in said[header - 2] and "Digits val split" in said[header - 2]

    start = said.index(f"run directory: {run.resolve()}")  # then the files, relative to it
    paths = dict(line.strip().split(": ", 1) for line in said[start + 1 :])
    assert list(paths) == ["results", "plots", "tensorboard", "log"] and said[start - 1].startswith("input size: ")
    files = [name for key in ("results", "plots", "log") for name in paths[key].split(", ")]
    assert sorted(files) == sorted(
        "robustness.json robustness.csv metrics.json corruptions.png logit_noise.png resolution.png eval.log".split()
    )
    assert all((run / name).is_file() for name in files)
    assert paths["tensorboard"] == f"tensorboard (tensorboard --logdir {run.resolve() / 'tensorboard'})"
    assert (run / "tensorboard" / "softmax").is_dir()

    logged = (run / "eval.log").read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in logged] == said  # the log holds every line the console showed


@pytest.mark.slow
def test_pgd_drops_a_trained_digits_model_well_below_clean_and_below_fgsm(checkpoints):
    from vitzoo.robustness.adversarial import adversarial_accuracy

    model, hp = load_classifier(checkpoints["vit_softmax"])
    loader = unit_loader(16, max_images=180)
    clean = sweep_pass(model, hp, Pass("clean", 0), loaders={16: loader})["acc1"]
    weak, strong = (
        adversarial_accuracy(model, loader, hp["mean"], hp["std"], eps / 255, torch.device("cpu")) for eps in (2, 8)
    )
    assert weak["num_images"] == strong["num_images"] == 180
    for r in (weak, strong):
        assert r["acc1"] <= r["fgsm_acc1"] <= clean  # PGD at least as strong as FGSM, both at most clean
    assert strong["acc1"] < clean - 0.4 and strong["acc1"] <= weak["acc1"], (clean, weak, strong)
    with pytest.raises(ValueError, match="eps must be > 0"):
        adversarial_accuracy(model, loader, hp["mean"], hp["std"], 0.0, torch.device("cpu"))


@pytest.mark.slow
def test_autoattack_is_at_least_as_strong_as_pgd_on_a_trained_digits_model(checkpoints):
    """AutoAttack's standard set (APGD-CE, APGD-T, FAB-T, Square) finds every image PGD-10 finds and more: its robust
    accuracy is at most PGD's at the same eps, and well below clean."""
    pytest.importorskip("torchattacks", reason=ATTACKS)
    from vitzoo.robustness.adversarial import adversarial_accuracy

    model, hp = load_classifier(checkpoints["vit_softmax"])
    loader = unit_loader(16, max_images=60, batch_size=30)  # two batches: AutoAttack re-seeds between them
    clean = sweep_pass(model, hp, Pass("clean", 0), loaders={16: loader})["acc1"]
    result = adversarial_accuracy(
        model, loader, hp["mean"], hp["std"], 4 / 255, torch.device("cpu"), attack="autoattack"
    )
    assert result["autoattack_acc1"] <= result["acc1"] <= result["fgsm_acc1"] <= clean, (clean, result)
    assert result["autoattack_acc1"] < clean - 0.3, (clean, result)
    pgd_only = adversarial_accuracy(model, loader, hp["mean"], hp["std"], 4 / 255, torch.device("cpu"))
    assert pgd_only == {k: v for k, v in result.items() if k != "autoattack_acc1"}  # AutoAttack leaves PGD's draws
    with pytest.raises(ValueError, match="attack='apgd'; choose pgd .* or autoattack"):
        adversarial_accuracy(model, loader, hp["mean"], hp["std"], 4 / 255, torch.device("cpu"), attack="apgd")


@pytest.mark.slow
def test_eval_records_pgd_accuracy_per_checkpoint(checkpoints, tmp_path):
    overrides = [
        f"ckpt_path={checkpoints['vit_linear']}",
        "robustness=clean",
        "robustness.adversarial=[2,8]",
        "robustness.max_images=90",
        "robustness.progress=false",
        "robustness.plots=true",
        "robustness.tensorboard=true",
    ]
    result = evaluate_checkpoints(compose_config(tmp_path, overrides, name="eval"))
    assert (tmp_path / "adversarial.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = EventAccumulator(str(tmp_path / "tensorboard" / "linear")).Reload()
    assert {"pgd_linf/acc1", "fgsm_linf/acc1"} <= set(scalars.Tags()["scalars"])
    logged = scalars.Scalars("pgd_linf/acc1")
    recorded = [r for r in result["records"] if r["test"] == "pgd_linf"]
    assert [e.step for e in logged] == [r["level"] for r in recorded]
    assert [e.value for e in logged] == pytest.approx([r["acc1"] for r in recorded], abs=1e-6)  # stored as float32
    adv = {r["level"]: r for r in result["records"] if r["test"] == "pgd_linf"}
    clean = result["summary"]["linear"]["clean_acc1"]
    assert sorted(adv) == [2.0, 8.0] and all(r["num_images"] == 90 for r in adv.values())
    assert adv[8.0]["acc1"] <= adv[8.0]["fgsm_acc1"] <= clean and adv[8.0]["acc1"] < clean - 0.3
    summary = json.loads((tmp_path / "robustness.json").read_text())["summary"]["linear"]
    assert summary["pgd_linf_acc1"] == {"2/255": adv[2.0]["acc1"], "8/255": adv[8.0]["acc1"]}
    assert summary["attack_check"] == "ok" and summary["attack_set"] == "PGD-10 + FGSM"
    with open(tmp_path / "robustness.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["test"] == "pgd_linf"]
    assert [float(r["fgsm_acc1"]) for r in rows] == [adv[2.0]["fgsm_acc1"], adv[8.0]["fgsm_acc1"]]
    with pytest.raises(ValueError, match=r"robustness.adversarial \[-1.0\] must be positive"):
        evaluate_checkpoints(compose_config(tmp_path / "bad", [*overrides, "robustness.adversarial=[-1]"], name="eval"))

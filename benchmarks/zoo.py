"""The zoo benchmark: every mechanism trained with one recipe, then profiled, evaluated and tabulated.

    python benchmarks/zoo.py --budget cpu --data ../shared/data/cifar10-train-jpg.tar.gz
    python benchmarks/zoo.py --budget gpu --data /data/cifar10-jpg          # on a GPU machine
    python benchmarks/zoo.py --budget cpu --data ... --phases report         # re-tabulate only
    python benchmarks/zoo.py --budget cpu --data ... --presets vit_softmax,vit_linear \
        --work /tmp/zoo --out /tmp/zoo/report --override trainer.max_epochs=1   # a quick trial

Phases (``--phases``, default all, each skips what is already done, so a stopped run resumes):

* ``train``: ``train.py experiment=zoo_<budget> model=<preset> seed=<s>`` for every preset and seed
  (same data split, recipe and epochs; the budget adds the model size), one run dir each under
  ``--work``. A run with ``metrics.json`` is done; one with only ``last.ckpt`` is resumed.
* ``profile``: per run, in a fresh process: parameters, forward FLOPs per image (counted with
  ``torch.utils.flop_counter`` on the eager twins, so the attention matmuls are seen), training
  img/s (forward, backward, AdamW step on a batch of the recipe's size) and the peak resident
  memory of those steps above the process's baseline.
* ``eval``: one ``eval.py`` call over all final checkpoints (``last.ckpt``): clean accuracy,
  Gaussian noise severities 1-5, the attention-logit noise sweep, the resolution sweep.
* ``report``: one result file per finished run into ``--out``/per-run (see zoo_results.py), plus the files
  ``--merge`` names (other calls' or machines' runs); then ``results.md`` (table), ``results.csv`` and the plots
  into ``--out``, drawn from every result file in per-run/.

    python benchmarks/zoo.py --budget gpu --phases report --merge /elsewhere/zoo/per-run   # join another call's runs

``--per-run`` takes each run through every phase (an eval.py call of its own, into its run dir) and writes its
result file before the next run starts: a call that is stopped (a GPU loan's time limit) keeps what it finished.

``--data`` is the CIFAR-10 JPEG tree (a folder holding ``train/<class>/*.jpg``) or its ``.tar.gz``,
unpacked once to ``~/.cache/vitzoo/``.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

ROOT = Path(__file__).resolve().parents[1]

import zoo_results  # noqa: E402  (sibling modules: scripts run from benchmarks/ see them)
from memory import status_mib  # noqa: E402
PHASES = ("train", "profile", "eval", "report")



def zoo_presets(model_dir: Path = ROOT / "configs" / "model") -> Tuple[Tuple[str, str], ...]:
    """(label in the table, Hydra model preset) for every preset in configs/model/: the ViTs (softmax
    first), then the non-local ResNets. A preset without its ``label:`` is an error naming the file."""
    import yaml

    rows = []
    for path in sorted(model_dir.glob("*.yaml")):
        label = (yaml.safe_load(path.read_text()) or {}).get("label")
        if not isinstance(label, str) or not label:
            raise SystemExit(f"{path}: add a `label:` line (the preset's row name in the zoo table)")
        rows.append((label, path.stem))
    return tuple(sorted(rows, key=lambda row: (row[1].startswith("nonlocal"), row[1] != "vit_softmax", row[1])))


PRESETS = zoo_presets()


@dataclass(frozen=True)
class Budget:
    """What differs between budgets; the recipe itself is ``configs/experiment/<experiment>.yaml``."""

    experiment: str
    vit_kwargs: Dict[str, object]
    resnet_kwargs: Dict[str, object]
    seeds: Dict[str, Tuple[int, ...]] = field(default_factory=dict)  # extra seeds per preset (default: seed 0)
    eval_images: Optional[int] = None  # val images for the robustness sweeps (None = all)
    robustness: str = "zoo"


BUDGETS = {
    # ~0.8M-parameter ViT, 2 epochs: all presets in about 2.5 h on a 2-core CPU.
    "cpu": Budget("zoo_cpu", dict(embed_dim=128, depth=6, num_heads=4, mlp_ratio=2.0, drop_path_rate=0.0),
                  dict(channels=[16, 32, 64, 128], stem_width=16),
                  seeds={"vit_softmax": (0, 1), "vit_linear": (0, 1)}, eval_images=2000),
    # ViT-Tiny width (5.4M parameters at mlp_ratio 4), 50 epochs, one seed; a full-width ResNet-18.
    "gpu": Budget("zoo_gpu", dict(embed_dim=192, depth=12, num_heads=3, mlp_ratio=4.0, drop_path_rate=0.1), {}),
}


@dataclass(frozen=True)
class Run:
    label: str
    preset: str
    seed: int
    dir: Path

    @property
    def name(self) -> str:
        return f"{self.preset}-s{self.seed}"

    @property
    def last_ckpt(self) -> Path:
        return self.dir / "checkpoints" / "last.ckpt"


def plan(budget: Budget, work: Path, only: Optional[Sequence[str]]) -> List[Run]:
    runs = []
    for label, preset in PRESETS:
        if only and preset not in only:
            continue
        for seed in budget.seeds.get(preset, (0,)):
            runs.append(Run(label, preset, seed, work / preset / f"seed{seed}"))
    return runs


def _hydra_value(value) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return str(value)


def model_overrides(budget: Budget, preset: str) -> List[str]:
    kwargs = budget.resnet_kwargs if preset.startswith("nonlocal") else budget.vit_kwargs
    return [f"++model.kwargs.{k}={_hydra_value(v)}" for k, v in kwargs.items()]


def _run_logged(cmd: List[str], log: Path) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        code = subprocess.call(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if code:
        raise SystemExit(f"failed ({code}): {' '.join(cmd)}\n  log: {log}")


# ---------------------------------------------------------------- train
def train(runs: List[Run], budget: Budget, data_root: Path, overrides: Sequence[str] = ()) -> None:
    for i, run in enumerate(runs, 1):
        if (run.dir / "metrics.json").is_file():
            print(f"[train {i}/{len(runs)}] {run.name}: done", flush=True)
            continue
        cmd = [sys.executable, "train.py", f"experiment={budget.experiment}", f"model={run.preset}",
               f"seed={run.seed}", f"data.root={data_root}", f"hydra.run.dir={run.dir}",
               *model_overrides(budget, run.preset), *overrides]
        if run.last_ckpt.is_file():
            cmd.append(f"ckpt_path={run.last_ckpt}")
        print(f"[train {i}/{len(runs)}] {run.name} ...", flush=True)
        start = time.time()
        _run_logged(cmd, run.dir / "harness.log")
        print(f"[train {i}/{len(runs)}] {run.name}: {time.time() - start:.0f} s", flush=True)


# ---------------------------------------------------------------- profile
def _eager_twins(model) -> None:
    """Switch fused paths to their eager twins so FlopCounterMode sees every attention matmul."""
    from vitzoo.attention import LinearAttention, SoftmaxAttention

    for m in model.modules():
        if isinstance(m, SoftmaxAttention):
            m.fused = False
        elif isinstance(m, LinearAttention):
            m.impl = "eager"


def profile_one(ckpt: Path, batch_size: int, steps: int) -> Dict[str, float]:
    """Parameters, forward FLOPs per image, train img/s and peak train memory of a checkpoint's network."""
    import torch
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from vitzoo.training import build_model, read_checkpoint

    hp = read_checkpoint(ckpt)["hyper_parameters"]
    base = status_mib("VmRSS")
    cuda = torch.cuda.is_available()  # on a GPU: bf16 autocast, peak = torch's max allocated
    device = torch.device("cuda" if cuda else "cpu")
    model = build_model(hp).to(device)
    params = sum(p.numel() for p in model.parameters())
    size = (batch_size, hp.get("in_chans", 3), hp["img_size"], hp["img_size"])
    x = torch.randn(size, device=device)
    y = torch.randint(0, hp["num_classes"], (batch_size,), device=device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(steps + 2):
        start = time.perf_counter()
        with autocast:
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize()
        if i >= 2:  # two warm-up steps
            times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else status_mib("VmHWM") - base
    times.sort()
    model.eval()
    _eager_twins(model)
    with FlopCounterMode(display=False) as counter:
        model(x[:1])
    return {"params": params, "flops_per_image": counter.get_total_flops(),
            "train_img_per_s": batch_size / times[len(times) // 2], "peak_train_mb": peak, "batch_size": batch_size,
            "torch": torch.__version__, "device": "cuda bf16" if cuda else "cpu fp32", "hardware": _hardware()}


def profile(runs: List[Run], batch_size: int, steps: int) -> None:
    for run in runs:
        out = run.dir / "profile.json"
        if out.is_file() or not (run.dir / "metrics.json").is_file():
            continue
        cmd = [sys.executable, __file__, "--profile-one", str(run.last_ckpt), "--batch-size", str(batch_size),
               "--steps", str(steps)]
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        if result.returncode:
            raise SystemExit(f"profiling {run.name} failed:\n{result.stderr[-2000:]}")
        out.write_text(result.stdout.strip().splitlines()[-1] + "\n")
        print(f"[profile] {run.name}: {out.read_text().strip()}", flush=True)


# ---------------------------------------------------------------- eval
def _eval_key(run: Run) -> str:
    return f"{run.preset}_s{run.seed}"


def evaluate(runs: List[Run], budget: Budget, data_root: Path, work: Path) -> Path:
    """One eval.py call over every run's last.ckpt (labels ``<preset>_s<seed>``), into ``work/eval``."""
    from omegaconf import OmegaConf

    out = work / "eval"
    ready = [r for r in runs if (r.dir / "metrics.json").is_file()]  # finished runs only
    if (out / "robustness.json").is_file():
        done = set(json.loads((out / "robustness.json").read_text())["checkpoints"])
        if done == {_eval_key(r) for r in ready}:
            print("[eval] done", flush=True)
            return out
    if not ready:
        raise SystemExit("no trained runs to evaluate; run the train phase first")
    data = OmegaConf.load(ROOT / "configs" / "experiment" / f"{budget.experiment}.yaml").data
    data_overrides = [f"data.{k}={data[k]}" for k in ("img_size", "val_fraction", "split_seed", "eval_batch_size",
                                                         "num_workers") if k in data]
    ckpts = "{" + ",".join(f"{_eval_key(r)}:{r.last_ckpt}" for r in ready) + "}"
    cmd = [sys.executable, "eval.py", f"ckpt_path={ckpts}", "data=imagefolder", f"data.root={data_root}",
           *data_overrides, f"robustness={budget.robustness}", "robustness.progress=false",
           f"hydra.run.dir={out}"]
    if budget.eval_images is not None:
        cmd.append(f"robustness.max_images={budget.eval_images}")
    print(f"[eval] {len(ready)} checkpoints ...", flush=True)
    start = time.time()
    shutil.rmtree(out, ignore_errors=True)
    _run_logged(cmd, work / "eval.log")
    print(f"[eval] {time.time() - start:.0f} s", flush=True)
    return out


# ---------------------------------------------------------------- report
COLUMNS = ("mechanism", "preset", "seeds", "params", "MFLOPs/img", "train img/s", "peak train MB", "val acc",
           "gauss sev1-5", "logit sigma=1", "2x res", "entropy init", "entropy end", "entropy 2x res")
CSV_ONLY = ("eval clean acc", "torch", "hardware")  # in results.csv, not in the table


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def collect(runs: List[Run], budget_name: str, budget: Budget, work: Path, overrides: Sequence[str]) -> List[tuple]:
    """(run dir, result file) of every trained run in this work dir, with its eval records where evaluated (by
    a ``--per-run`` call in the run dir, or by one call over the work dir)."""
    out = []
    for run in runs:
        if not (run.dir / "metrics.json").is_file():
            continue
        prof = json.loads((run.dir / "profile.json").read_text()) if (run.dir / "profile.json").is_file() else {}
        evals = (json.loads(p.read_text()) for p in (run.dir / "eval" / "robustness.json",
                                                      work / "eval" / "robustness.json") if p.is_file())
        robustness = next((e for e in evals if _eval_key(run) in e["checkpoints"]), {})
        ckpt = robustness.get("checkpoints", {}).get(_eval_key(run))
        records = {"sweep": robustness["sweep"], "img_size": ckpt["img_size"],
                   "records": [r for r in robustness["records"] if r["checkpoint"] == _eval_key(run)]} if ckpt else None
        out.append((run.dir, zoo_results.build(
            budget_name, run.label, run.preset, run.seed, budget.experiment, overrides,
            json.loads((run.dir / "metrics.json").read_text()), prof, records)))
    return out


def _fmt(key: str, values: List[Optional[float]]) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return "-"
    if key == "params":
        return f"{known[0] / 1e6:.2f}M"
    if key in ("MFLOPs/img", "train img/s", "peak train MB"):
        return f"{_mean(known):.0f}"
    if key.startswith("entropy"):
        return " / ".join(f"{v:.3f}" for v in known)
    cell = " / ".join(f"{100 * v:.1f}" for v in known)  # accuracies in %, one per seed
    return cell + (f" (mean {100 * _mean(known):.1f})" if len(known) > 1 else "")


def _hardware() -> str:
    import platform

    import torch

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
               platform.processor() or "unknown CPU") if os.path.exists("/proc/cpuinfo") else platform.processor()
    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {os.cpu_count()} cores{gpu}"


def _provenance(results: List[dict]) -> str:
    """Which machine and torch each row was profiled on (rows may come from several calls and machines)."""
    groups: Dict[str, List[str]] = {}
    for r in results:
        where = f"{r['profile'].get('hardware', 'hardware not recorded')}, torch {r['row'].get('torch') or '?'}"
        names = groups.setdefault(where, [])
        if f"`{r['preset']}`" not in names:
            names.append(f"`{r['preset']}`")
    if len(groups) == 1:
        return f"{next(iter(groups))} for every row"
    return "; ".join(f"{where} for {', '.join(names)}" for where, names in groups.items())


def _order(result: dict) -> tuple:
    order = [preset for _, preset in PRESETS]
    return order.index(result["preset"]) if result["preset"] in order else len(order), result["preset"], result["seed"]


def report(results: List[dict], budget_name: str, budget: Budget, out: Path, command: str) -> Path:
    """results.md + results.csv + plots into ``out``, from the result files of every run in ``out/per-run``."""
    import csv

    from vitzoo.robustness.plots import plot_results

    if not results:
        raise SystemExit("nothing to report yet; run the train phase first, or --merge result files")
    results = sorted(results, key=_order)
    rows: Dict[str, List[dict]] = {}
    for r in results:
        rows.setdefault(r["preset"], []).append(r)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["mechanism", "preset", "seed", *COLUMNS[3:], *CSV_ONLY])
        for r in results:
            cells = {**r["row"], "hardware": r["profile"].get("hardware")}
            writer.writerow([r["label"], r["preset"], r["seed"], *[cells.get(k) for k in (*COLUMNS[3:], *CSV_ONLY)]])
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for preset, preset_rows in rows.items():
        cells = [preset_rows[0]["label"], f"`{preset}`", ",".join(str(r["seed"]) for r in preset_rows)]
        cells += [_fmt(k, [r["row"][k] for r in preset_rows]) for k in COLUMNS[3:]]
        lines.append("| " + " | ".join(cells) + " |")
    curves = [r for r in results if (r["robustness"] or {}).get("records")]
    for name in ("corruptions", "logit_noise", "resolution"):
        (out / f"{name}.png").unlink(missing_ok=True)
    data = f"CIFAR-10 val split ({budget.experiment})"
    plot_results([rec for r in curves for rec in r["robustness"]["records"]], out,
                 {rec["checkpoint"]: r["robustness"]["img_size"] for r in curves for rec in r["robustness"]["records"]},
                 data)
    _save_figure(summary_figure(rows, data, val_images(budget), budget.eval_images), out / "summary.png")
    exp = (ROOT / "configs" / "experiment" / f"{budget.experiment}.yaml").relative_to(ROOT)
    batches = sorted({r["profile"]["batch_size"] for r in results if "batch_size" in r["profile"]})
    batch = "batch " + " / ".join(map(str, batches)) if batches else "batch size not recorded"
    sweep = next((r["robustness"]["sweep"] for r in results if r["robustness"]), {})
    extra = results[0]["overrides"]
    no_curves = [f"`{zoo_results.file_name(r['preset'], r['seed'])}`" for r in results if r not in curves]
    text = [
        f"# Zoo benchmark, `{budget_name}` budget", "",
        f"{len(results)} runs, one result file each in `per-run/`, merged by `{command}` on "
        f"{time.strftime('%Y-%m-%d')}. Profiled on {_provenance(results)}.", "",
        f"Recipe: `{exp}`" + (f" with `{' '.join(extra)}`" if extra else "") + " (same data split, seed, "
        "augmentation, optimiser and epochs for every row); model size: "
        f"ViT `{budget.vit_kwargs}`, non-local ResNet-18 `{budget.resnet_kwargs or 'full width'}`.",
        f"Robustness columns: eval.py with `robustness={budget.robustness}` on the first "
        f"{budget.eval_images or 'all'} val images (Gaussian noise severities {sweep.get('severities')}, protocol "
        f"{sweep.get('protocol') or 'by size'}; logit-noise sigma in {sweep.get('logit_noise')}; inputs at "
        f"{sweep.get('resolutions')} x the training size). Accuracies in %, one value per seed.",
        f"Params / FLOPs (forward, one image, attention matmuls included) / img/s (training step, {batch}) / peak "
        "memory (on a GPU: torch's max allocated under bf16 autocast; on the CPU: resident set above the process "
        "baseline, fp32) during those steps come from the profile phase, run one "
        "model at a time on the same machine. Entropy: mean over layers of H / log n of the attention rows (1 = "
        "uniform) on 32 val images, before training and after the last epoch; at 2x res, the same on the first 32 "
        "eval images at twice the training size.", "",
        *lines, "",
        "![summary](summary.png)", "",
    ]
    if curves:
        text += ["![gaussian noise](corruptions.png) ![logit noise](logit_noise.png) ![resolution](resolution.png)", ""]
    if no_curves:
        text += [f"No sweep curves for {', '.join(no_curves)}: converted from the table of an earlier harness "
                 "version, which kept the numbers but not the sweep records.", ""]
    (out / "results.md").write_text("\n".join(text))
    print(f"[report] {out / 'results.md'}", flush=True)
    return out


CIFAR10_TRAIN_IMAGES = 50_000  # the --data tree's train/ (CIFAR-10); the val split is the recipe's fraction of it
SUMMARY_KEYS = ("val acc", "gauss sev1-5", "logit sigma=1", "2x res")


def val_images(budget: Budget) -> int:
    """The val split's size: the recipe's ``data.val_fraction`` of CIFAR-10's 50,000 training JPEGs (as the
    data module rounds it), which the result files do not record."""
    import yaml

    recipe = yaml.safe_load((ROOT / "configs" / "experiment" / f"{budget.experiment}.yaml").read_text())
    return math.ceil(recipe["data"]["val_fraction"] * CIFAR10_TRAIN_IMAGES)


def _images(result: dict, key: str, val: int, eval_images: Optional[int]) -> int:
    """The images behind one accuracy of one run: the val split for ``val acc``; for the sweep's columns the
    run's eval records (converted rows have none: the budget's ``eval_images``, else the val split)."""
    if key == "val acc":
        return val
    clean = [r for r in (result["robustness"] or {}).get("records", []) if r["test"] == "clean"]
    return clean[0]["num_images"] if clean else eval_images or val


def summary_figure(rows: Dict[str, List[dict]], data: str, val: int, eval_images: Optional[int]):
    """Bars: each preset's mean over seeds of the table's accuracies, with the Wilson 95% interval of that mean
    on its images (test-set sampling only) as error bars; dots: the single seeds. Accuracy axis 0-100%."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import PercentFormatter

    from vitzoo.robustness.intervals import accuracy_interval

    labels = [preset_rows[0]["label"] for preset_rows in rows.values()]
    fig, ax = plt.subplots(figsize=(11, 5.2))
    width = 0.8 / len(SUMMARY_KEYS)
    sweep_images = set()
    for i, key in enumerate(SUMMARY_KEYS):
        xs, means, low, high = [], [], [], []
        for x, preset_runs in enumerate(rows.values()):
            known = [(r["row"][key], _images(r, key, val, eval_images))
                     for r in preset_runs if r["row"][key] is not None]
            if not known:
                continue
            mean, n = _mean([acc for acc, _ in known]), min(n for _, n in known)
            lo, hi = accuracy_interval(mean, n)
            xs.append(x + i * width)
            means.append(mean)
            low.append(mean - lo)
            high.append(hi - mean)
            if key != "val acc":
                sweep_images.update(n for _, n in known)
            if len(known) > 1:
                ax.plot([x + i * width] * len(known), [acc for acc, _ in known], "k.", markersize=3)
        ax.bar(xs, means, width, yerr=[low, high], capsize=2, error_kw={"linewidth": 0.8}, label=key)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels, rotation=35, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
    ax.set_ylabel("top-1 accuracy")
    ax.legend(ncol=4, fontsize="small", loc="upper right")
    ax.grid(axis="y", alpha=0.3)
    sweep = ", ".join(f"{n:,}" for n in sorted(sweep_images)) or "-"
    runs = sum(len(preset_runs) for preset_runs in rows.values())
    fig.suptitle(f"{data}: {len(rows)} presets, {runs} runs\n"
                 f"val acc on {val:,} images (the recipe's val fraction of CIFAR-10's {CIFAR10_TRAIN_IMAGES:,} "
                 f"training JPEGs), the other columns on the first {sweep}\n"
                 "bars: mean over seeds (dots: each seed); error bars: Wilson 95% interval (test-set sampling)",
                 fontsize="medium")
    fig.tight_layout()
    return fig


def _save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---------------------------------------------------------------- data
def resolve_data(data: Path) -> Path:
    """A folder holding train/, or a .tar.gz of one (unpacked once under ~/.cache/vitzoo)."""
    data = data.expanduser().resolve()
    if data.is_dir():
        if not (data / "train").is_dir():
            raise SystemExit(f"--data {data} has no train/ folder; pass the CIFAR-10 JPEG tree or its .tar.gz")
        return data
    if not data.is_file() or not data.name.endswith((".tar.gz", ".tgz")):
        raise SystemExit(f"--data {data} is neither a folder holding train/ nor a .tar.gz of one")
    target = Path.home() / ".cache" / "vitzoo" / data.name.split(".")[0]
    if not (target / "train").is_dir():
        print(f"unpacking {data} -> {target}", flush=True)
        tmp = target.with_name(target.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        with tarfile.open(data) as tar:
            tar.extractall(tmp, filter="data")
        if not (tmp / "train").is_dir():
            raise SystemExit(f"{data} holds no train/ folder at its top level")
        tmp.rename(target)
    return target


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budget", choices=sorted(BUDGETS), default="cpu")
    p.add_argument("--data", type=Path, help="CIFAR-10 JPEG tree (folder with train/) or its .tar.gz")
    p.add_argument("--work", type=Path, default=None, help="run dirs (default: logs/zoo/<budget>)")
    p.add_argument("--out", type=Path, default=None, help="table and plots (default: docs/zoo/<budget>)")
    p.add_argument("--phases", default=",".join(PHASES), help="comma list from " + ",".join(PHASES))
    p.add_argument("--presets", default=None, help="comma list of presets (default: all)")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Hydra override for every training run, after the budget's (repeatable); "
                        "a run dir trained with other overrides is not retrained")
    p.add_argument("--merge", type=Path, nargs="+", default=[], metavar="PATH",
                   help="report: result files, or folders of them (another call's <out>/per-run), to add to the "
                        "table; a file of a run already there replaces it")
    p.add_argument("--per-run", action="store_true",
                   help="each run through every phase (its own eval.py call) and into its result file before the "
                        "next run starts, so a call that is stopped keeps every finished run (a GPU loan)")
    p.add_argument("--batch-size", type=int, default=128, help="profile: training batch size")
    p.add_argument("--steps", type=int, default=10, help="profile: timed training steps")
    p.add_argument("--profile-one", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.profile_one is not None:
        print(json.dumps(profile_one(args.profile_one, args.batch_size, args.steps)))
        return
    budget = BUDGETS[args.budget]
    phases = [p.strip() for p in args.phases.split(",") if p.strip()]
    unknown = sorted(set(phases) - set(PHASES))
    if unknown:
        raise SystemExit(f"unknown phase(s) {unknown}; choose from {list(PHASES)}")
    if args.budget == "gpu" and {"train", "profile"} & set(phases):
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("the gpu budget trains and profiles on a CUDA GPU and torch sees none here; use "
                             "--budget cpu, or --phases report --merge to join result files made on a GPU")
    if args.merge and "report" not in phases:
        raise SystemExit("--merge joins result files in the report phase; add report to --phases")
    only = [p.strip() for p in args.presets.split(",") if p.strip()] if args.presets else None
    unknown = sorted(set(only or ()) - {preset for _, preset in PRESETS})
    if unknown:
        raise SystemExit(f"unknown preset(s) {unknown}; choose from configs/model/: "
                         f"{', '.join(preset for _, preset in PRESETS)}")
    work = (args.work or ROOT / "logs" / "zoo" / args.budget).resolve()
    runs = plan(budget, work, only)
    if "train" in phases or "eval" in phases:
        if args.data is None:
            raise SystemExit("--data is required for the train and eval phases")
        data_root = resolve_data(args.data)
    out = (args.out or ROOT / "docs" / "zoo" / args.budget).resolve()
    merge = args.merge
    # --per-run: each run through every phase (its eval in its own dir) and into its result file before the next
    for group, eval_work in ([([run], run.dir) for run in runs] if args.per_run else [(runs, work)]):
        if "train" in phases:
            train(group, budget, data_root, args.override)
        if "profile" in phases:
            profile(group, args.batch_size, args.steps)
        if "eval" in phases:
            evaluate(group, budget, data_root, eval_work)
        if "report" in phases:
            per_run = out / "per-run"
            lines = zoo_results.add(collect(group, args.budget, budget, work, args.override), per_run, args.budget)
            lines += zoo_results.merge(merge, per_run, args.budget) if merge else []
            merge = []  # once
            for line in lines:
                print(f"[report] {line}", flush=True)
            command = f"python benchmarks/zoo.py --budget {args.budget} --phases report"
            report(zoo_results.load_all(per_run, args.budget), args.budget, budget, out, command)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

"""The founding notes' resolution question, asked of trained checkpoints: top-1 and attention entropy at 1x, 1.5x
and 2x the training size, for each checkpoint as trained and with the entropy-invariant log-n scale (the same
weights: at the training size log n / log n_train = 1, so log-n changes nothing there and training with it gives the
same network), and for a RoPE checkpoint also with its positions rescaled onto the training grid (``ref_grid``,
EVA-02's rule). Seeds of one preset are averaged, their spread printed beside the mean.

    python benchmarks/resolution_scale.py --data <CIFAR-10 JPEG tree> \\
        --runs softmax=logs/zoo/cpu/vit_softmax/seed0,logs/zoo/cpu/vit_softmax/seed1 \\
               rope=logs/zoo/cpu/vit_softmax_rope/seed0,logs/zoo/cpu/vit_softmax_rope/seed1 \\
        --out docs/zoo/cpu/resolution_scale.md

Each run dir is a zoo run (``checkpoints/last.ckpt``); the val images are the zoo recipe's split (10% of the
tree's train/, split seed 0), the first ``--images`` of them.
"""

from __future__ import annotations

import argparse
import copy
import statistics
from functools import partial
from pathlib import Path
from typing import Dict, List, Tuple

import torch

from vitzoo.data import ImageFolderDataModule
from vitzoo.robustness import evaluate
from vitzoo.training.evaluate import load_classifier
from vitzoo.training.module import build_model

RESOLUTIONS = (1.5, 2.0)


def variants(ckpt: Path) -> Tuple[Dict[str, torch.nn.Module], int]:
    """The checkpoint as trained, with log-n, and (RoPE) with positions rescaled onto the training grid; and the
    training size."""
    model, hp = load_classifier(ckpt)
    out = {"as trained": model}
    twins = {"log-n scale": {"scale": "log_n"}}
    rope = hp["attention"].get("rope") if isinstance(hp["attention"], dict) else None
    if rope:
        grid = hp["img_size"] // model.patch_embed.patch_size[0]
        twins["RoPE ref grid"] = {"rope": {**rope, "ref_grid": [grid, grid]}}
        twins["RoPE ref grid + log-n"] = {**twins["RoPE ref grid"], "scale": "log_n"}
    for name, change in twins.items():
        twin_hp = copy.deepcopy(hp)
        twin_hp["attention"] = {**twin_hp["attention"], **change}
        try:
            twin = build_model(twin_hp)
        except ValueError as err:  # e.g. scale is not an option of a kernel form: said, not hidden
            print(f"{ckpt}: no '{name}' variant: {str(err).splitlines()[0]}")
            continue
        twin.load_state_dict(model.state_dict())
        out[name] = twin.eval()
    return out, hp["img_size"]


def measure(run_dir: Path, data_root: str, images: int) -> Dict[str, Dict[str, Tuple[float, float]]]:
    """{variant: {"1x" | "1.5x" | "2x": (top-1, entropy)}} of one run."""
    models, train_size = variants(run_dir / "checkpoints" / "last.ckpt")
    data = partial(
        ImageFolderDataModule, root=data_root, val_fraction=0.1, split_seed=0, eval_batch_size=500, num_workers=1
    )
    result = evaluate(models, data, resolutions=list(RESOLUTIONS), max_images=images, plots=False, tensorboard=False)
    out: Dict[str, Dict[str, Tuple[float, float]]] = {name: {} for name in models}
    for r in result.records:
        if r["test"] == "clean":
            out[r["checkpoint"]]["1x"] = (r["acc1"], r["entropy"])
        elif r["test"] == "resolution":
            factor = r["level"] / train_size
            out[r["checkpoint"]][f"{factor:g}x"] = (r["acc1"], r["entropy"])
    return out


def cell(values: List[float], scale: float, digits: int) -> str:
    mean = statistics.fmean(values) * scale
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ({(max(values) - min(values)) * scale:.{digits}f})"


def table(results: Dict[str, List[Dict[str, Dict[str, Tuple[float, float]]]]]) -> List[str]:
    sizes = ["1x", *(f"{f:g}x" for f in RESOLUTIONS)]
    head = ["run", "variant", *(f"top-1 {s}" for s in sizes), *(f"H/log n {s}" for s in sizes)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, seeds in results.items():
        for variant in seeds[0]:  # the variants every seed of a run has (one mechanism)
            acc = [cell([s[variant][z][0] for s in seeds], 100, 1) for z in sizes]
            ent = [cell([s[variant][z][1] for s in seeds], 1, 3) for z in sizes]
            lines.append("| " + " | ".join([f"{label} (seeds: {len(seeds)})", variant, *acc, *ent]) + " |")
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--data", required=True, help="CIFAR-10 JPEG tree (folder with train/)")
    p.add_argument("--runs", nargs="+", required=True, help="label=run_dir[,run_dir...] (one dir per seed)")
    p.add_argument("--images", type=int, default=2000, help="the first N val images (the zoo's sweeps use 2000)")
    p.add_argument("--out", type=Path, default=None, help="also write the table (Markdown) here")
    args = p.parse_args()
    results = {}
    for spec in args.runs:
        label, _, dirs = spec.partition("=")
        if not dirs:
            p.error(f"--runs {spec!r}: write label=run_dir[,run_dir...]")
        results[label] = [measure(Path(d), args.data, args.images) for d in dirs.split(",")]
    lines = [
        f"Top-1 (%) and attention entropy H / log n (mean over layers) on the first {args.images} val images; with "
        "several seeds: the mean, and (in brackets) max - min over the seeds.",
        "",
        *table(results),
    ]
    print("\n".join(lines))
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

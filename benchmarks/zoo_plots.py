"""The zoo's plots: summary.png (each preset's accuracies with their intervals) and eval.py's sweep curves."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional

from zoo_plan import CIFAR10_TRAIN_IMAGES, Budget, val_images
from zoo_table import by_preset, mean

SUMMARY_KEYS = ("val acc", "gauss sev1-5", "logit sigma=1", "2x res")
CURVES = ("corruptions", "logit_noise", "resolution", "adversarial")  # eval.py's plots, one PNG each


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
            known = [
                (r["row"][key], _images(r, key, val, eval_images)) for r in preset_runs if r["row"][key] is not None
            ]
            if not known:
                continue
            m, n = mean([acc for acc, _ in known]), min(n for _, n in known)
            lo, hi = accuracy_interval(m, n)
            xs.append(x + i * width)
            means.append(m)
            low.append(m - lo)
            high.append(hi - m)
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
    fig.suptitle(
        f"{data}: {len(rows)} presets, {runs} runs\n"
        f"val acc on {val:,} images (the recipe's val fraction of CIFAR-10's {CIFAR10_TRAIN_IMAGES:,} "
        f"training JPEGs), the other columns on the first {sweep}\n"
        "bars: mean over seeds (dots: each seed); error bars: Wilson 95% interval (test-set sampling)",
        fontsize="medium",
    )
    fig.tight_layout()
    return fig


def draw(results: List[dict], curves: List[dict], budget: Budget, out: Path) -> List[str]:
    """summary.png from every result, and eval.py's curves (corruptions, logit noise, resolution, adversarial) of the
    runs in ``curves`` (those with eval records) into ``out``, replacing the ones there; returns the curves' file
    names."""
    import matplotlib.pyplot as plt

    from vitzoo.robustness.plots import plot_results

    for name in CURVES:
        (out / f"{name}.png").unlink(missing_ok=True)
    data = f"CIFAR-10 val split ({budget.experiment})"
    records = [rec for r in curves for rec in r["robustness"]["records"]]
    drawn = plot_results(
        records,
        out,
        {rec["checkpoint"]: r["robustness"]["img_size"] for r in curves for rec in r["robustness"]["records"]},
        data,
    )
    fig = summary_figure(by_preset(results), data, val_images(budget), budget.eval_images)
    fig.savefig(out / "summary.png", dpi=110)
    plt.close(fig)
    return [path.name for path in drawn]

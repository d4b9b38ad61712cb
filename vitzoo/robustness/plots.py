"""The robustness plots: accuracy vs corruption severity, attention-logit sigma, input size and attack radius.

Every figure names the data set, the number of images per point and the checkpoints in its title, draws
each accuracy with its Wilson 95% interval as a band (the test set's sampling uncertainty), and puts
accuracy on an axis from 0 to 100% so that small differences look as small as they are.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .corruptions import CORRUPTIONS
from .intervals import accuracy_interval
from .report import by_checkpoint
from .sweep import ADVERSARIAL, CLEAN, LOGIT_NOISE, RESOLUTION

__all__ = [
    "plot_results",
    "corruption_figure",
    "logit_noise_figure",
    "resolution_figure",
    "adversarial_figure",
    "context_title",
    "accuracy_axis",
]

BAND = "bands: Wilson 95% interval of each accuracy (test-set sampling)"


def plot_results(records: Sequence[dict], out_dir: Path, train_sizes: Dict[str, int], data: str) -> List[Path]:
    """PNG plots, one line per checkpoint: accuracy vs severity per corruption (``corruptions.png``), vs logit
    sigma (``logit_noise.png``), vs image size (``resolution.png``), vs attack radius (``adversarial.png``), each
    drawn when the records hold that test.
    ``data`` names the data set in the titles. Returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    table = by_checkpoint(records)
    tests = {t for levels in table.values() for t in levels}
    figures = [
        ("corruptions.png", corruption_figure, bool(tests & set(CORRUPTIONS))),
        ("logit_noise.png", logit_noise_figure, LOGIT_NOISE in tests),
        ("resolution.png", lambda r, d: resolution_figure(r, d, train_sizes), RESOLUTION in tests),
        ("adversarial.png", adversarial_figure, ADVERSARIAL in tests),
    ]
    return [_save(draw(records, data), out_dir / name) for name, draw, wanted in figures if wanted]


def _line_styles():
    """20 distinguishable lines: the 10 default colours solid, then dashed (a zoo sweep has 16+ checkpoints)."""
    import matplotlib.pyplot as plt
    from cycler import cycler

    return cycler(linestyle=["-", "--"]) * cycler(color=plt.get_cmap("tab10").colors)


def context_title(data: str, num_images: Sequence[int], labels: Sequence[str], what: Optional[str] = None) -> str:
    """``<data>, <n> images per point; <k> checkpoint(s): a, b`` (the names when they fit on a line), then ``what``."""
    sizes = sorted(set(num_images))
    count = f"{sizes[0]:,}" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,}"
    names = ", ".join(labels)
    checkpoints = f"{len(labels)} checkpoint{'s' if len(labels) > 1 else ''}" + (
        f": {names}" if len(names) <= 70 else " (legend)"
    )
    return "\n".join(line for line in (f"{data}, {count} images per point; {checkpoints}", what) if line)


def accuracy_axis(ax, label: str = "top-1 accuracy") -> None:
    """An accuracy axis (values in [0, 1]) from 0 to 100%, labelled in percent."""
    from matplotlib.ticker import PercentFormatter

    ax.set_ylim(0, 1)
    ax.yaxis.set_major_formatter(PercentFormatter(xmax=1, decimals=0))
    ax.set_ylabel(label)


def _curve(ax, xs: Sequence[float], points: Sequence[dict], label: str, key: str = "acc1", **style):
    """One checkpoint's line (returned); an accuracy (a ``*acc1`` key) gets its Wilson band in the line's colour."""
    (line,) = ax.plot(xs, [p[key] for p in points], marker="o", markersize=4, label=label, **style)
    if key.endswith("acc1"):
        low, high = zip(*(accuracy_interval(p[key], p["num_images"]) for p in points))
        ax.fill_between(xs, low, high, color=line.get_color(), alpha=0.15, linewidth=0)
    return line


def _setup(records: Sequence[dict], data: str):
    """(pyplot, records by checkpoint, the figure's title); every pass of a sweep reads the same images."""
    import matplotlib.pyplot as plt

    table = by_checkpoint(records)
    return plt, table, context_title(data, [r["num_images"] for r in records], list(table), BAND)


def corruption_figure(records: Sequence[dict], data: str):
    """Accuracy vs severity (0 = clean), one panel per corruption."""
    plt, table, title = _setup(records, data)
    names = sorted({t for tests in table.values() for t in tests if t in CORRUPTIONS})
    cols = min(4, len(names))
    rows = math.ceil(len(names) / cols)
    with plt.rc_context({"axes.prop_cycle": _line_styles()}):
        fig, axes = plt.subplots(
            rows, cols, figsize=(max(6.5, 3.6 * cols), 3.0 * rows + 1.0), squeeze=False, sharey=True
        )
        for ax, name in zip(axes.flat, names):
            for label, tests in table.items():
                levels = tests.get(name, {})
                _curve(ax, [0, *sorted(levels)], [tests[CLEAN][0], *(levels[s] for s in sorted(levels))], label)
            ax.set(title=name, xlabel="severity (0 = clean)", xticks=range(6))
            ax.grid(alpha=0.3)
        for ax in axes.flat:
            accuracy_axis(ax)
        for ax in axes[:, 1:].flat:
            ax.set_ylabel("")
        for ax in list(axes.flat)[len(names) :]:
            ax.axis("off")
    fig.suptitle(title, fontsize="medium")
    return fig


def logit_noise_figure(records: Sequence[dict], data: str):
    """Accuracy vs the sigma of the noise on every attention layer's logits (symlog axis)."""
    plt, table, title = _setup(records, data)
    with plt.rc_context({"axes.prop_cycle": _line_styles()}):
        fig, ax = plt.subplots(figsize=(6.5, 4.6))
        for label, tests in table.items():
            levels = tests.get(LOGIT_NOISE, {})
            _curve(ax, sorted(levels), [levels[s] for s in sorted(levels)], label)
        sigmas = sorted({s for tests in table.values() for s in tests.get(LOGIT_NOISE, {})})
        ax.set_xscale("symlog", linthresh=max(min([s for s in sigmas if s > 0], default=1.0), 1e-3))
        ax.set_xticks(sigmas, [f"{s:g}" for s in sigmas])
        ax.minorticks_off()
        ax.set(xlabel="logit noise sigma (every attention layer, eval time)")
        accuracy_axis(ax)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    return fig


def resolution_figure(records: Sequence[dict], data: str, train_sizes: Dict[str, int]):
    """Accuracy (and, where recorded, the attention entropy H / log n) vs input size; the clean pass is the
    point at each checkpoint's training size."""
    plt, table, title = _setup(records, data)
    keys = ["acc1"] + (["entropy"] if all("entropy" in r for t in table.values() for r in t[CLEAN].values()) else [])
    with plt.rc_context({"axes.prop_cycle": _line_styles()}):
        fig, axes = plt.subplots(1, len(keys), figsize=(6.5 * len(keys), 4.6), squeeze=False)
        for ax, key in zip(axes[0], keys):
            for label, tests in table.items():
                points = {train_sizes[label]: tests[CLEAN][0], **tests.get(RESOLUTION, {})}
                _curve(ax, sorted(points), [points[s] for s in sorted(points)], label, key)
            ax.set(xlabel="input size (px; the training size is the clean point)")
            if key == "acc1":
                accuracy_axis(ax)
                ax.set_title("accuracy")
            else:  # H / log n lies in [0, 1]
                ax.set(
                    ylim=(0, 1.05),
                    ylabel="attention entropy H / log n (mean over layers)",
                    title="attention entropy (first 32 images)",
                )
            ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    return fig


def adversarial_figure(records: Sequence[dict], data: str):
    """Accuracy vs the L-inf radius (0 = clean) under PGD, and under AutoAttack's standard set (dotted, same colour)
    where the records hold it."""
    plt, table, title = _setup(records, data)
    with plt.rc_context({"axes.prop_cycle": _line_styles()}):
        fig, ax = plt.subplots(figsize=(6.5, 4.6))
        for label, tests in table.items():
            levels = tests.get(ADVERSARIAL, {})
            xs, clean = [0, *sorted(levels)], {**tests[CLEAN][0], "autoattack_acc1": tests[CLEAN][0]["acc1"]}
            points = [clean, *(levels[e] for e in sorted(levels))]
            line = _curve(ax, xs, points, f"{label} PGD")
            if all("autoattack_acc1" in p for p in points):
                _curve(ax, xs, points, f"{label} AutoAttack", "autoattack_acc1", color=line.get_color(), linestyle=":")
        radii = sorted({0, *(e for tests in table.values() for e in tests.get(ADVERSARIAL, {}))})
        ax.set_xticks(radii, [f"{e:g}/255" if e else "0" for e in radii])
        ax.set(xlabel="L-inf radius eps of a [0, 1] image (0 = clean)")
        accuracy_axis(ax)
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize="medium")
    return fig


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    handles, names = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=min(4, len(names)), fontsize="small", frameon=False)
    fig.tight_layout(rect=(0, 0.06 + 0.035 * math.ceil(len(names) / 4), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # long legends may be wider than the axes
    plt.close(fig)
    return path

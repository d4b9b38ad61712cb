"""What the robustness results say: the Wilson interval, the plots' titles, bands and axes, eval.py's closing table."""

from __future__ import annotations

import matplotlib
import pytest

from vitzoo.robustness.closing import results_table
from vitzoo.robustness.intervals import accuracy_interval, wilson_interval
from vitzoo.robustness.plots import adversarial_figure, corruption_figure, logit_noise_figure, resolution_figure
from vitzoo.robustness.report import summarize

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def test_wilson_interval_matches_the_hand_computed_value():
    # 7 of 10, z = 1.96: p = 0.7, z^2/n = 0.38416; centre = (0.7 + 0.19208) / 1.38416 = 0.644492;
    # half-width = 1.96 / 1.38416 * sqrt(0.021 + 0.009604) = 1.416022 * 0.174940 = 0.247719 -> (0.396773, 0.892211)
    low, high = wilson_interval(7, 10)
    assert low == pytest.approx(0.396773, abs=2e-6) and high == pytest.approx(0.892211, abs=2e-6)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0  # stays inside [0, 1]
    # 500 of 1,000: centre 0.5; half-width = 1.96 / 1.0038416 * sqrt(0.00025 + 9.604e-7) = 0.030931 (+-3 points)
    low, high = wilson_interval(500, 1000)
    assert (low + high) / 2 == pytest.approx(0.5, abs=1e-12) and (high - low) / 2 == pytest.approx(0.030931, abs=1e-6)
    assert wilson_interval(8, 10, z=2.576)[0] < wilson_interval(8, 10)[0]  # 99% is wider than 95%
    assert accuracy_interval(0.7, 10) == wilson_interval(7, 10)
    for correct, n in [(3, 0), (-1, 5), (6, 5)]:
        with pytest.raises(ValueError, match="0 <= correct <= n and n > 0"):
            wilson_interval(correct, n)


def _records(n=1000):
    """Two checkpoints at 80-95% (an axis fitted to the data would start near 80%)."""
    out = []
    for label, base in (("softmax", 0.95), ("linear", 0.9)):
        rec = {"checkpoint": label, "num_images": n, "entropy": 0.5}
        out.append({**rec, "test": "clean", "level": 0, "acc1": base})
        out += [{**rec, "test": "gaussian_noise", "level": s, "acc1": base - 0.02 * s} for s in (1, 3, 5)]
        out += [{**rec, "test": "contrast", "level": s, "acc1": base - 0.01 * s} for s in (1, 3, 5)]
        out += [{**rec, "test": "logit_noise", "level": s, "acc1": base - 0.03 * s} for s in (0.0, 0.5, 1.0, 2.0)]
        out += [{**rec, "test": "resolution", "level": px, "acc1": base - 0.1} for px in (24, 32)]
    return out


@pytest.mark.parametrize(
    "draw", [corruption_figure, logit_noise_figure, lambda r, d: resolution_figure(r, d, {"softmax": 16, "linear": 16})]
)
def test_plots_name_data_images_and_checkpoints_start_at_zero_and_band_each_line(draw):
    records = _records()
    fig = draw(records, "Digits val split")
    try:
        title = fig.get_suptitle()
        assert "Digits val split" in title and "1,000 images per point" in title
        assert "2 checkpoints: softmax, linear" in title and "Wilson 95%" in title
        accuracy_axes = [
            ax
            for ax in fig.axes
            if ax.get_ylabel() == "top-1 accuracy" or ax.get_title() in ("contrast", "gaussian_noise")
        ]
        assert accuracy_axes
        for ax in accuracy_axes:
            assert ax.get_ylim() == (0.0, 1.0)  # 0 to 100%, not zoomed to the 80-95% the data spans
            assert ax.yaxis.get_major_formatter()(0.5, 0) == "50%"
            bands = [c for c in ax.collections if type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")]
            assert len(bands) == 2  # one per checkpoint
            lines = {line.get_label(): line for line in ax.get_lines()}
            for band, label in zip(bands, ("softmax", "linear")):
                ys = lines[label].get_ydata()
                y = band.get_paths()[0].vertices[:, 1]
                assert y.min() == pytest.approx(min(accuracy_interval(v, 1000)[0] for v in ys))
                assert y.max() == pytest.approx(max(accuracy_interval(v, 1000)[1] for v in ys))
        entropy = [ax for ax in fig.axes if ax.get_ylabel().startswith("attention entropy")]
        assert all(ax.get_ylim()[0] == 0 for ax in entropy)
    finally:
        plt.close(fig)


def test_closing_table_has_one_row_per_checkpoint_in_percent():
    records = _records(n=360)
    scope = {"corruptions": ["gaussian_noise"], "over": "1 of 15", "benchmark": False}
    summary = {
        "softmax": {"mean_corrupted_acc1": 0.9, "mce": 1.0, **scope},
        "linear": {"mean_corrupted_acc1": 0.85, "mce": 1.25, **scope},
    }
    lines = results_table(
        records, summary, "softmax", "Digits val split", [1.5, 2.0], {"softmax": [24, 32], "linear": [24, 32]}
    )
    assert lines[0].startswith("top-1 accuracy (%) on the Digits val split, 360 images per pass")
    half = max(h - lo for lo, h in (accuracy_interval(r["acc1"], 360) for r in records)) / 2
    assert f"+-{100 * half:.1f} points at most" in lines[0]
    assert lines[1].split() == ["corruptions", "logit", "noise", "input", "size"]
    assert lines[2].split() == "checkpoint clean mean 1 of 15 mean CE 1 of 15 vs softmax 0.5 1 2 1.5x 2x".split()
    assert lines[3].split() == ["softmax", "95.0", "90.0", "100.0", "93.5", "92.0", "89.0", "85.0", "85.0"]
    assert lines[4].split() == ["linear", "90.0", "85.0", "125.0", "88.5", "87.0", "84.0", "80.0", "80.0"]
    assert all(len(line) == len(lines[2]) for line in lines[3:5])  # columns line up
    assert lines[5].startswith("corruptions: mean = accuracy over gaussian_noise x severities (1 of 15 at")
    assert lines[6].startswith("  mean CE (not mCE, which needs the 15 at severities 1-5) vs softmax = ")

    no_base = results_table(records, {k: {**v, "mce": None} for k, v in summary.items()}, None, "x", [], {})
    assert no_base[2].split() == "checkpoint clean mean 1 of 15 mean CE 1 of 15 0.5 1 2".split()
    assert no_base[3].split()[3] == "-" and no_base[6].startswith("  mean CE needs a baseline (robustness.baseline=")
    clean_only = results_table(
        [r for r in records if r["test"] == "clean"], {"softmax": {}, "linear": {}}, None, "x", [], {}
    )
    assert [line.split() for line in clean_only[1:]] == [
        ["checkpoint", "clean"],
        ["softmax", "95.0"],
        ["linear", "90.0"],
    ]


def _attacked(autoattack=True):
    """Clean and PGD / FGSM (/ AutoAttack) records at 2/255 and 8/255 for two checkpoints, 1,000 images each."""
    out = []
    for label, base in (("softmax", 0.9), ("linear", 0.8)):
        rec = {"checkpoint": label, "num_images": 1000}
        out.append({**rec, "test": "clean", "level": 0, "acc1": base})
        for eps, drop in ((2.0, 0.3), (8.0, 0.7)):
            aa = {"autoattack_acc1": base - drop - 0.05} if autoattack else {}
            out.append(
                {**rec, "test": "pgd_linf", "level": eps, "acc1": base - drop, "fgsm_acc1": base - drop / 2, **aa}
            )
    return out


def test_adversarial_plot_draws_pgd_and_autoattack_from_clean_at_zero_with_bands():
    fig = adversarial_figure(_attacked(), "Digits val split")
    try:
        ax = fig.axes[0]
        assert "1,000 images per point" in fig.get_suptitle() and "2 checkpoints: softmax, linear" in fig.get_suptitle()
        assert ax.get_ylim() == (0.0, 1.0) and [t.get_text() for t in ax.get_xticklabels()] == ["0", "2/255", "8/255"]
        lines = {line.get_label(): line for line in ax.get_lines()}
        assert list(lines) == ["softmax PGD", "softmax AutoAttack", "linear PGD", "linear AutoAttack"]
        assert list(lines["linear PGD"].get_xdata()) == [0, 2.0, 8.0]
        assert list(lines["linear PGD"].get_ydata()) == pytest.approx([0.8, 0.5, 0.1])
        assert list(lines["linear AutoAttack"].get_ydata()) == pytest.approx([0.8, 0.45, 0.05])  # clean at 0
        assert lines["softmax AutoAttack"].get_color() == lines["softmax PGD"].get_color()
        assert lines["softmax AutoAttack"].get_linestyle() == ":"
        bands = [c for c in ax.collections if type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")]
        assert len(bands) == 4
        y = bands[3].get_paths()[0].vertices[:, 1]  # linear AutoAttack's
        assert y.min() == pytest.approx(accuracy_interval(0.05, 1000)[0])
    finally:
        plt.close(fig)
    pgd_only = adversarial_figure(_attacked(autoattack=False), "x")
    assert [line.get_label() for line in pgd_only.axes[0].get_lines()] == ["softmax PGD", "linear PGD"]
    plt.close(pgd_only)


def test_summary_and_table_say_which_attack_set_ran_and_guard_autoattack_against_pgd():
    records = _attacked()
    summary = summarize(records)
    assert summary["linear"]["autoattack_linf_acc1"] == pytest.approx({"2/255": 0.45, "8/255": 0.05})
    assert summary["linear"]["attack_set"].startswith("AutoAttack standard (APGD-CE, APGD-T, FAB-T, Square)")
    assert summary["linear"]["attack_check"] == "ok"
    lines = results_table(records, summary, None, "x", [], {})
    assert lines[1].split() == ["PGD", "L-inf", "AutoAttack", "L-inf"]
    assert lines[2].split() == ["checkpoint", "clean", "2/255", "8/255", "2/255", "8/255"]
    assert lines[4].split() == ["linear", "80.0", "50.0", "10.0", "45.0", "5.0"]
    assert lines[-1].startswith("AutoAttack L-inf: accuracy under AutoAttack's standard set")
    pgd_only = summarize(_attacked(autoattack=False))["linear"]
    assert pgd_only["attack_set"] == "PGD-10 + FGSM" and "autoattack_linf_acc1" not in pgd_only
    weak = [{**r, "autoattack_acc1": r["acc1"] + 0.01} if r["test"] == "pgd_linf" else r for r in records]
    assert summarize(weak)["linear"]["attack_check"] == "failed: AutoAttack above PGD at 2/255 (0.510 > 0.500)"


def test_zoo_summary_names_its_images_starts_at_zero_and_bars_the_wilson_interval():
    zoo_plan, zoo_plots = _zoo()
    assert zoo_plan.val_images(zoo_plan.BUDGETS["cpu"]) == 5000  # 10% of CIFAR-10's 50,000 training JPEGs

    def run(label, seed, val, evaluated):
        records = [{"test": "clean", "level": 0, "acc1": val, "num_images": 2000}] if evaluated else []
        row = {"val acc": val, "gauss sev1-5": val - 0.1, "logit sigma=1": val - 0.05, "2x res": None}
        return {
            "label": label,
            "preset": label,
            "seed": seed,
            "row": row,
            "robustness": {"records": records} if evaluated else None,
        }

    rows = {
        "vit_softmax": [run("softmax", 0, 0.5, True), run("softmax", 1, 0.6, True)],
        "vit_linear": [run("linear", 0, 0.45, False)],
    }  # converted row: no records, the budget's 1,500
    fig = zoo_plots.summary_figure(rows, "CIFAR-10 val split (zoo_cpu)", 5000, 1500)
    try:
        title, ax = fig.get_suptitle(), fig.axes[0]
        assert "CIFAR-10 val split (zoo_cpu): 2 presets, 3 runs" in title
        assert "val acc on 5,000 images" in title and "the other columns on the first 1,500, 2,000" in title
        assert ax.get_ylim() == (0.0, 1.0) and ax.yaxis.get_major_formatter()(0.5, 0) == "50%"
        from matplotlib.container import BarContainer

        bars = [c for c in ax.containers if isinstance(c, BarContainer)]  # one per column, in the legend's order
        val_bars = bars[0]  # "val acc": softmax's mean of two seeds, linear's one
        assert [bar.get_height() for bar in val_bars] == pytest.approx([0.55, 0.45])
        segments = val_bars.errorbar.lines[2][0].get_segments()
        assert [y for s in segments for y in s[:, 1]] == pytest.approx(
            [*accuracy_interval(0.55, 5000), *accuracy_interval(0.45, 5000)]
        )
        gauss = bars[1].errorbar.lines[2][0].get_segments()
        assert tuple(gauss[1][:, 1]) == pytest.approx(accuracy_interval(0.35, 1500))  # the budget's eval images
        assert len(bars[3]) == 0  # no 2x-res numbers: no bars
    finally:
        plt.close(fig)


def _zoo():
    import zoo_plan  # the zoo benchmark's modules (tests/conftest.py puts benchmarks/ on the path)
    import zoo_plots

    return zoo_plan, zoo_plots

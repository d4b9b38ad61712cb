"""The GPU kit (gpukit/): its rehearsal on this CPU, its import coverage, its wheel resolution and its budgets."""

from __future__ import annotations

import csv
import io
import math
import random
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from conftest import ROOT, run_python
from gpukit import run as kit_run
from gpukit import wheels as W
from gpukit.imports import imported, run_imports, unmet
from gpukit.phases import KERNEL_RUNS, pytest_result
from gpukit.steps import Step, Steps
from gpukit.zoo import epochs, presets


def test_every_module_a_kit_run_imports_is_on_the_gpu_machine_or_among_the_kit_wheels():
    imports = run_imports()
    assert {"torch", "vitzoo", "hydra", "fla", "albumentations"} <= set(imports)  # the scan sees the run's code
    problems = {
        name: f"{why} (imported by {sorted(str(p.relative_to(ROOT)) for p in imports[name])})"
        for name, why in unmet(imports).items()
    }
    assert not problems, problems


def test_the_gpu_zoo_trains_the_vit_and_resnet_presets_with_the_probe_first():
    names = presets()
    assert names[0] == "vit_softmax" and "nonlocal_resnet_linear" in names
    assert not [n for n in names if not n.startswith(("vit_", "nonlocal_"))]  # pyramids have a budget of their own


def test_unmet_names_a_module_nobody_provides():
    assert set(unmet(["torch", "json", "vitzoo", "hydra", "no_such_module_here"])) == {"no_such_module_here"}


def test_optional_and_function_level_imports(tmp_path):
    src = tmp_path / "m.py"
    src.write_text(
        "import os\ntry:\n    import optional_a\nexcept ImportError:\n    pass\n"
        "try:\n    import counted_b\nexcept KeyError:\n    pass\n"
        "def f():\n    from inner_c.sub import x\n"
    )
    assert imported(src) == {"os", "counted_b", "inner_c"}
    assert imported(src, module_level_only=True) == {"os", "counted_b"}


def test_kit_pins_satisfy_vitzoo_requirements():
    """Each carried distribution that pyproject.toml names is pinned at a version its specifier allows."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = [
        *project["dependencies"],
        *[d for group in project.get("optional-dependencies", {}).values() for d in group],
    ]
    pins = {W.normalise(r.name): r.version for r in W.ROOTS}
    checked = 0
    for spec in map(Requirement, specs):
        if W.normalise(spec.name) in pins:
            assert spec.specifier.contains(pins[W.normalise(spec.name)]), (spec, pins[W.normalise(spec.name)])
            checked += 1
    assert checked >= 4  # timm, hydra-core, omegaconf, albumentations at least


def _wheel(folder: Path, name: str, requires: list) -> Path:
    path = folder / f"{name}-1.0-py3-none-any.whl"
    meta = "Metadata-Version: 2.1\nName: {}\nVersion: 1.0\n".format(name) + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-1.0.dist-info/METADATA", meta)
    return path


def test_missing_requirements_follow_markers_and_the_gpu_list(tmp_path):
    """Requirements met on the GPU machine, for another Python or platform, or behind an extra, are not fetched."""
    whl = _wheel(
        tmp_path,
        "pkg",
        [
            "numpy>=1.24",
            "pydantic>=2.9",
            "eval-type-backport; python_version < '3.10'",
            "pywin32; sys_platform == 'win32'",
            "pytest; extra == 'test'",
            "albucore==0.0.24",
            "Typing_Extensions>=4",
        ],
    )
    other = _wheel(tmp_path, "other", ["needed-only-if-followed"])
    found = W.missing([whl, other], W.gpu_packages() | {"albucore"}, follow={"pkg"})
    assert [str(r) for r in found] == ["pydantic>=2.9"]
    assert W.pin(Requirement("pydantic>=2.9")).startswith("pydantic==")  # the version tested here
    assert W.pin(Requirement("pydantic>=99")) == "pydantic>=99"


def test_gpu_package_list_is_the_machines():
    names = W.gpu_packages()
    assert len(names) == 197 and {"torch", "triton", "timm", "pytorch-lightning", "opencv-python-headless"} <= names
    assert not {"hydra-core", "omegaconf", "albumentations", "antlr4-python3-runtime", "pydantic"} & names


@pytest.mark.parametrize(
    "left,runs,workers,rate,overhead,cap",
    [(200, 27, 4, 15000, 12, 50), (600, 27, 4, 20000, 10, 50), (30, 27, 4, 15000, 12, 50), (100, 1, 1, 155, 20, 1)],
)
def test_epochs_fill_but_do_not_pass_the_time_left(left, runs, workers, rate, overhead, cap):
    e = epochs(left, runs, workers, rate, overhead, 45_000, cap)
    rounds = math.ceil(runs / workers)

    def wall(n):
        return rounds * (overhead + n * 45_000 * workers / rate)

    assert 1 <= e <= cap
    if e > 1:
        assert wall(e) <= left
    if e < cap:
        assert wall(e + 1) > left


def test_a_command_past_its_deadline_is_stopped_with_its_children(tmp_path):
    steps = Steps(tmp_path / "logs", {"PATH": "/usr/bin:/bin"})
    steps.deadline = time.monotonic() + 60
    start = time.monotonic()
    marker = tmp_path / "child-finished"
    step = steps.run("sleeper", ["bash", "-c", f"(sleep 2; touch {marker}) & sleep 30; echo done"], cap=1)
    assert step.status == "timed out" and time.monotonic() - start < 15
    assert step.log.read_text().endswith("stopped at its deadline after 1 s\n")
    time.sleep(2.5)
    assert not marker.exists()  # the background child went with its group
    steps.deadline = time.monotonic() + 2
    assert steps.run("late", ["true"]).status.startswith("skipped (")


def test_archive_leaves_out_the_largest_files_past_the_limit(tmp_path, monkeypatch):
    results = tmp_path / "results"
    (results / "logs").mkdir(parents=True)
    (results / "summary.md").write_text("# ok\n")
    (results / "logs" / "big.log").write_bytes(random.Random(0).randbytes(2**20))  # 1 MiB, incompressible
    monkeypatch.setattr(kit_run, "ARCHIVE_LIMIT", 64 * 1024)
    dropped = kit_run.archive(results, tmp_path / "a.tar.gz")
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        assert tar.getnames() == ["results/summary.md"]
    assert dropped == ["logs/big.log (1.0 MiB)"]


@pytest.mark.slow
def test_rehearsal_runs_every_phase_and_leaves_summary_and_archive(tmp_path):
    """``python -m gpukit run --rehearse``: every phase on this CPU at tiny sizes, two files back; a generous budget
    (a limit, not a duration) so a busy CI machine does not stop a phase."""
    proc = run_python("-m", "gpukit", "run", "--rehearse", "--out", tmp_path, "--budget-s", 300, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpukit-results.tar.gz", "summary.md"]
    summary = (tmp_path / "summary.md").read_text()
    rows = [line.split(" | ") for line in summary.splitlines() if line.startswith("| ") and "phase" not in line]
    assert [r[0][2:] for r in rows] == [t for _, t, _, _ in kit_run.PHASES]
    assert all(r[1].startswith("ok") for r in rows), summary
    with tarfile.open(tmp_path / "gpukit-results.tar.gz") as tar:
        names = set(tar.getnames())
        per_run = "results/zoo/zoo-report/per-run/vit_efficient-s0.json"
        for wanted in [
            "results/summary.md",
            "results/environment.json",
            "results/kernels/cpu-tiny/attention_cpu.csv",
            "results/kernels/cpu-tiny/attention_cpu_accuracy.csv",
            "results/end_to_end/table.txt",
            "results/zoo/zoo-report/results.csv",
            per_run,
            "results/logs/d-probe.log",
        ]:
            assert wanted in names, (wanted, sorted(names))
        accuracy = list(
            csv.DictReader(io.TextIOWrapper(tar.extractfile("results/kernels/cpu-tiny/attention_cpu_accuracy.csv")))
        )
    assert {r["dtype"] for r in accuracy} == {"bfloat16", "float16"} and all(r["finite"] == "True" for r in accuracy)
    assert "vit_linear compiled (aot_eager" in summary


def test_merge_writes_the_cuda_docs_from_a_run_archive(tmp_path):
    """A GPU run's kernel tables become one txt and one CSV (every run's rows), plot and accuracy beside them."""
    results = tmp_path / "pack" / "results"
    lines = [
        "# gpukit run, 2026-01-01 00:00 UTC, 500 s",
        "",
        "- GPU: NVIDIA H100 80GB HBM3 (132 SMs)",
        "- torch 2.11.0+cu130 (CUDA 13.0), triton 3.6.0",
    ]
    results.mkdir(parents=True)
    (results / "summary.md").write_text("\n".join(lines) + "\n")
    for i, (tag, *_) in enumerate(KERNEL_RUNS[:2]):
        folder = results / "kernels" / tag
        folder.mkdir(parents=True)
        (folder / "table.txt").write_text(f"table {tag}\n")
        (folder / "attention_cuda.csv").write_text(f"device,n,ms\ncuda,1024,{i}.5\ncuda,2048,{i}.7\n")
    (results / "kernels" / "bh32-bf16" / "attention_cuda_accuracy.csv").write_text("dtype,rel_err\nbf16,1e-3\n")
    archive = tmp_path / "gpukit-results.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(results, arcname="results")
    proc = run_python("-m", "gpukit", "merge", archive, "--docs", tmp_path / "docs", check=True)
    docs = tmp_path / "docs" / "benchmarks"
    assert (docs / "attention_cuda.csv").read_text().splitlines() == [
        "device,n,ms",
        "cuda,1024,0.5",
        "cuda,2048,0.7",
        "cuda,1024,1.5",
        "cuda,2048,1.7",
    ]
    text = (docs / "attention_cuda.txt").read_text()
    assert "- GPU: NVIDIA H100" in text and text.index("table bh32-bf16") < text.index("table bh32-fp32")
    assert (docs / "attention_cuda_accuracy.csv").is_file() and "no zoo result files" in proc.stdout
    (results / "summary.md").write_text("# gpukit rehearsal (CPU, tiny sizes), ...\n")
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(results, arcname="results")
    refused = run_python("-m", "gpukit", "merge", archive, "--docs", tmp_path / "docs")
    assert refused.returncode == 1 and "rehearsal" in refused.stderr


def test_pytest_result_reads_the_closing_line_or_counts_what_a_stopped_run_reported(tmp_path):
    log = tmp_path / "a.log"
    log.write_text(
        "tests/a.py::t1 PASSED [ 10%]\n[gw0] [ 20%] PASSED tests/a.py::t2\n"
        "[gw1] [ 30%] FAILED tests/a.py::t3\n\n[gpukit] stopped at its deadline after 84 s\n"
    )
    assert pytest_result(Step("a", None, 84.0, log)) == "timed out after 2 passed, 1 failed, 0 skipped, 0 error"
    log.write_text("...\n===== 3 passed, 1 skipped in 2.00s =====\n")
    assert pytest_result(Step("a", 0, 3.0, log)) == "===== 3 passed, 1 skipped in 2.00s ====="

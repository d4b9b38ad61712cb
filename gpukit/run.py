"""``python3 -m gpukit run --out DIR``: on the GPU machine, one command under 9 minutes.

Installs the kit's wheels into a target folder (``--no-index --no-deps``), puts it and the checkout first on
PYTHONPATH, records the environment, then runs the phases in order of value, each under its own budget (what a
phase leaves unused passes to the next; the zoo takes the rest), a failing phase never stopping the next. Leaves in
DIR ``summary.md`` and ``gpukit-results.tar.gz`` (every table, CSV, plot, log and per-run result file).
``--rehearse`` runs every phase on this CPU at tiny sizes with the running interpreter's packages.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import List, Tuple

from . import phases as P
from .layout import ARCHIVE, BUDGET_S, DATA_NAME, KIT, REHEARSAL_BUDGET_S, ROOT, SUMMARY
from .steps import Step, Steps
from .zoo import zoo

# (name, title, budget s at the default total; None: what is left), in order of value
PHASES = [
    ("tests", "a. CUDA tests", P.tests, 120),
    ("kernels", "b. kernel table", P.kernels, 150),
    ("e2e", "c. ViT-Tiny/8 at 1024 px", P.end_to_end, 90),
    ("zoo", "d. GPU zoo", zoo, None),
]
REHEARSAL_PHASE_S = 40  # each of a-c in a rehearsal (16-40 s each on a 2-core CPU at load average 9)
CLOSING_S = 10  # summary and archive
ARCHIVE_LIMIT = 15 * 2**20  # a returned file may have 16 MiB
SITE = Path("/tmp/gpukit-site")


def install(steps: Steps, python: str) -> Step:
    wheels = sorted((ROOT / KIT / "wheels").glob("*.whl"))
    if not wheels:
        return Step(
            "install",
            None,
            0.0,
            None,
            skipped=f"no wheels in {KIT}/wheels: run `python -m gpukit prepare` and send {KIT} with the command",
        )
    return steps.run(
        "install",
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-index",
            "--no-deps",
            "--no-compile",
            "--no-cache-dir",
            "--upgrade",
            "--target",
            SITE,
            *wheels,
        ],
        cap=90,
    )


def environment(steps: Steps, python: str, results: Path, rehearse: bool) -> dict:
    step = steps.run(
        "environment",
        [python, "-m", "gpukit.environment", *(["--find"] if rehearse else [])],
        cap=60,
        stdout=results / "environment.json",
    )
    try:
        return json.loads((results / "environment.json").read_text().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return {"error": f"environment step {step.status}; see logs/environment.log"}


def run_phase(fn, ctx: P.Context) -> P.Outcome:
    try:
        return fn(ctx)
    except Exception:  # the kit's own fault in one phase must not cost the next ones
        return P.Outcome([], "kit error", traceback.format_exc()[-3000:])


def status(outcome: P.Outcome) -> str:
    if not outcome.steps:
        return "error"
    bad = [f"{s.name}: {s.status}" for s in outcome.steps if not s.ok and not s.skipped]
    skipped = [s.name for s in outcome.steps if s.skipped]
    return ("ok" if not bad else "; ".join(bad)) + (f" (skipped: {', '.join(skipped)})" if skipped else "")


def summary(args, env: dict, rows: List[Tuple], pre: List[Step], seconds: float) -> str:
    mods = env.get("modules", {})
    failed = [f"{m}: {v}" for m, v in mods.items() if v.startswith("IMPORT FAILED")]
    lines = [
        f"# gpukit {'rehearsal (CPU, tiny sizes)' if args.rehearse else 'run'}, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {seconds:.0f} s",
        "",
        f"- GPU: {env.get('gpu', '?')} ({env.get('sms', '?')} SMs, {env.get('gpu_memory_gib', '?')} GiB, "
        f"capability {env.get('capability', '?')}); driver {env.get('driver', '?')}",
        f"- torch {env.get('torch', '?')} (CUDA {env.get('cuda', '?')}), triton {env.get('triton', '?')}, "
        f"timm {env.get('timm', '?')}, lightning {env.get('lightning', '?')}, "
        f"fla-core {env.get('fla-core', '?')}, Python {env.get('python', '?')}",
        *[f"- {s.name}: {s.status} ({s.seconds:.0f} s)" for s in pre],
        f"- imports that failed: {'; '.join(failed) if failed else 'none'}",
        "",
        "| phase | status | seconds / budget | headline |",
        "|---|---|---|---|",
    ]
    for title, st, secs, budget, outcome in rows:
        lines.append(f"| {title} | {st} | {secs:.0f} / {budget:.0f} | {outcome.headline.replace('|', '/')} |")
    for title, _, _, _, outcome in rows:
        steps = "\n".join(
            f"- {s.name}: {s.status}, {s.seconds:.0f} s" + (f", log {s.log.name}" if s.log else "")
            for s in outcome.steps
        )
        lines += ["", f"## {title}", "", steps or "- no steps ran"]
        if outcome.notes:
            lines += ["", "```", outcome.notes, "```"]
    lines += [
        "",
        f"Everything the phases wrote is in {ARCHIVE} (logs/, kernels/, end_to_end/, zoo/); "
        "docs/gpu.md says how to merge it.",
    ]
    return "\n".join(lines) + "\n"


def archive(results: Path, dest: Path) -> List[str]:
    """``results`` as a tar.gz at ``dest``; while it is over the limit the largest log is left out (named)."""
    files = sorted(p for p in results.rglob("*") if p.is_file())
    dropped = []
    while True:
        with tarfile.open(dest, "w:gz") as tar:
            for p in files:
                tar.add(p, arcname=str(p.relative_to(results.parent)))
        if dest.stat().st_size <= ARCHIVE_LIMIT or not files:
            return dropped
        largest = max(files, key=lambda p: p.stat().st_size)
        files.remove(largest)
        dropped.append(f"{largest.relative_to(results)} ({largest.stat().st_size / 2**20:.1f} MiB)")


def main(args) -> None:
    start = time.monotonic()
    default = REHEARSAL_BUDGET_S if args.rehearse else BUDGET_S
    total = args.budget_s or default
    end = start + total - CLOSING_S
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = Path(tempfile.mkdtemp(prefix="gpukit-")) / "results"
    python = sys.executable
    path = [str(ROOT)] if args.rehearse else [str(SITE), str(ROOT)]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(path + [os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHONUNBUFFERED="1",
    )
    steps = Steps(results / "logs", env)
    pre = [] if args.rehearse else [install(steps, python)]
    info = environment(steps, python, results, args.rehearse)
    ctx = P.Context(
        args.rehearse,
        python,
        results,
        steps,
        ROOT / KIT / "data" / DATA_NAME,
        args.zoo_epochs,
        args.zoo_presets.split(",") if args.zoo_presets else None,
    )
    wanted = args.phases.split(",") if args.phases else [name for name, *_ in PHASES]
    unknown = sorted(set(wanted) - {name for name, *_ in PHASES})
    if unknown:
        raise SystemExit(f"--phases: unknown {unknown}; choose from {[name for name, *_ in PHASES]}")
    rows = []
    for name, title, fn, budget in PHASES:
        if name not in wanted:
            continue
        t0 = time.monotonic()
        if budget is not None:  # a-c's budgets are for the default total: scaled with --budget-s
            budget = (REHEARSAL_PHASE_S if args.rehearse else budget) * total / default
        steps.deadline = end if budget is None else min(end, t0 + budget)
        outcome = run_phase(fn, ctx)
        rows.append((title, status(outcome), time.monotonic() - t0, steps.deadline - t0, outcome))
        print(f"[gpukit] {title}: {rows[-1][1]} ({rows[-1][2]:.0f} s) {outcome.headline}", flush=True)
    text = summary(args, info, rows, pre, time.monotonic() - start)
    (results / SUMMARY).write_text(text)
    dropped = archive(results, out / ARCHIVE)
    if dropped:
        text += f"\nLeft out of the archive (over {ARCHIVE_LIMIT / 2**20:.0f} MiB): {', '.join(dropped)}\n"
    (out / SUMMARY).write_text(text)
    shutil.rmtree(results.parent)  # checkpoints and unpacked data: only the archive comes back
    print(
        f"[gpukit] {out / SUMMARY}, {out / ARCHIVE} ({(out / ARCHIVE).stat().st_size / 2**20:.1f} MiB) "
        f"in {time.monotonic() - start:.0f} s",
        flush=True,
    )

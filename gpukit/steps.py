"""Commands under deadlines: each one's output in its own log, killed with its children when its time is up."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .layout import ROOT


@dataclass
class Step:
    """A finished command: its exit status (None when it was stopped at its deadline or never started), wall time,
    log; ``skipped``: why it did not run."""

    name: str
    rc: Optional[int]
    seconds: float
    log: Optional[Path]
    skipped: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    @property
    def status(self) -> str:
        if self.skipped:
            return f"skipped ({self.skipped})"
        return "ok" if self.ok else ("timed out" if self.rc is None else f"failed (exit {self.rc})")


class Steps:
    """Runs commands from the repo root with ``env``, logs under ``logs``, never past ``deadline``
    (``time.monotonic()``), which a phase sets."""

    def __init__(self, logs: Path, env: Dict[str, str]):
        self.logs, self.env, self.deadline = logs, env, float("inf")
        logs.mkdir(parents=True, exist_ok=True)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def start(
        self, name: str, argv: Sequence[str], env: Optional[Dict[str, str]] = None, stdout: Optional[Path] = None
    ):
        """Start ``argv``: its output into ``logs/<name>.log`` (stdout into ``stdout`` instead, when given)."""
        log = self.logs / f"{name}.log"
        out = open(log, "w")
        out.write(f"$ {' '.join(map(str, argv))}\n")
        out.flush()
        table = None
        if stdout is not None:
            stdout.parent.mkdir(parents=True, exist_ok=True)
            table = open(stdout, "w")
        proc = subprocess.Popen(
            [str(a) for a in argv],
            cwd=ROOT,
            stdout=table or out,
            stderr=out if table else subprocess.STDOUT,
            env={**self.env, **(env or {})},
            start_new_session=True,
        )
        if table:
            table.close()  # the child holds its own copy
        return name, proc, out, log, time.monotonic()

    def wait(self, started, cap: float = float("inf")) -> List[Step]:
        """Wait for every started command until the earlier of ``cap`` seconds and the deadline; stop the rest."""
        until = min(self.deadline, time.monotonic() + cap)
        steps = []
        for name, proc, out, log, t0 in started:
            try:
                rc = proc.wait(timeout=max(0.0, until - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop(proc)
                rc = None
                out.write(f"\n[gpukit] stopped at its deadline after {time.monotonic() - t0:.0f} s\n")
            out.close()
            steps.append(Step(name, rc, time.monotonic() - t0, log))
        return steps

    def run(
        self,
        name: str,
        argv: Sequence[str],
        cap: float = float("inf"),
        min_s: float = 5.0,
        env: Optional[Dict[str, str]] = None,
        stdout: Optional[Path] = None,
    ) -> Step:
        """One command for at most ``cap`` seconds; skipped when less than ``min_s`` is left before the deadline."""
        if self.left() < min_s:
            return Step(name, None, 0.0, None, skipped=f"{max(self.left(), 0):.0f} s left of the phase's budget")
        return self.wait([self.start(name, argv, env, stdout)], cap)[0]


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the command's process group, SIGKILL 5 s later if it is still there."""
    for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue

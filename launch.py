"""What train.py and eval.py do before Hydra parses the command line.

Nothing here imports torch, timm or Lightning (importing ``vitzoo`` does, since it registers the
architectures with timm), so ``--help`` and a configuration error answer in well under a second:
the scripts import their pipeline inside ``main``.
"""
from __future__ import annotations

import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, List, Optional

from omegaconf import OmegaConf

CONFIGS = Path(__file__).resolve().parent / "configs"
_HIDDEN_GROUPS = ("hydra",)


def wait_passively() -> None:
    """OpenMP threads sleep at a barrier instead of spinning (OMP_WAIT_POLICY=PASSIVE), unless the
    environment already chose: on a shared CPU a spinning thread burns the core its sibling waits for.
    Must run before torch is imported (libgomp reads it once, at load)."""
    if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"


def presets(config_name: str) -> str:
    """The groups a primary config composes, one line each: ``group: a, b*, c`` (* = its default)."""
    defaults = OmegaConf.to_container(OmegaConf.load(CONFIGS / f"{config_name}.yaml")).get("defaults", [])
    lines = []
    for entry in defaults:
        if not isinstance(entry, dict):
            continue  # _self_
        (key, chosen), = entry.items()
        group = key.removeprefix("override ").split("@")[0].strip("/")
        if group in _HIDDEN_GROUPS or not (CONFIGS / group).is_dir():
            continue
        options = sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))
        lines.append(f"  {group}: " + ", ".join(f"{o}*" if o == chosen else o for o in options))
    return "\n".join(lines)


OmegaConf.register_new_resolver("vitzoo_presets", presets, replace=True)  # used by configs/hydra/default.yaml


def _value(arg: str, key: str) -> Optional[str]:
    """The value of ``key=value`` (also ``+key`` / ``++key``), quotes removed; None when ``arg`` sets another key."""
    name, sep, value = arg.lstrip("+").partition("=")
    if name != key or not sep:
        return None
    return value[1:-1] if len(value) > 1 and value[0] == value[-1] and value[0] in "'\"" else value


def resume_in_place(argv: List[str]) -> List[str]:
    """``argv`` continuing the run a ``ckpt_path=<run>/checkpoints/<file>.ckpt`` belongs to: its run
    directory becomes this run's (checkpoints, exports, TensorBoard and train.log in one place), and this
    start's config goes to ``.hydra/resume-<time>/`` so the run's own ``.hydra/`` stays as it was started.
    Unchanged with ``hydra.run.dir=`` given, with ``-m``, or when the checkpoint is not inside a run."""
    args = argv[1:]
    if any(a in ("-m", "--multirun") or _value(a, "hydra.run.dir") is not None for a in args):
        return argv
    ckpt = next((v for v in (_value(a, "ckpt_path") for a in args) if v), None)
    if not ckpt or Path(ckpt).parent.name != "checkpoints":
        return argv
    run = Path(ckpt).resolve().parent.parent
    if not (run / ".hydra" / "config.yaml").is_file() or "'" in str(run):
        return argv
    return [*argv, f"hydra.run.dir='{run}'", f"hydra.output_subdir=.hydra/resume-{time.strftime('%Y-%m-%d_%H-%M-%S')}"]


def _one_line(err: Exception) -> str:
    from hydra.errors import MissingConfigException

    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, option = err.missing_cfg_file.rpartition("/")
        return f"{group}={option} is not a preset; choose one of: {', '.join(err.options)}"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [repr(err)]
    if len(lines) > 1 and lines[1].startswith("To "):  # "Could not override 'x'." and its fix; then OmegaConf's internals
        lines = lines[:2]
    return " ".join(lines)


@contextmanager
def hydra_errors() -> Iterator[None]:
    """A Hydra composition error (unknown preset or key, bad override) as one line on stderr, exit 1;
    Hydra's full report with HYDRA_FULL_ERROR=1."""
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        yield
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its search path and exiting
    try:
        yield
    except Exception as err:
        from hydra.errors import CompactHydraException

        if not isinstance(err, CompactHydraException):
            raise
        sys.exit(f"error: {_one_line(err)}")


def launch(main: Callable[[], object], resume: bool = False) -> None:
    """Run a ``@hydra.main`` function the way train.py (``resume=True``: :func:`resume_in_place`) and eval.py do."""
    wait_passively()
    if resume:
        sys.argv = resume_in_place(sys.argv)
    with hydra_errors():
        main()

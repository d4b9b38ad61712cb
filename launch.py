"""What train.py, eval.py and predict.py do around their pipeline: before Hydra parses the command line,
and, once it has, the checks that need no model and the clean-up of a refused start.

Nothing here imports torch, timm or Lightning (importing ``vitzoo`` does, since it registers the
architectures with timm), so ``--help``, a configuration error and a missing file answer before those
imports: the scripts import their pipeline inside ``main``, after :func:`check_paths`.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import shutil
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence

try:
    import hydra  # noqa: F401  (the entry points' own import, checked here first)
    from omegaconf import DictConfig, OmegaConf
except ModuleNotFoundError as missing:  # the library alone: `pip install vitzoo`
    sys.exit(
        f"error: {missing.name} is not installed; train.py, eval.py and predict.py need vitzoo's train extra: "
        f"pip install 'vitzoo[train]' (from a clone: pip install -e '.[train]')"
    )

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
        ((key, chosen),) = entry.items()
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
    cause = err.__cause__
    if lines[0].startswith("Error merging override") and cause is not None:  # a value the schema's type refuses
        key = getattr(cause, "full_key", None)
        return f"{lines[0]}: {str(getattr(cause, 'msg', cause)).splitlines()[0]}" + (f" ({key})" if key else "")
    # "Could not override 'x'." and its fix; then OmegaConf's internals
    if len(lines) > 1 and lines[1].startswith("To "):
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


def _required(cfg: DictConfig, key: str) -> Any:
    if OmegaConf.is_missing(cfg, key):
        sys.exit(f"error: {key} is required (??? in the config); pass {key}=... on the command line")
    return cfg[key]


def _paths(value: Any) -> List[str]:
    """One path, a list of paths or a {label: path} mapping, as a list."""
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value, resolve=True)
    if isinstance(value, dict):
        return [str(v) for v in value.values()]
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else [] if value is None else [str(value)]


def check_paths(cfg: DictConfig, files: Sequence[str] = (), inputs: Sequence[str] = ()) -> None:
    """Before any import of the pipeline: every path under the keys ``files`` names an existing file, each of
    ``inputs`` a file, a folder with files in it or a glob that matches one, and ``data.root`` (when the data
    has one and does not download) an existing folder. The first that does not is one line on stderr, exit 1."""
    for key in files:
        for path in _paths(_required(cfg, key)):
            if not os.path.isfile(path):
                what = "is a folder" if os.path.isdir(path) else "does not exist"
                sys.exit(
                    f"error: {key}={path!r} {what}; pass a checkpoint file, e.g. "
                    f"logs/train/runs/<date>_<time>/checkpoints/last.ckpt"
                )
    for key in inputs:
        for spec in _paths(_required(cfg, key)):
            if any(c in spec for c in "*?["):
                found = any(os.path.isfile(p) for p in glob.glob(os.path.expanduser(spec)))
            else:
                path = Path(spec).expanduser()
                found = path.is_file() or (path.is_dir() and any(p.is_file() for p in path.iterdir()))
                if not found and not path.exists():
                    sys.exit(
                        f"error: {key}={spec!r} does not exist; pass a folder, a file or a glob such as 'images/*.png'"
                    )
            if not found:
                sys.exit(f"error: {key}={spec!r} holds no files; pass a folder of images, an image or a glob")
    data = cfg.get("data")
    if data is not None and "root" in data and not data.get("download", False):
        root = _required(data, "root")
        if root is not None and "://" not in str(root) and not os.path.isdir(root):  # URL: data=shards' storage
            sys.exit(f"error: data.root={root!r} is not a folder; pass data.root=<the folder that holds the images>")


def check_types(cfg: DictConfig) -> None:
    """Before any import of the pipeline: a value of a group without a schema (the Lightning ``trainer``) that its
    type refuses is one line on stderr, exit 1 (``vitzoo.options.type_error``)."""
    error = sys.modules["vitzoo.options"].type_error(cfg)  # loaded by register_schemas, without torch
    if error:
        sys.exit(f"error: {error}")


def _files(run_dir: Path, skip: Path) -> Dict[Path, int]:
    """Every file under ``run_dir`` outside ``skip``, with its size."""
    return {p: p.stat().st_size for p in run_dir.rglob("*") if p.is_file() and skip not in p.parents}


@contextmanager
def refused_start_leaves_nothing(cfg: DictConfig) -> Iterator[None]:
    """Around a Hydra job: when it stops with a one-line error (``sys.exit("error: ...")``) having written
    nothing besides the configuration Hydra saved for it, that configuration goes (a refused resume leaves its
    run as it was) and so does a run directory holding only empty files, with the empty folders above it up
    to ``paths.log_dir``. A job that wrote something keeps it, with the error line appended to its log."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    config_dir = run_dir / hydra_cfg.output_subdir if hydra_cfg.output_subdir else run_dir / ".no-config"
    before = _files(run_dir, config_dir)
    try:
        yield
    except SystemExit as stop:
        if not (isinstance(stop.code, str) and stop.code.startswith("error:")):
            raise
        if _files(run_dir, config_dir) != before:
            log_file = run_dir / f"{hydra_cfg.job.name}.log"
            with open(log_file, "a") as log:
                log.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}][ERROR] {stop.code}\n")
            raise
        shutil.rmtree(config_dir, ignore_errors=True)
        if all(size == 0 for size in _files(run_dir, config_dir).values()):
            shutil.rmtree(run_dir, ignore_errors=True)
            _remove_empty_parents(run_dir, Path(cfg.paths.log_dir))
        raise


def _remove_empty_parents(run_dir: Path, log_dir: Path) -> None:
    log_dir = log_dir.resolve()
    folder = run_dir.resolve().parent
    while folder == log_dir or log_dir in folder.parents:
        try:
            folder.rmdir()  # only when empty
        except OSError:
            return
        folder = folder.parent


def register_schemas() -> None:
    """The option dataclasses of vitzoo/options.py into Hydra's ConfigStore: the schemas configs/ builds on.

    That module imports only the standard library; it is loaded from its file, without the package's
    ``__init__`` (torch, timm), and entered in ``sys.modules`` under its own name, so that the package, once the
    pipeline imports it, uses this very module and its classes."""
    name = "vitzoo.options"
    if name not in sys.modules:
        package = importlib.util.find_spec("vitzoo")  # a top-level name: found without being imported
        if package is None or not package.submodule_search_locations:
            sys.exit("error: the vitzoo package is not importable; from a clone: pip install -e '.[train]'")
        path = Path(next(iter(package.submodule_search_locations))) / "options.py"
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        sys.modules[name] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    sys.modules[name].register_configs()


def launch(main: Callable[[], object], resume: bool = False) -> None:
    """Run a ``@hydra.main`` function the way train.py (``resume=True``: :func:`resume_in_place`), eval.py and
    predict.py do."""
    wait_passively()
    register_schemas()
    if resume:
        sys.argv = resume_in_place(sys.argv)
    with hydra_errors():
        main()

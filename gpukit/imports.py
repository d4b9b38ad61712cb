"""What a kit run imports, read from the source (every ``import`` at any depth, of every file the run executes;
of the other test files, which ``pytest -m cuda`` collects, the module-level ones), and where each module comes
from there: the standard library, the checkout, the GPU machine's packages or the kit's wheels.

An import inside ``try: ... except ImportError`` is optional (the code runs without it) and not counted.
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from pathlib import Path
from typing import Dict, Iterable, Set

from .layout import ROOT
from .phases import CPU_SIDE
from .wheels import ROOTS, gpu_packages, normalise

RUN_FILES = [
    "train.py",
    "eval.py",
    "benchmarks/attention.py",
    "benchmarks/memory.py",
    "tests/conftest.py",
    "tests/attention_reference.py",
    "tests/test_kernels_cuda.py",
    *CPU_SIDE,
]
RUN_GLOBS = ["gpukit/*.py", "vitzoo/**/*.py", "benchmarks/zoo*.py"]
# modules of vitzoo code that no kit phase reaches, with the reason
NOT_RUN = {"litdata": "vitzoo.data.pack and data=shards (ImageNet shards); the kit's zoo reads the CIFAR-10 JPEG tree"}


def _guarded(node: ast.Try) -> bool:
    names = []
    for handler in node.handlers:
        t = handler.type
        names += [e.id for e in (t.elts if isinstance(t, ast.Tuple) else [t]) if isinstance(e, ast.Name)]
    return bool({"ImportError", "ModuleNotFoundError"} & set(names))


def imported(path: Path, module_level_only: bool = False) -> Set[str]:
    """Top-level names of the absolute imports in ``path`` not guarded by ``except ImportError``."""
    found: Set[str] = set()

    def visit(node: ast.AST, depth: int) -> None:
        if isinstance(node, ast.Try) and _guarded(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
        inner = depth + isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        if not (module_level_only and inner):
            for child in ast.iter_child_nodes(node):
                visit(child, inner)

    visit(ast.parse(path.read_text(), str(path)), 0)
    return found


def run_imports() -> Dict[str, Set[Path]]:
    """{top-level module: files importing it} over what a kit run executes and collects."""
    files = {ROOT / f for f in RUN_FILES} | {p for g in RUN_GLOBS for p in ROOT.glob(g)}
    out: Dict[str, Set[Path]] = {}
    for path in sorted(files):
        for name in imported(path):
            out.setdefault(name, set()).add(path)
    for path in sorted(set((ROOT / "tests").glob("*.py")) - files):
        for name in imported(path, module_level_only=True):
            out.setdefault(name, set()).add(path)
    return out


def local_modules() -> Set[str]:
    """Modules the checkout provides: top-level packages and scripts, the benchmarks' and tests' siblings."""
    names = set()
    for folder in (ROOT, ROOT / "benchmarks", ROOT / "tests"):
        names |= {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}
    return names


def unmet(modules: Iterable[str]) -> Dict[str, str]:
    """{module: why} for each module the GPU machine would not have: neither standard library nor the checkout,
    neither its packages nor the kit's roots (a module no installed distribution provides here is unmet too)."""
    gpu, local = gpu_packages(), local_modules()
    kit = {m for r in ROOTS for m in r.modules}
    dists = importlib.metadata.packages_distributions()
    out = {}
    for name in sorted(modules):
        if name in sys.stdlib_module_names or name in local or name in kit or name in NOT_RUN or name == "__future__":
            continue
        providers = {normalise(d) for d in dists.get(name, [])}
        if not providers:
            out[name] = "no installed distribution provides it here"
        elif not providers & gpu:
            out[name] = f"from {', '.join(sorted(providers))}: not on the GPU machine and not among the kit's wheels"
    return out

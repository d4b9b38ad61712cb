"""vitzoo's modules import one way: no module reaches itself through its imports (at the top of a file or
inside a function alike), so each room can be read, and loaded, without the rooms that build on it."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "vitzoo"


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: Set[str]) -> Set[str]:
    """The vitzoo modules ``path`` names in its import statements (``from pkg import sub`` names ``pkg.sub``
    when that is a module)."""
    here = _name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != here)
    return found


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    groups: List[List[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return groups


def test_no_import_circle_in_vitzoo():
    files = {_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: _imports(path, set(files)) for name, path in files.items()}
    assert _cycles(graph) == []


def test_the_circle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_vitzoo_attention_imports_every_module_of_its_package_and_exports_every_mechanism():
    """Registration happens on import: a mechanism file missing from vitzoo/attention/__init__.py would not exist
    for create_model. Each registered class is exported by name."""
    import vitzoo.attention as attention

    init = ast.parse((PACKAGE / "attention" / "__init__.py").read_text())
    imported = {node.module for node in init.body if isinstance(node, ast.ImportFrom) and node.level == 1}
    imported |= {
        alias.name
        for node in init.body
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module is None
        for alias in node.names
    }
    modules = {p.stem for p in (PACKAGE / "attention").glob("*.py") if p.stem != "__init__"}
    missing = sorted(modules - imported)
    assert not missing, f"add `from .{missing[0]} import <its classes>` to vitzoo/attention/__init__.py"
    classes = {attention.resolve_attention(name)[0] for name in attention.list_attentions()}
    assert {cls.__name__ for cls in classes} <= set(attention.__all__)
    assert all(getattr(attention, cls.__name__) is cls for cls in classes)

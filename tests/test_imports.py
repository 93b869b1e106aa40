"""No package's modules import each other around a circle; the layers import one way only
(kernels → tuner → db → api, gemmtune beside api: ARCHITECTURE.md); and inside tuner, its parts
one way: run → search → measure, all three onto the shared top-level modules.

Read from the source with ``ast``, counting every import, also those inside functions (a lazy
import still makes a circle: the old cli → worker → cli one was lazy on both sides)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What each part may import of tuner (besides itself); the top-level modules of tuner/ are
# "shared", the entry modules (__main__, record, kerneltuner) may import anything.
ALLOWED = {
    "shared": {"shared"},
    "measure": {"measure", "shared"},
    "search": {"search", "measure", "shared"},
    "run": {"run", "search", "measure", "shared"},
}
ENTRY_MODULES = {"tuner.__main__", "tuner.record", "tuner.kerneltuner"}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = ROOT, package: str = "tuner") -> dict[str, set[str]]:
    """Module → the package's modules it imports (anywhere in its file)."""
    paths = {module_name(p, root): p for p in (root / package).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from . / .. import
                    anchor = name.split(".")[: len(name.split(".")) - node.level + is_package]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` needs the module pkg.sub (pkg itself is only the
                # namespace it is found in); `from pkg import name` needs what pkg defines
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    imported.add(sub if sub in paths else base)
        graph[name] = {m for m in imported if m in paths and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each as a list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or parts[-1] in ALLOWED else "shared"


def test_the_finder_sees_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_counts_lazy_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from . import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    from pkg import a\n")
    (package / "a.py").write_text("from .sub.b import f\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.b"] == {"pkg.a"} and "pkg.sub.b" in graph["pkg.a"]
    assert cycles(graph) == [["pkg.a", "pkg.sub.b"]]


def test_no_import_circle_among_tuner_modules():
    graph = import_graph()
    assert len(graph) > 25 and "tuner.run.cli" in graph
    assert cycles(graph) == [], "modules that import each other, directly or around a circle"


def test_parts_import_only_downwards():
    wrong = [f"{source} imports {target}"
             for source, targets in import_graph().items() if source not in ENTRY_MODULES
             for target in sorted(targets) if part(target) not in ALLOWED[part(source)]]
    assert wrong == []


PACKAGES = ("kernels", "tuner", "db", "api", "gemmtune")
# What each package may import of the others (besides itself). api may use gemmtune's pure
# pack and precision modules, so a pack and a precision filter mean the same on both sides.
LAYERS = {
    "kernels": set(),
    "db": {"kernels"},
    "tuner": {"kernels", "db"},
    "gemmtune": {"kernels", "db"},
    "api": {"kernels", "db", "gemmtune.pack", "gemmtune.precision", "gemmtune.answers"},
}


def _project_imports(package: str) -> dict[str, set[str]]:
    """Module of `package` → modules of the other project packages it imports (anywhere)."""
    found: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        name = module_name(path, ROOT)
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                targets.add(node.module)
        found[name] = {t for t in targets if t.split(".")[0] in PACKAGES and t.split(".")[0] != package}
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_in_any_package(package):
    graph = import_graph(ROOT, package)
    assert len(graph) > 3
    assert cycles(graph) == [], "modules that import each other, directly or around a circle"


@pytest.mark.parametrize("package", PACKAGES)
def test_layers_import_only_downwards(package):
    allowed = LAYERS[package]
    wrong = [f"{module} imports {target}" for module, targets in _project_imports(package).items()
             for target in sorted(targets)
             if target not in allowed and target.split(".")[0] not in allowed]
    assert wrong == []

"""The architecture's rules, read from the source: no import cycles among the project's modules,
the core (``lookahead_core``) imports nothing from the harness, and the core's config dataclasses
(and the harness's config validation) import without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lookahead_core", "experiments")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Every project module ``name`` imports, at module level or inside a function (a lazy import
    still ties the two modules together), except under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for child in node.body for n in ast.walk(child)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    # A package's __init__ that re-exports its own submodules is not a cycle with them.
    packages = {name for name, path in project_modules().items() if path.name == "__init__.py"}
    edges = {v: {w for w in ws if not (w in packages and v.startswith(w + "."))} for v, ws in graph().items()}
    assert cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_core_imports_nothing_from_the_harness():
    reach = {name: deps for name, deps in graph().items() if name.startswith("lookahead_core")}
    offenders = {name: sorted(d for d in deps if not d.startswith("lookahead_core")) for name, deps in reach.items()}
    assert {name: deps for name, deps in offenders.items() if deps} == {}


def test_the_import_reader_sees_relative_lazy_and_aliased_imports(tmp_path, monkeypatch):
    source = "from .b import x\ndef f():\n    from ..c import d as e\nimport lookahead_core.pool\n"
    path = tmp_path / "a.py"
    path.write_text(source)
    modules = {"pkg.sub.a": path, "pkg.sub.b": path, "pkg.c": path, "pkg.c.d": path, "lookahead_core.pool": path}
    assert imports_of("pkg.sub.a", path, modules) == {"pkg.sub.b", "pkg.c.d", "pkg.c", "lookahead_core.pool"}


@pytest.mark.parametrize("statement", [
    "from lookahead_core.config import LookaheadConfig; LookaheadConfig(window=7, ngram=5, guess=7)",
    "import lookahead_core; lookahead_core.LookaheadConfig(window=2, ngram=3, guess=2)",
    "from experiments.config.schema import register_configs; from experiments.config.settings import plan",
])
def test_configs_validate_without_torch(statement):
    code = f"import sys\n{statement}\nassert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))[:3]"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_no_code_under_results():
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    assert [path for path in tracked if path.endswith((".py", ".sh"))] == []

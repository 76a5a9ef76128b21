"""Builds the Hub repository folder: ``make hub HUB_OUT=<folder>`` (or ``python hub/build.py <folder>``).

transformers loads a ``custom_generate`` repository's ``custom_generate/generate.py`` and the files
it imports relatively, one folder deep: ``from .x import y`` fetches ``custom_generate/x.py`` (and
then what that file imports, the same way); a package inside the folder, or a module imported by
``from . import x``, is never fetched. So the folder written here carries the decoder as flat
modules: ``lookahead_core/generate.py`` (the function transformers calls) and every module it
reaches, copied from ``lookahead_core/`` with only their relative imports renamed
(``cost/curve.py`` becomes ``cost_curve.py``, ``from ..config import`` becomes ``from .config
import``), each headed by the file it came from. Nothing in the folder is edited by hand: the
repository keeps one copy of the decoder, and this folder is rebuilt from it. Beside the modules:
``requirements.txt`` and the card (``README.md``), copied from this folder (hub/).

The build refuses to write a folder transformers would not load whole: the modules it vendors
must be exactly those transformers' own import scan reaches from ``generate.py``.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

HUB = Path(__file__).resolve().parent
ROOT = HUB.parent
CORE = ROOT / "lookahead_core"
ENTRY = CORE / "generate.py"
# transformers.dynamic_module_utils.get_relative_imports: the relative imports it follows
RELATIVE = (re.compile(r"^\s*import\s+\.(\S+)\s*$", re.MULTILINE), re.compile(r"^\s*from\s+\.(\S+)\s+import", re.MULTILINE))


def flat_name(path: Path) -> str:
    """The module name of a core file in the flat folder: ``cost/__init__.py`` -> ``cost``,
    ``cost/curve.py`` -> ``cost_curve``, ``decoder.py`` -> ``decoder``."""
    parts = list(path.relative_to(CORE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return "_".join(parts)


def _target(path: Path, level: int, module: str) -> Path:
    """The core file a relative import names (a module or a package's ``__init__``)."""
    base = path.parent
    for _ in range(level - 1):
        base = base.parent
    stem = base.joinpath(*module.split("."))
    for candidate in (stem.with_suffix(".py"), stem / "__init__.py"):
        if candidate.is_file():
            return candidate
    raise SystemExit(f"{path.relative_to(ROOT)}: no core file for the relative import of `{module}`")


def _renamed(path: Path, node: ast.ImportFrom) -> tuple[list[Path], ast.ImportFrom]:
    """The files a relative import reaches and the import in the flat folder. ``from . import x``
    stays that form (transformers' loader does not follow it: the build's check below then
    requires another file to import ``x`` the way it does)."""
    if node.module is not None:
        target = _target(path, node.level, node.module)
        return [target], ast.ImportFrom(module=flat_name(target), names=node.names, level=1)
    targets = [_target(path, node.level, alias.name) for alias in node.names]
    names = [ast.alias(name=flat_name(t), asname=alias.asname or alias.name) for t, alias in zip(targets, node.names)]
    return targets, ast.ImportFrom(module=None, names=names, level=1)


def vendored() -> dict[Path, str]:
    """Each core file ``generate.py`` reaches by relative imports, with its flat source."""
    out: dict[Path, str] = {}
    todo = [ENTRY]
    while todo:
        path = todo.pop()
        if path in out:
            continue
        source = path.read_text()
        lines = source.splitlines(keepends=True)
        edits = []
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and node.level:
                targets, renamed = _renamed(path, node)
                todo += targets
                edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset,
                              ast.unparse(renamed)))
        for start, col, end, end_col, text in sorted(edits, reverse=True):
            head, tail = lines[start - 1][:col], lines[end - 1][end_col:]
            lines[start - 1:end] = [head + text + tail]
        origin = path.relative_to(ROOT).as_posix()
        out[path] = (f"# Vendored from {origin} by `make hub` (hub/build.py{_commit()}): edit that file, not this one.\n"
                     + "".join(lines))
    return out


def _commit() -> str:
    ran = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True)
    return f", commit {ran.stdout.strip()}" if ran.returncode == 0 and ran.stdout.strip() else ""


def fetched(folder: Path) -> set[str]:
    """The modules transformers' loader reaches from ``folder/generate.py`` (its own regexes)."""
    seen, todo = set(), ["generate"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        text = (folder / f"{name}.py").read_text() if (folder / f"{name}.py").is_file() else ""
        todo += [m for pattern in RELATIVE for m in pattern.findall(text)]
    return seen


def build(out: str | Path) -> Path:
    """Writes the Hub folder at ``out`` (replacing one built before) and returns it."""
    out = Path(out)
    modules = vendored()
    if out.exists() and any(out.iterdir()):
        if not (out / "custom_generate" / "generate.py").is_file():
            raise SystemExit(f"{out} exists and is not a folder this build wrote: pick another HUB_OUT")
        shutil.rmtree(out)
    target = out / "custom_generate"
    target.mkdir(parents=True)
    names = {}
    for path, text in modules.items():
        name = flat_name(path)
        if name in names:
            raise SystemExit(f"{path} and {names[name]} would both be custom_generate/{name}.py")
        names[name] = path
        (target / f"{name}.py").write_text(text)
    shutil.copy(HUB / "custom_generate" / "requirements.txt", target / "requirements.txt")
    shutil.copy(HUB / "README.md", out / "README.md")
    reached = fetched(target)
    if reached != set(names):
        raise SystemExit(f"transformers would load {sorted(reached)} but the folder vendors {sorted(names)}")
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python hub/build.py <folder>   (make hub HUB_OUT=<folder>)")
    folder = build(sys.argv[1])
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    print(f"{folder}: {len(files)} files, {sum(p.stat().st_size for p in files) // 1024} KiB "
          f"(custom_generate/generate.py and the {len(files) - 3} core modules it imports, requirements.txt, README.md)")

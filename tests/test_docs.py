"""Every markdown document the repository cites exists in the repository.

Scans the tracked (and new, not ignored) .py, .yaml, .sh and .md files for ``docs/<name>.md``, the
bare names of developer notes that live outside the repository (they must not be cited), and, in
markdown files, relative links ``[text](path.md)``; each must resolve to a file here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".py", ".yaml", ".yml", ".sh", ".md")
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()

# docs/<name>.md anywhere (not as the tail of a longer path).
DOCS_REF = re.compile(r"(?<![\w./-])docs/[\w./-]*\.md\b")
# Notes that only ever lived outside the repository, with or without a leading folder.
NOTE_REF = re.compile(r"(?<![\w.-])(?:[\w.-]+/)*(?:REFERENCE|MODELS|STYLE|SOURCES)\.md\b")
# Markdown links to .md files: [text](path.md) or [text](path.md#anchor).
LINK_REF = re.compile(r"\[[^\]\n]*\]\(\s*([^)\s#]+\.md)(?:#[^)\s]*)?\s*\)")


def repository_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    return sorted(path for path in out.splitlines() if path.endswith(SUFFIXES) and path != SELF)


def references(path: str, text: str) -> list[tuple[str, str]]:
    """(reference, how to resolve it) pairs in ``text``: "root" or "here" (relative to ``path``)."""
    found = [(m.group(0), "root") for m in DOCS_REF.finditer(text)]
    found += [(m.group(0), "either") for m in NOTE_REF.finditer(text)]
    if path.endswith(".md"):
        found += [(m.group(1), "here") for m in LINK_REF.finditer(text) if "://" not in m.group(1)]
    return found


def resolves(path: str, ref: str, how: str) -> bool:
    here = (ROOT / path).parent
    bases = {"root": [ROOT], "here": [here], "either": [ROOT, here]}[how]
    for base in bases:
        target = (ROOT / ref.lstrip("/")) if ref.startswith("/") else (base / ref)
        target = target.resolve()
        if target.is_file() and ROOT in target.parents:
            return True
    return False


def broken_references(paths: list[str], read=lambda p: (ROOT / p).read_text(encoding="utf-8", errors="replace")):
    return [f"{path}: {ref}" for path in paths for ref, how in references(path, read(path))
            if not resolves(path, ref, how)]


def test_every_cited_document_exists():
    paths = repository_files()
    assert any(p.startswith("docs/") for p in paths), "docs/ is missing"
    assert broken_references(paths) == []


def test_the_scanner_flags_made_up_references():
    fake = {
        "lookahead_core/fake.py": '"""See docs/no_such_document.md and REFERENCE.md, "One step"."""\n'
                                  "# a real one: docs/algorithm.md\n",
        "docs/fake.md": "[gone](missing.md), [fine](algorithm.md), [web](https://example.org/x.md)\n",
    }
    broken = broken_references(list(fake), read=fake.__getitem__)
    assert broken == ["lookahead_core/fake.py: docs/no_such_document.md", "lookahead_core/fake.py: REFERENCE.md",
                      "docs/fake.md: missing.md"]


# ---------------------------------------------------------------------------------------------
# The README's Layout and Tests sections name every module and test file; docs/README.md every doc.

CODE_FOLDERS = ("lookahead_core", "experiments", "scripts")


def readme_section(title: str, text: str | None = None) -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8") if text is None else text
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def unlisted_modules(files: list[str], layout: str) -> list[str]:
    """Modules (``.py`` under the code folders, ``__init__.py`` aside) whose folder has no line in
    ``layout`` naming the module by its file name or stem."""
    lines = {}
    for line in layout.splitlines():
        folder = line.split(" ", 1)[0].strip()
        if folder.endswith("/"):
            lines[folder] = line
    missing = []
    for path in files:
        if not path.endswith(".py") or not path.startswith(CODE_FOLDERS) or path.endswith("__init__.py"):
            continue
        folder, name = path.rsplit("/", 1)
        line = lines.get(folder + "/", "")
        if not re.search(rf"(?<![\w.]){re.escape(name[:-3])}(?:\.py)?(?![\w])", line):
            missing.append(path)
    return missing


def unlisted_tests(files: list[str], tests: str) -> list[str]:
    return [path for path in files if path.startswith("tests/") and path.endswith(".py")
            and path.count("/") == 1 and path.rsplit("/", 1)[1] not in tests]


def test_the_readme_layout_names_every_module_and_its_tests_section_every_test_file():
    files = repository_files()
    assert unlisted_modules(files, readme_section("Layout")) == []
    assert unlisted_tests(files, readme_section("Tests")) == []


def test_the_docs_index_links_every_doc():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {m.group(1) for m in LINK_REF.finditer(index)}
    docs = {p.name for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert docs - linked == set()


def test_the_layout_check_fails_on_a_module_or_test_left_out():
    layout = "```\nlookahead_core/   the decoder: config, layout (masks), pool\nscripts/   gpu_run.py\n```\n"
    files = ["lookahead_core/config.py", "lookahead_core/pool.py", "lookahead_core/poolside.py",
             "lookahead_core/__init__.py", "scripts/gpu_run.py", "experiments/cli.py", "tests/test_pool.py", "tests/conftest.py"]
    assert unlisted_modules(files, layout) == ["lookahead_core/poolside.py", "experiments/cli.py"]
    assert unlisted_tests(files, "| `tests/test_pool.py` | the pool |") == ["tests/conftest.py"]
    with pytest.raises(AssertionError, match="no '## Layout' section"):
        readme_section("Layout", "# title\n## Tests\n")

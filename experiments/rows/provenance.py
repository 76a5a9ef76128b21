"""Where rows come from: the checkout's commit. Standard library only: the GPU command
(scripts/gpu_run.py), which runs without the harness's packages, reads it too. The chip is
``lookahead_core.capability.device_name``."""

from __future__ import annotations

import re
from pathlib import Path


def git_commit(root: Path) -> str:
    """Short hash of the checkout's HEAD, read from ``.git`` (no git process); "unknown" elsewhere."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree: ".git" names the real git directory
            git = (root / git.read_text().split(":", 1)[1].strip()).resolve()
        common = (git / (git / "commondir").read_text().strip()).resolve() if (git / "commondir").is_file() else git
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[len("ref: "):]
            loose = common / ref
            packed = (common / "packed-refs").read_text() if (common / "packed-refs").is_file() else ""
            matches = [line.split()[0] for line in packed.splitlines() if line.endswith(" " + ref)]
            head = loose.read_text().strip() if loose.is_file() else (matches[0] if matches else "")
    except OSError:
        return "unknown"
    return head[:7] if re.fullmatch(r"[0-9a-f]{40}", head) else "unknown"

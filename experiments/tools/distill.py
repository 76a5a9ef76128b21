"""The text the trained drafters learn from, and the base model's features over it, cached once.

Shared by ``experiments/tools/medusa.py`` and ``experiments/tools/eagle.py``. The text is the Python
standard library of the running interpreter, read from its files (no download, the same on every
machine with that Python): half **code** (the modules' source, in a seeded order) and half **prose**
(their docstrings: modules, classes, functions). No benchmark item (MT-Bench, HumanEval, MBPP,
ClassEval, CNN/DM, XSum, Spec-Bench) is drawn from it. The base's last hidden states (after its
final norm) and its argmax at every position are computed once per (model, corpus) and kept as fp16
shards outside the repository; a shard already on disk is kept, so the stage resumes.
"""

from __future__ import annotations

import ast
import csv
import json
import random
import sys
import sysconfig
import time
from pathlib import Path

CHUNK = 256                     # tokens per training chunk
HELD_OUT = 0.05                 # share of chunks held out for the accuracy table
CORPUS = "python-stdlib-v2"     # names the corpus recipe below (part of the cache key)


# ---------------------------------------------------------------------------------------------
# The corpus: the standard library's code and docstrings


def stdlib_files(seed: int) -> list[Path]:
    """The standard library's modules in a seeded order: no tests, no IDLE, no site-packages, and no
    ``encodings`` (generated charmap tables, not code anyone writes)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "turtledemo", "encodings"}
    files = sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts))
    random.Random(seed).shuffle(files)
    return files


def docstrings(source: str) -> list[str]:
    """The module's, classes' and functions' docstrings, in file order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    nodes = [tree] + [n for n in ast.walk(tree) if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return [doc for n in nodes if (doc := ast.get_docstring(n)) and len(doc) > 80]


def corpus_chunks(tokenizer, tokens: int, seed: int = 0) -> tuple[list[list[int]], dict]:
    """``tokens`` tokens of stdlib text as CHUNK-token chunks: half code, half prose; and what was used."""
    per_kind = tokens // 2
    chunks: list[list[int]] = []
    used = {"code": [], "prose": []}
    root = Path(sysconfig.get_paths()["stdlib"])
    for kind in ("code", "prose"):
        buffer: list[int] = []
        budget = per_kind
        for path in stdlib_files(seed):
            try:
                source = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            texts = [source] if kind == "code" else docstrings(source)
            if not texts:
                continue
            used[kind].append(str(path.relative_to(root)))
            for text in texts:
                buffer += tokenizer.encode(text + "\n\n", add_special_tokens=False)
            while len(buffer) >= CHUNK and budget >= CHUNK:
                chunks.append(buffer[:CHUNK])
                buffer, budget = buffer[CHUNK:], budget - CHUNK
            if budget < CHUNK:
                break
    record = {"corpus": CORPUS, "python": sys.version.split()[0], "stdlib": str(root), "seed": seed,
              "tokens": len(chunks) * CHUNK, "chunk": CHUNK, "files": {k: len(v) for k, v in used.items()},
              "first_files": {k: v[:5] for k, v in used.items()}}
    return chunks, record


# ---------------------------------------------------------------------------------------------
# Stage 1: the base's hidden states, cached once


def cache_hidden(model, chunks: list[list[int]], folder: Path, batch: int = 8) -> float:
    """fp16 last hidden states and the base's argmax for every chunk, in shards of ``batch`` chunks
    (a shard already on disk is kept: the stage resumes); returns the seconds all shards took."""
    import torch
    from tqdm import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    timing = folder / "seconds.json"
    seconds = json.loads(timing.read_text())["seconds"] if timing.is_file() else 0.0
    starts = range(0, len(chunks), batch)
    todo = [s for s in starts if not (folder / f"shard_{s:06d}.pt").is_file()]
    for start in tqdm(todo, desc="hidden states", unit="shard", disable=not todo):
        t0 = time.perf_counter()
        ids = torch.tensor(chunks[start:start + batch], device=model.device)
        with torch.inference_mode():
            out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        shard = {"hidden": out.hidden_states[-1].to(torch.float16).cpu(),
                 "argmax": out.logits.argmax(-1).to(torch.int32).cpu()}
        tmp = folder / f"shard_{start:06d}.tmp"
        torch.save(shard, tmp)
        tmp.rename(folder / f"shard_{start:06d}.pt")
        seconds += time.perf_counter() - t0
        timing.write_text(json.dumps({"seconds": round(seconds, 1)}))
    return seconds


def load_hidden(folder: Path):
    """The cached hidden states and argmaxes, in host memory: each batch goes to the heads' device
    as it is drawn (``evaluate``, ``train``), so a large corpus need not fit the GPU."""
    import torch

    shards = [torch.load(p, weights_only=True) for p in sorted(folder.glob("shard_*.pt"))]
    return torch.cat([s["hidden"] for s in shards]), torch.cat([s["argmax"] for s in shards]).long()


def write_curve(curve: list[dict], path: Path) -> None:
    fields = list(dict.fromkeys(k for row in curve for k in row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(curve)

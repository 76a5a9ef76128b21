"""The text the trained drafters learn from, and the base model's features over it, cached once.

Shared by ``experiments/tools/medusa.py`` and ``experiments/tools/eagle.py``. The text is the Python
standard library of the running interpreter, read from its files (no download, the same on every
machine with that Python): half **code** (the modules' source, in a seeded order) and half **prose**
(their docstrings: modules, classes, functions); optionally a share of it (``answers``) is the base's
own greedy answers to requests drawn from those docstrings (:func:`self_answers`), the text greedy
decoding shows a drafter. No benchmark item (MT-Bench, HumanEval, MBPP, ClassEval, CNN/DM, XSum,
Spec-Bench) is drawn from it. The base's hidden states (the last, after its final norm, or the
layers a drafter asks for) and its argmax at every position are computed once per (model, corpus)
and kept as fp16 shards outside the repository; a shard already on disk is kept, so the stage resumes.
"""

from __future__ import annotations

import ast
import csv
import json
import random
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


SELF = "self-answers-v2"          # names the recipe of the base's own answers (part of the cache key)
ASK = ("Explain what this part of a Python library does, in plain words:\n\n{doc}",
       "Write a Python function that does the following, with a short explanation:\n\n{doc}")
# Everyday requests about a topic, written here (no benchmark item): the kinds of writing, advice,
# explanation, story and arithmetic a chat model is asked for, about words of the model's own vocabulary.
TOPIC_ASK = ("Write a short blog post about {topic}.",
             "Explain {topic} to a curious ten-year-old.",
             "Give three practical tips about {topic}, with a sentence on each.",
             "Write a short poem about {topic}.",
             "What are the pros and cons of {topic}? Answer in a few paragraphs.",
             "Write a short story in which {topic} plays a central role.",
             "Describe the history of {topic} briefly.",
             "Make up a simple arithmetic word problem about {topic} and solve it step by step.")


def topics(tokenizer, seed: int) -> list[str]:
    """Lower-case English-looking words of 5-12 letters that the tokenizer holds as one token after a
    space, in a seeded order: the topics of :data:`TOPIC_ASK`'s requests."""
    words = set()
    for i in range(getattr(tokenizer, "vocab_size", 0) or 0):
        text = tokenizer.decode([i])
        if text.startswith(" ") and text[1:].isalpha() and text[1:].islower() and 5 <= len(text) - 1 <= 12:
            words.add(text[1:])
    words = sorted(words)
    random.Random(seed).shuffle(words)
    return words


def instructions(seed: int, tokenizer=None) -> list[str]:
    """The requests the base answers: drawn from the standard library's docstrings (their first
    paragraph), alternately asking for an explanation and for code, in a seeded order; with a
    ``tokenizer``, every other request is instead an everyday one (:data:`TOPIC_ASK`) about a word
    of its vocabulary (:func:`topics`)."""
    docs_asks = []
    for path in stdlib_files(seed):
        try:
            docs = docstrings(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, OSError):
            continue
        for doc in docs:
            first = doc.split("\n\n")[0].strip()
            if 60 <= len(first) <= 600:
                docs_asks.append(ASK[len(docs_asks) % 2].format(doc=first))
    everyday = [] if tokenizer is None else \
        [TOPIC_ASK[i % len(TOPIC_ASK)].format(topic=w) for i, w in enumerate(topics(tokenizer, seed))]
    if not everyday:                          # a tokenizer without word tokens (the tiny models' bytes)
        return docs_asks
    out = []
    for pair in zip(everyday, docs_asks):
        out += pair
    return out


def self_answers(model, tokenizer, tokens: int, seed: int, folder: Path, batch: int = 16,
                 new_tokens: int = 192) -> tuple[list[list[int]], dict]:
    """``tokens`` tokens of the base's own greedy answers to :func:`instructions` (everyday ones and
    ones drawn from the standard library's docstrings, in turn; request and answer,
    in the model's chat template where it has one), as CHUNK-token chunks: the text greedy decoding
    will show the drafter. Kept in ``folder`` as it is generated (a rerun goes on from there)."""
    import torch
    from tqdm import tqdm

    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "answers.json"
    done = json.loads(store.read_text()) if store.is_file() else {"texts": [], "seconds": 0.0, "asked": 0}
    asks = instructions(seed, tokenizer)
    eos = getattr(tokenizer, "eos_token_id", None)
    pad = getattr(tokenizer, "pad_token_id", None)
    pad = pad if pad is not None else (eos or 0)

    def render(ask: str) -> list[int]:
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": ask}], tokenize=False,
                                                 add_generation_prompt=True)
            return tokenizer.encode(text, add_special_tokens=False)
        return tokenizer.encode(f"Question: {ask}\nAnswer:")

    have = sum(len(t) for t in done["texts"])
    bar = tqdm(total=tokens, initial=min(have, tokens), desc="the base's own answers", unit="tok")
    while have < tokens and done["asked"] < len(asks):
        group = [render(a) for a in asks[done["asked"]:done["asked"] + batch]]
        t0 = time.perf_counter()
        width = max(map(len, group))
        ids = torch.tensor([[pad] * (width - len(g)) + g for g in group], device=model.device)
        mask = torch.tensor([[0] * (width - len(g)) + [1] * len(g) for g in group], device=model.device)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                                 pad_token_id=pad, eos_token_id=eos)
        for g, row in zip(group, out[:, width:].tolist()):
            answer = row[:row.index(eos) + 1] if eos in row else row
            done["texts"].append(g + answer)
            have += len(g) + len(answer)
            bar.update(len(g) + len(answer))
        done["asked"] += len(group)
        done["seconds"] += time.perf_counter() - t0
        tmp = store.with_suffix(".tmp")
        tmp.write_text(json.dumps(done))
        tmp.rename(store)
    bar.close()
    flat = [t for text in done["texts"] for t in text]
    chunks = [flat[i:i + CHUNK] for i in range(0, min(len(flat), tokens) - CHUNK + 1, CHUNK)]
    record = {"recipe": SELF, "asked": done["asked"], "tokens": len(chunks) * CHUNK, "max_new_tokens": new_tokens,
              "seconds": round(done["seconds"], 1), "first_request": asks[0][:120] if asks else None}
    return chunks, record


# ---------------------------------------------------------------------------------------------
# Stage 1: the base's hidden states, cached once


def cache_hidden(model, chunks: list[list[int]], folder: Path, batch: int = 8, layers: tuple[int, ...] = (-1,)) -> float:
    """fp16 hidden states (``layers``: indices into the model's ``hidden_states``, side by side; the
    last, after the final norm, by default) and the base's argmax for every chunk, in shards of
    ``batch`` chunks (a shard already on disk is kept: the stage resumes); returns the seconds all
    shards took."""
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
        states = torch.cat([out.hidden_states[i] for i in layers], -1)
        shard = {"hidden": states.to(torch.float16).cpu(),
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


# ---------------------------------------------------------------------------------------------
# The stage both drafter tools start from, and their resumable training state


@dataclass
class Distilled:
    """A frozen base and what it showed over the corpus: chunks, features and argmaxes (on the host;
    each batch moves to the drafter's device as it is drawn), split into training and held-out chunks."""

    model: Any
    record: dict                       # what the corpus is (corpus_chunks's record)
    key: dict                          # model and corpus: names the feature cache and keys the training state
    tokens: Any                        # (C, CHUNK) the chunks' token ids
    hidden: Any                        # (C, CHUNK, k * H) the base's hidden states (``layers``), fp16
    argmax: Any                        # (C, CHUNK) the base's argmax
    train_chunks: Any
    eval_chunks: Any
    generator: Any                     # seeded; drew the split, draws the batches
    cache_seconds: float               # what computing every feature shard took
    work: Path


def distil(model_config: Any, tokens: int, seed: int, work: Path, device: str, threads: int | None,
           layers: Any = (-1,), answers: float = 0.0) -> Distilled:
    """Load the base (float32, frozen), cut the corpus (``answers``: the share of its tokens that are
    the base's own greedy answers, :func:`self_answers`; the rest the standard library's text),
    cache its features in ``work`` (resuming; ``layers``: a callable of the model giving the
    ``hidden_states`` indices to keep, or the indices), and split the chunks, HELD_OUT of them held out."""
    import torch

    from experiments.models.loader import load_model

    if threads:
        torch.set_num_threads(threads)
    work.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(model_config.spec, dtype="float32", device=device, cache_dir=model_config.cache_dir)
    if tokenizer is None:                           # the tiny random test models ship none
        from experiments.models.tiny_tokenizer import ByteTokenizer
        tokenizer = ByteTokenizer(model.config.vocab_size)
    for p in model.parameters():
        p.requires_grad_(False)
    chunks, record = corpus_chunks(tokenizer, round(tokens * (1 - answers)), seed)
    if answers:
        own, record["answers"] = self_answers(model, tokenizer, round(tokens * answers), seed,
                                              work / f"answers_{SELF}_{model_config.name}_{seed}".replace("/", "-"))
        chunks += own
        record["tokens"] = len(chunks) * CHUNK
    if len(chunks) < 20:
        raise SystemExit(f"the corpus gave {len(chunks)} chunks of {CHUNK} tokens: ask for more tokens (tokens=)")
    layers = tuple(layers(model) if callable(layers) else layers)
    key = {"model": model_config.name, **{k: record[k] for k in ("corpus", "python", "seed", "tokens")}}
    if answers:
        key["answers"] = f"{SELF}-{answers}"
    if layers != (-1,):
        key["layers"] = "-".join(map(str, layers))
    hidden_dir = work / ("hidden_" + "_".join(f"{v}" for v in key.values()).replace("/", "-"))
    cache_seconds = cache_hidden(model, chunks, hidden_dir, layers=layers)
    hidden, argmax = load_hidden(hidden_dir)
    n_eval = max(1, int(len(chunks) * HELD_OUT))
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(chunks), generator=g)
    return Distilled(model, record, key, torch.tensor(chunks), hidden, argmax, order[n_eval:], order[:n_eval], g,
                     cache_seconds, work)


class Checkpoint:
    """A training's state in ``path``: ``parts`` (name -> a module or optimizer) with the step, the
    seconds, the curve and optionally the batch generator; it resumes only under the same ``key``."""

    def __init__(self, path: Path, key: dict, parts: dict[str, Any], map_location: Any) -> None:
        self.path, self.key, self.parts, self.map_location = path, key, parts, map_location

    def resume(self, total_steps: int, generator: Any = None) -> tuple[int, float, list[dict]]:
        """(step, seconds, curve) to go on from: the saved ones under this key, else a fresh start."""
        import torch

        if not self.path.is_file():
            return 0, 0.0, []
        saved = torch.load(self.path, weights_only=False, map_location=self.map_location)
        if saved["key"] != self.key:
            return 0, 0.0, []
        for name, part in self.parts.items():
            part.load_state_dict(saved[name])
        if generator is not None:
            generator.set_state(saved["generator"])
        print(f"resuming at step {saved['step']} of {total_steps}")
        return saved["step"], saved["seconds"], saved["curve"]

    def save(self, step: int, seconds: float, curve: list[dict], generator: Any = None) -> None:
        import torch

        state = {"key": self.key, **{name: part.state_dict() for name, part in self.parts.items()},
                 "step": step, "seconds": seconds, "curve": curve}
        if generator is not None:
            state["generator"] = generator.get_state()
        tmp = self.path.with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.rename(self.path)

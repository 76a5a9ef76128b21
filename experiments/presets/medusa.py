"""Train Medusa-1 heads for a model the harness runs, on text no evaluated item contains.

    python -m experiments.presets.medusa train --model smollm2_135m            # about 20-30 min here
    python -m experiments.presets.medusa train --model qwen25_coder_05b --tokens 60000
    python -m experiments.presets.medusa show --model smollm2_135m             # where they are, how they did
    python -m experiments.presets.medusa collect results/medusa                # the benchmark runs as one table

The text is the Python standard library of the running interpreter, read from its files (no
download, the same on every machine with that Python): half **code** (the modules' source, in a
seeded order) and half **prose** (their docstrings: modules, classes, functions). No benchmark item
(MT-Bench, HumanEval, MBPP, ClassEval, CNN/DM, XSum, Spec-Bench) is drawn from it.

Method (Medusa-1): the base model is frozen; its last hidden states over the corpus (256-token
chunks) are computed once and cached as fp16 shards outside the repository, with the base's own
argmax at every position. Head k is trained to predict the base's argmax k positions later (self-
distillation: what greedy decoding will verify), loss weighted 0.8 ** (k - 1), the heads sharing the
base's LM head (only the residual blocks train: see ``lookahead_core/medusa.py``). 5% of the chunks
are held out: their per-head, per-rank accuracy is the tree's prior (``config.json``, ``accuracy``)
and the curve (``curve.csv``, ``curve.png``: loss and top-1 per head). Every stage resumes: shards
already cached are kept, and training restarts from its last checkpoint.

The heads go to ``$LOOKAHEAD_CACHE/medusa/<model>`` (default ``~/.cache/lookahead_bench``), where
``decoding=medusa`` finds them.
"""

from __future__ import annotations

import argparse
import ast
import csv
import json
import random
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path

from experiments.models.heads import heads_dir, model_spec, train_command
from experiments.reporting.drafts import draft_acceptance

CHUNK = 256                     # tokens per training chunk
HELD_OUT = 0.05                 # share of chunks held out for the accuracy table
LOSS_DECAY = 0.8                # head k's loss weight: LOSS_DECAY ** (k - 1)
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


# ---------------------------------------------------------------------------------------------
# Stage 2: the heads


def head_targets(argmax, positions, heads: int):
    """For positions (c, t): head k's target is the base's argmax at (c, t + k)."""
    import torch

    c, t = positions
    return torch.stack([argmax[c, t + k] for k in range(1, heads + 1)])        # (K, B)


def evaluate(heads, hidden, argmax, positions, ranks: int = 10) -> list[list[float]]:
    """Per head, the share of positions whose target is the head's rank-r token (r < ranks)."""
    import torch

    c, t = positions
    device = next(heads.parameters()).device
    targets = head_targets(argmax, positions, heads.num_heads).to(device)
    hits = torch.zeros(heads.num_heads, ranks, device=device)
    with torch.inference_mode():
        for s in range(0, len(c), 512):
            logits = heads(hidden[c[s:s + 512], t[s:s + 512]].to(device).float())   # (K, b, V)
            top = logits.topk(ranks, dim=-1).indices                             # (K, b, r)
            hits += (top == targets[:, s:s + 512, None]).sum(1).float()
    return (hits / len(c)).tolist()


def train(args: argparse.Namespace) -> Path:
    import torch
    from tqdm import tqdm

    from experiments.models.loader import load_model
    from lookahead_core.medusa import for_model, save_heads

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out) if args.out else heads_dir(args.model, args.cache_dir)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(model_spec(args.model), dtype="float32", device=args.device)
    if tokenizer is None:                           # the tiny random test models ship none
        from experiments.models.tiny_tokenizer import ByteTokenizer
        tokenizer = ByteTokenizer(model.config.vocab_size)
    for p in model.parameters():
        p.requires_grad_(False)
    chunks, record = corpus_chunks(tokenizer, args.tokens, args.seed)
    if len(chunks) < 20:
        raise SystemExit(f"the corpus gave {len(chunks)} chunks of {CHUNK} tokens: ask for more --tokens")
    key = {"model": args.model, **{k: record[k] for k in ("corpus", "python", "seed", "tokens")}}
    hidden_dir = work / ("hidden_" + "_".join(f"{v}" for v in key.values()).replace("/", "-"))
    cache_seconds = cache_hidden(model, chunks, hidden_dir)
    hidden, argmax = load_hidden(hidden_dir)
    n_eval = max(1, int(len(chunks) * HELD_OUT))
    g = torch.Generator().manual_seed(args.seed)
    order = torch.randperm(len(chunks), generator=g)
    train_chunks, eval_chunks = order[n_eval:], order[:n_eval]
    last = CHUNK - args.heads                      # positions with a target for every head
    eval_pos = (eval_chunks.repeat_interleave(last), torch.arange(last).repeat(len(eval_chunks)))

    heads = for_model(model, args.heads, args.layers, shared=True)
    device = next(heads.parameters()).device       # the model's (--device): the cached states are on the host
    heads.train()
    optimizer = torch.optim.AdamW(heads.parameters(), lr=args.lr, weight_decay=0.0)
    state_path, curve_path = work / "train_state.pt", out / "curve.csv"
    state_key = {**key, "heads": args.heads, "layers": args.layers, "lr": args.lr, "batch": args.batch}
    step, seconds, curve, accuracy = 0, 0.0, [], None
    if state_path.is_file():
        saved = torch.load(state_path, weights_only=False, map_location=device)
        if saved["key"] == state_key:
            heads.heads.load_state_dict(saved["heads"])
            optimizer.load_state_dict(saved["optimizer"])
            step, seconds, curve = saved["step"], saved["seconds"], saved["curve"]
            print(f"resuming at step {step} of {args.steps}")
    weights = torch.tensor([LOSS_DECAY ** k for k in range(args.heads)], device=device)
    bar = tqdm(total=args.steps, initial=step, desc=f"medusa heads ({args.model})", unit="step")
    while step < args.steps:
        t = time.perf_counter()
        pick = torch.randint(len(train_chunks), (args.batch,), generator=g)
        pos = (train_chunks[pick], torch.randint(last, (args.batch,), generator=g))
        targets = head_targets(argmax, pos, args.heads).to(device)
        logits = heads(hidden[pos[0], pos[1]].to(device).float())              # (K, B, V)
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                                   reduction="none").view(args.heads, -1).mean(1)
        optimizer.zero_grad()
        (losses * weights).sum().backward()
        optimizer.step()
        step += 1
        seconds += time.perf_counter() - t
        top1 = (logits.argmax(-1) == targets).float().mean(1)
        row = {"step": step, "seconds": round(seconds, 1),
               **{f"loss_{k + 1}": round(float(losses[k].detach()), 4) for k in range(args.heads)},
               **{f"top1_{k + 1}": round(float(top1[k]), 4) for k in range(args.heads)}}
        checkpoint = step % args.eval_every == 0 or step == args.steps     # the last step always is one
        if checkpoint:
            heads.eval()
            accuracy = evaluate(heads, hidden, argmax, eval_pos)
            heads.train()
            row.update({f"heldout_top1_{k + 1}": round(accuracy[k][0], 4) for k in range(args.heads)})
        curve.append(row)
        bar.update(1)
        bar.set_postfix(loss=f"{float(losses[0].detach()):.2f}", top1=f"{float(top1[0]):.2f}")
        if checkpoint:
            tmp = state_path.with_suffix(".tmp")
            torch.save({"key": state_key, "heads": heads.heads.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step, "seconds": seconds, "curve": curve}, tmp)
            tmp.rename(state_path)
    bar.close()
    heads.eval()
    if accuracy is None:                           # resumed after the last step: nothing evaluated yet
        accuracy = evaluate(heads, hidden, argmax, eval_pos)
    heads.accuracy = accuracy
    heads.training_record = {**record, "targets": "the base's argmax k positions ahead (self-distillation)",
                             "held_out_chunks": n_eval, "steps": args.steps, "batch": args.batch, "lr": args.lr,
                             "loss_decay": LOSS_DECAY, "train_seconds": round(seconds, 1),
                             "hidden_cache_seconds": round(cache_seconds, 1), "threads": torch.get_num_threads(),
                             "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    save_heads(heads, out)
    write_curve(curve, curve_path)
    plot_curve(curve, out / "curve.png", args.model)
    print(f"heads saved to {out}; held-out top-1 per head: {[round(a[0], 3) for a in accuracy]}")
    return out


def write_curve(curve: list[dict], path: Path) -> None:
    fields = list(dict.fromkeys(k for row in curve for k in row))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fields)
        writer.writeheader()
        writer.writerows(curve)


def plot_curve(curve: list[dict], path: Path, title: str) -> Path:
    """Training loss (smoothed over 20 steps) and held-out top-1 per head against steps."""
    import pandas as pd
    from matplotlib.figure import Figure

    df = pd.DataFrame(curve)
    heads = sorted(int(c.split("_")[1]) for c in df if c.startswith("loss_"))
    fig = Figure(figsize=(10, 4))
    loss_ax, acc_ax = fig.subplots(1, 2)
    for k in heads:
        loss_ax.plot(df["step"], df[f"loss_{k}"].rolling(20, min_periods=1).mean(), label=f"head {k}")
        if f"heldout_top1_{k}" in df:
            held = df.dropna(subset=[f"heldout_top1_{k}"])
            acc_ax.plot(held["step"], held[f"heldout_top1_{k}"], marker="o", label=f"head {k}")
    loss_ax.set(xlabel="step", ylabel="cross-entropy (train, 20-step mean)", title=f"{title}: loss")
    acc_ax.set(xlabel="step", ylabel="top-1 accuracy (held-out)", title=f"{title}: held-out top-1")
    loss_ax.legend(), acc_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def show(args: argparse.Namespace) -> None:
    folder = Path(args.out) if args.out else heads_dir(args.model, args.cache_dir)
    config = folder / "config.json"
    if not config.is_file():
        raise SystemExit(f"no heads for {args.model} at {folder}; train them with `{train_command(args.model)}`")
    data = json.loads(config.read_text())
    print(folder)
    print(json.dumps({k: data[k] for k in ("medusa_num_heads", "medusa_num_layers", "base_model_name_or_path",
                                           "training")}, indent=1))
    print("held-out top-1 per head:", [round(a[0], 3) for a in data["accuracy"]])


def role(label: str) -> str:
    """What a benchmarked decoder is, in the Medusa comparison."""
    if "_md" in label:
        return "Medusa + training-free tree" if ("sfx" in label or "rc" in label) else "Medusa heads alone"
    if label.startswith("pool_") and "tree" in label:
        return "training-free tree"
    if label.startswith("hf_pld_k"):
        return f"prompt lookup k={label[len('hf_pld_k'):]}"
    return {"hf_greedy": "generate greedy", "greedy": "core greedy"}.get(label, label)


def collect(root: Path) -> str:
    """``root``'s benchmark runs (``scripts/runs/medusa/bench.sh``) as one table: per model and set,
    every decoder's S, tokens fed per step and speedup over ``generate`` greedy; then the Medusa
    nodes' acceptance per head (depth) and the decoders' overhead. Written to ``root/table.md``."""
    import pandas as pd

    from experiments.presets import benchmark
    from experiments.reporting.tables import cell, markdown

    speed, heads = [], []
    for rows in sorted(root.glob("*/rows.csv")):
        df = benchmark.load_rows(rows)
        table = benchmark.summarize(df)
        model, dataset = df["model"].iloc[0], df["dataset"].iloc[0]
        for _, r in table.iterrows():
            label = r["label"] or r["decoder"]
            speed.append({"model": model, "set": dataset, "decoder": role(label), "config": label,
                          "prompts": r["prompts"], "S": f"{r['S']:.2f}", "tokens/step": cell(r["tokens_per_step"], ".1f"),
                          "speedup (sum)": f"{r['speedup_sum']:.2f}x", "speedup (median)": f"{r['speedup_median']:.2f}x",
                          "outside the model": f"{100 * r['overhead']:.0f}%",
                          "equal to greedy": f"{r['match_hf_greedy']:.0%}"})
        acceptance = draft_acceptance(df)
        if len(acceptance):
            for decoder, group in acceptance[acceptance["source"] == "medusa"].groupby("decoder"):
                row = {"model": model, "set": dataset, "decoder": role(decoder)}
                for _, r in group.sort_values("depth").iterrows():
                    row[f"head {r['depth']}"] = (f"{r['acceptance']:.2f} ({r['accepted']}/{r['tried']})"
                                                 if r["tried"] else "-")
                heads.append(row)
    text = "## Speed (ratio of summed decode time against `generate` greedy, same run)\n\n"
    text += markdown(pd.DataFrame(speed, dtype=object)) if speed else "(no runs)\n"
    text += "\n\n## Medusa nodes: accepted / tried per head (depth), summed over prompts\n\n"
    text += markdown(pd.DataFrame(heads, dtype=object).fillna("-")) if heads else "(no Medusa rows)"
    text += "\n"
    (root / "table.md").write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("train", "show"):
        p = sub.add_parser(name)
        p.add_argument("--model", required=True, help="a harness model name (conf/model) or spec")
        p.add_argument("--out", default=None, help="the heads' folder (default: the cache's, keyed by model)")
        p.add_argument("--cache-dir", default=None, help="the cache root (default $LOOKAHEAD_CACHE)")
    collect_parser = sub.add_parser("collect", help="the benchmark runs under a folder as one table (table.md)")
    collect_parser.add_argument("root", type=Path)
    train_parser = sub.choices["train"]
    train_parser.add_argument("--heads", type=int, default=4)
    train_parser.add_argument("--layers", type=int, default=1)
    train_parser.add_argument("--tokens", type=int, default=120_000, help="corpus tokens (half code, half prose)")
    train_parser.add_argument("--steps", type=int, default=1000)
    train_parser.add_argument("--batch", type=int, default=256, help="positions per step")
    train_parser.add_argument("--lr", type=float, default=1e-3)
    train_parser.add_argument("--eval-every", type=int, default=50)
    train_parser.add_argument("--seed", type=int, default=0)
    train_parser.add_argument("--threads", type=int, default=None)
    train_parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    if args.command == "collect":
        print(collect(args.root))
    else:
        train(args) if args.command == "train" else show(args)


if __name__ == "__main__":
    main()

"""Train Medusa-1 heads for a model the harness runs, on text no evaluated item contains.

    python -m experiments.tools.medusa                                        # SmolLM2-135M: about 20-30 min here
    python -m experiments.tools.medusa model=qwen25_coder_05b tokens=60000
    python -m experiments.tools.medusa model=smollm2_135m show=true           # where they are, how they did
    python -m experiments.reporting.drafters results/medusa                   # the benchmark runs as one table

Configured by ``conf/medusa.yaml`` (the ``model`` group of ``run.py`` and this tool's keys, typed by
:class:`MedusaConfig`); a bad key or value fails in one line naming it, before torch loads.

The text is the Python standard library's code and docstrings (``experiments/tools/distill.py``:
no benchmark item is drawn from it).

Method (Medusa-1): the base model is frozen; its last hidden states over the corpus (256-token
chunks) are computed once and cached as fp16 shards outside the repository, with the base's own
argmax at every position. Head k is trained to predict the base's argmax k positions later (self-
distillation: what greedy decoding will verify), loss weighted 0.8 ** (k - 1), the heads sharing the
base's LM head (only the residual blocks train: see ``lookahead_core/medusa.py``). 5% of the chunks
are held out: their per-head, per-rank accuracy is the tree's prior (``config.json``, ``accuracy``)
and the curve (``curve.csv``, ``curve.png``: loss and top-1 per head). Every stage resumes: shards
already cached are kept, and training restarts from its last checkpoint.

The heads go to ``<model.cache_dir or $LOOKAHEAD_CACHE>/medusa/<model.name>`` (default
``~/.cache/lookahead_bench``), where ``decoding=medusa`` finds them.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.config.errors import ConfigError
from experiments.data.datasets import repo_root
from experiments.tools import app
from experiments.tools.distill import CHUNK, Checkpoint, distil, write_curve


@dataclass
class MedusaConfig(app.Training):
    """``conf/medusa.yaml``: the base model and the run (:class:`app.Training`; the corpus half code,
    half prose), and the heads' training."""

    heads: int = 4
    layers: int = 1                        # residual blocks per head
    batch: int = 256                       # positions per step
    lr: float = 1e-3


ConfigStore.instance().store(name="medusa_schema", node=MedusaConfig)


def check(cfg: DictConfig) -> MedusaConfig:
    """The composed config as a :class:`MedusaConfig`; a value out of range (or a model whose
    packages are missing) is a ConfigError naming its key."""
    s = OmegaConf.to_object(cfg)
    app.check_training(s, "head training")
    app.at_least_one(s, "heads", "layers", "batch")
    if s.heads >= CHUNK:
        raise ConfigError(f"heads: must be below the chunk length {CHUNK}, got {s.heads}")
    app.positive(s, "lr")
    return s


def heads_folder(s: MedusaConfig) -> Path:
    from experiments.models.heads import heads_dir   # the loader's cache root: imports torch

    return Path(s.out).expanduser() if s.out else heads_dir(s.model.name, s.model.cache_dir)


LOSS_DECAY = 0.8                # head k's loss weight: LOSS_DECAY ** (k - 1)


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


def train(s: MedusaConfig) -> Path:
    import torch
    from tqdm import tqdm

    from lookahead_core.medusa import for_model, save_heads

    out = heads_folder(s)
    base = distil(s.model, s.tokens, s.seed, out / "work", s.device, s.threads)
    model, hidden, argmax, g = base.model, base.hidden, base.argmax, base.generator
    train_chunks, eval_chunks = base.train_chunks, base.eval_chunks
    last = CHUNK - s.heads                      # positions with a target for every head
    eval_pos = (eval_chunks.repeat_interleave(last), torch.arange(last).repeat(len(eval_chunks)))

    heads = for_model(model, s.heads, s.layers, shared=True)
    device = next(heads.parameters()).device       # the model's (device=): the cached states are on the host
    heads.train()
    optimizer = torch.optim.AdamW(heads.parameters(), lr=s.lr, weight_decay=0.0)
    state = Checkpoint(base.work / "train_state.pt", {**base.key, "heads": s.heads, "layers": s.layers, "lr": s.lr,
                                                      "batch": s.batch}, {"heads": heads.heads, "optimizer": optimizer},
                       device)
    step, seconds, curve = state.resume(s.steps)
    accuracy = None
    weights = torch.tensor([LOSS_DECAY ** k for k in range(s.heads)], device=device)
    bar = tqdm(total=s.steps, initial=step, desc=f"medusa heads ({s.model.name})", unit="step")
    while step < s.steps:
        t = time.perf_counter()
        pick = torch.randint(len(train_chunks), (s.batch,), generator=g)
        pos = (train_chunks[pick], torch.randint(last, (s.batch,), generator=g))
        targets = head_targets(argmax, pos, s.heads).to(device)
        logits = heads(hidden[pos[0], pos[1]].to(device).float())              # (K, B, V)
        losses = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten(),
                                                   reduction="none").view(s.heads, -1).mean(1)
        optimizer.zero_grad()
        (losses * weights).sum().backward()
        optimizer.step()
        step += 1
        seconds += time.perf_counter() - t
        top1 = (logits.argmax(-1) == targets).float().mean(1)
        row = {"step": step, "seconds": round(seconds, 1),
               **{f"loss_{k + 1}": round(float(losses[k].detach()), 4) for k in range(s.heads)},
               **{f"top1_{k + 1}": round(float(top1[k]), 4) for k in range(s.heads)}}
        checkpoint = step % s.eval_every == 0 or step == s.steps     # the last step always is one
        if checkpoint:
            heads.eval()
            accuracy = evaluate(heads, hidden, argmax, eval_pos)
            heads.train()
            row.update({f"heldout_top1_{k + 1}": round(accuracy[k][0], 4) for k in range(s.heads)})
        curve.append(row)
        bar.update(1)
        bar.set_postfix(loss=f"{float(losses[0].detach()):.2f}", top1=f"{float(top1[0]):.2f}")
        if checkpoint:
            state.save(step, seconds, curve)
    bar.close()
    heads.eval()
    if accuracy is None:                           # resumed after the last step: nothing evaluated yet
        accuracy = evaluate(heads, hidden, argmax, eval_pos)
    heads.accuracy = accuracy
    heads.training_record = {**base.record, "targets": "the base's argmax k positions ahead (self-distillation)",
                             "held_out_chunks": len(eval_chunks), "steps": s.steps, "batch": s.batch, "lr": s.lr,
                             "loss_decay": LOSS_DECAY, "train_seconds": round(seconds, 1),
                             "hidden_cache_seconds": round(base.cache_seconds, 1), "threads": torch.get_num_threads(),
                             "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    save_heads(heads, out)
    write_curve(curve, out / "curve.csv")
    plot_curve(curve, out / "curve.png", s.model.name)
    print(f"heads saved to {out}; held-out top-1 per head: {[round(a[0], 3) for a in accuracy]}")
    return out


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


def show(s: MedusaConfig) -> None:
    from experiments.models.heads import train_command

    folder = heads_folder(s)
    config = folder / "config.json"
    if not config.is_file():
        raise SystemExit(f"no heads for {s.model.name} at {folder}; train them with `{train_command(s.model.name)}`")
    data = json.loads(config.read_text())
    print(folder)
    print(json.dumps({k: data[k] for k in ("medusa_num_heads", "medusa_num_layers", "base_model_name_or_path",
                                           "training")}, indent=1))
    print("held-out top-1 per head:", [round(a[0], 3) for a in data["accuracy"]])


@hydra.main(config_path=str(repo_root() / "conf"), config_name="medusa", version_base="1.3")
def main(cfg: DictConfig) -> None:
    s = app.checked(cfg, check)
    show(s) if s.show else train(s)


if __name__ == "__main__":
    app.launch("medusa", main, check)

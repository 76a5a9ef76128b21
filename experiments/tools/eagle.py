"""Train an EAGLE drafter for a model the harness runs, on text no evaluated item contains.

    python -m experiments.tools.eagle                                         # SmolLM2-135M
    python -m experiments.tools.eagle model=qwen25_coder_05b tokens=60000 steps=600
    python -m experiments.tools.eagle model=smollm2_135m show=true            # where it is, how it did

Configured by ``conf/eagle.yaml`` (the ``model`` group of ``run.py`` and this tool's keys, typed by
:class:`EagleTrainConfig`); a bad key or value fails in one line naming it, before torch loads.

The text is the Python standard library's code and docstrings (``experiments/tools/distill.py``: no
benchmark item is drawn from it), cut in 256-token chunks; the base's features (last hidden states
after its final norm) and its argmax at every position are cached once, outside the repository.

Method (EAGLE-1, self-distilled): the base is frozen; the drafter (``lookahead_core/eagle.py``: fc
and one decoder layer of the base's architecture on the base's embeddings and LM head) reads each
chunk's tokens with the base's features one position behind and predicts the next feature. Loss:
SmoothL1 between predicted and true features, plus ``ce_weight`` (0.1, as EAGLE) times the
cross-entropy of the base's LM head on the predicted features against the base's own argmax (what
greedy decoding will verify), on ``ce_positions`` positions of each batch; with ``draft_vocab`` the
head scores only the training text's most frequent tokens (a target outside them scores nothing;
``draft_vocab_coverage``: the share of held-out targets inside). 5% of the chunks are held
out: their *chain acceptance per depth* (``acceptance``, in ``config.json`` and the curve) is the
share of positions where the drafter's top token equals the base's argmax at depths 1..``depth``
in a row, each depth reading the features the depth before predicted (EAGLE's drafting, on the
text's tokens). Every stage resumes: shards already cached are kept, and training restarts from
its last checkpoint.

The drafter goes to ``<model.cache_dir or $LOOKAHEAD_CACHE>/eagle/<model.name>`` (default
``~/.cache/lookahead_bench``) in EAGLE's published layout, where ``decoding=eagle`` finds it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.config.errors import ConfigError
from experiments.config.schema import ModelConfig
from experiments.config.settings import check_packages
from experiments.data.datasets import repo_root
from experiments.tools import app
from experiments.tools.distill import CHUNK, Checkpoint, distil, write_curve


@dataclass
class EagleTrainConfig:
    """``conf/eagle.yaml``: the base model (``model``, the harness's group) and the training."""

    model: ModelConfig = field(default_factory=ModelConfig)
    out: Optional[str] = None              # the drafter's folder; None: the cache's, keyed by model.name
    show: bool = False                     # print where the drafter is and how it did; train nothing
    tokens: int = 120_000                  # corpus tokens (half code, half prose)
    steps: int = 1000
    batch: int = 4                         # chunks per step (CHUNK - 1 positions each)
    ce_positions: int = 256                # positions per step scored by the LM head's cross-entropy
    ce_weight: float = 0.1
    lr: float = 3e-4
    depth: int = 4                         # held-out chain acceptance measured to this depth
    draft_vocab: int = 0                   # the head's vocabulary: this many of the training text's most
                                           # frequent tokens (0: all of the base's)
    eval_every: int = 50                   # held-out evaluation and checkpoint every this many steps
    seed: int = 0
    threads: Optional[int] = None          # torch.set_num_threads; None keeps torch's default
    device: str = "cpu"


ConfigStore.instance().store(name="eagle_schema", node=EagleTrainConfig)


def check(cfg: DictConfig) -> EagleTrainConfig:
    """The composed config as a :class:`EagleTrainConfig`; a value out of range (or a model whose
    packages are missing) is a ConfigError naming its key."""
    s = OmegaConf.to_object(cfg)
    app.at_least_one(s, "tokens", "steps", "batch", "ce_positions", "depth", "eval_every")
    app.positive(s, "lr", "ce_weight")
    if s.draft_vocab < 0:
        raise ConfigError(f"draft_vocab: must be 0 (the whole vocabulary) or more, got {s.draft_vocab}")
    if s.depth >= CHUNK - 1:
        raise ConfigError(f"depth: must be below the chunk length {CHUNK - 1}, got {s.depth}")
    app.at_least_one_or_null(s, "threads")
    check_packages(s.model)
    app.stock_kernel(s.model, "drafter training")
    return s


def drafter_folder(s: EagleTrainConfig) -> Path:
    from experiments.models.heads import heads_dir   # the loader's cache root: imports torch

    return Path(s.out).expanduser() if s.out else heads_dir(s.model.name, s.model.cache_dir, kind="eagle")


def losses(drafter, tokens, hidden, argmax, chunks, s: EagleTrainConfig, generator):
    """(feature loss, token loss) of one batch: ``chunks`` (B,) rows of the cached corpus."""
    import torch

    device = drafter.fc.weight.device
    ids = tokens[chunks].to(device)
    features = hidden[chunks].to(device).float()
    predicted = drafter.forward_train(ids[:, 1:], features[:, :-1])              # (B, T-1, H)
    feature_loss = torch.nn.functional.smooth_l1_loss(predicted, features[:, 1:])
    flat = predicted.reshape(-1, predicted.shape[-1])
    pick = torch.randint(len(flat), (min(s.ce_positions, len(flat)),), generator=generator).to(device)
    targets = argmax[chunks][:, 1:].reshape(-1).to(device)[pick]
    if drafter.vocab is not None:           # a target outside the draft vocabulary scores nothing
        index = torch.full((drafter.lm_head.weight.shape[0],), -100, dtype=torch.long, device=device)
        index[drafter.vocab] = torch.arange(len(drafter.vocab), device=device)
        targets = index[targets]
    token_loss = torch.nn.functional.nll_loss(drafter.log_probs(flat[pick]), targets, ignore_index=-100)
    return feature_loss, token_loss


def chain_acceptance(drafter, tokens, hidden, argmax, chunks, depth: int) -> list[float]:
    """Per depth d = 1..``depth``: the share of start positions where the drafter's top token equals
    the base's argmax at depths 1..d in a row, depth d reading the features depth d - 1 predicted."""
    import torch

    device = drafter.fc.weight.device
    ok_total = torch.zeros(depth)
    starts = 0
    with torch.inference_mode():
        for c in chunks.split(8):
            ids, features = tokens[c].to(device), hidden[c].to(device).float()
            steps = ids.shape[1] - depth                                   # starts with `depth` positions ahead
            inputs, running = features[:, :-1], torch.ones(len(c), steps, dtype=torch.bool, device=device)
            for d in range(depth):
                predicted = drafter.forward_train(ids[:, 1 + d:], inputs)          # feature at position t + 1 + d
                top = drafter.token_ids(drafter.log_probs(predicted[:, :steps]).argmax(-1))
                running &= top == argmax[c][:, 1 + d:1 + d + steps].to(device)
                ok_total[d] += running.sum().item()
                inputs = predicted[:, :-1]
            starts += len(c) * steps
    return (ok_total / max(starts, 1)).tolist()


def train(s: EagleTrainConfig) -> Path:
    import torch
    from tqdm import tqdm

    from lookahead_core.eagle import EagleDrafter, save_drafter

    out = drafter_folder(s)
    base = distil(s.model, s.tokens, s.seed, out / "work", s.device, s.threads)
    model, tokens, hidden, argmax, g = base.model, base.tokens, base.hidden, base.argmax, base.generator
    train_chunks, eval_chunks = base.train_chunks, base.eval_chunks
    vocab, coverage = None, 1.0
    if s.draft_vocab:                       # the training text's most frequent tokens
        counts = torch.bincount(tokens[train_chunks].flatten(), minlength=model.config.vocab_size)
        vocab = counts.argsort(descending=True)[:s.draft_vocab].sort().values
        inside = torch.zeros(model.config.vocab_size, dtype=torch.bool)
        inside[vocab] = True
        coverage = float(inside[argmax[eval_chunks]].float().mean())     # held-out targets it can name
    torch.manual_seed(s.seed)
    drafter = EagleDrafter(model, vocab=vocab).float()
    drafter.train()
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=s.lr, weight_decay=0.0)
    state = Checkpoint(base.work / "train_state.pt",
                       {**base.key, "lr": s.lr, "batch": s.batch, "ce_weight": s.ce_weight,
                        "ce_positions": s.ce_positions, "draft_vocab": s.draft_vocab},
                       {"fc": drafter.fc, "layer": drafter.layer, "optimizer": optimizer}, drafter.fc.weight.device)
    step, seconds, curve = state.resume(s.steps, g)
    acceptance = None
    bar = tqdm(total=s.steps, initial=step, desc=f"eagle drafter ({s.model.name})", unit="step")
    while step < s.steps:
        t = time.perf_counter()
        batch = train_chunks[torch.randint(len(train_chunks), (s.batch,), generator=g)]
        feature_loss, token_loss = losses(drafter, tokens, hidden, argmax, batch, s, g)
        optimizer.zero_grad()
        (feature_loss + s.ce_weight * token_loss).backward()
        optimizer.step()
        step += 1
        seconds += time.perf_counter() - t
        row = {"step": step, "seconds": round(seconds, 1), "feature_loss": round(float(feature_loss.detach()), 5),
               "token_loss": round(float(token_loss.detach()), 4)}
        checkpoint = step % s.eval_every == 0 or step == s.steps     # the last step always is one
        if checkpoint:
            drafter.eval()
            acceptance = chain_acceptance(drafter, tokens, hidden, argmax, eval_chunks, s.depth)
            drafter.train()
            row.update({f"heldout_accept_{d + 1}": round(a, 4) for d, a in enumerate(acceptance)})
        curve.append(row)
        bar.update(1)
        bar.set_postfix(feature=f"{row['feature_loss']:.3f}", token=f"{row['token_loss']:.2f}")
        if checkpoint:
            state.save(step, seconds, curve, g)
    bar.close()
    drafter.eval()
    if acceptance is None:                         # resumed after the last step: nothing evaluated yet
        acceptance = chain_acceptance(drafter, tokens, hidden, argmax, eval_chunks, s.depth)
    training = {**base.record, "targets": "the base's next feature and argmax (self-distillation)",
                "held_out_chunks": len(eval_chunks), "steps": s.steps, "batch": s.batch, "lr": s.lr, "ce_weight": s.ce_weight,
                "ce_positions": s.ce_positions, "draft_vocab": s.draft_vocab or model.config.vocab_size,
                "draft_vocab_coverage": round(coverage, 4), "train_seconds": round(seconds, 1),
                "hidden_cache_seconds": round(base.cache_seconds, 1), "threads": torch.get_num_threads(),
                "acceptance": [round(a, 4) for a in acceptance], "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    save_drafter(drafter.to(model.dtype), out, training=training)
    write_curve(curve, out / "curve.csv")
    plot_curve(curve, out / "curve.png", f"EAGLE drafter, {s.model.name}")
    print(f"drafter saved to {out}; held-out chain acceptance per depth: {[round(a, 3) for a in acceptance]}")
    return out


def plot_curve(curve: list[dict], path: Path, title: str) -> Path:
    """The two training losses (20-step means) and the held-out chain acceptance per depth, against steps."""
    import pandas as pd
    from matplotlib.figure import Figure

    df = pd.DataFrame(curve)
    fig = Figure(figsize=(10, 4))
    loss_ax, acc_ax = fig.subplots(1, 2)
    loss_ax.plot(df["step"], df["feature_loss"].rolling(20, min_periods=1).mean(), label="feature (SmoothL1)")
    loss_ax.plot(df["step"], df["token_loss"].rolling(20, min_periods=1).mean(), label="token (cross-entropy)")
    loss_ax.set(xlabel="step", ylabel="loss (train, 20-step mean)", yscale="log", title=f"{title}: loss")
    for column in sorted(c for c in df if c.startswith("heldout_accept_")):
        held = df.dropna(subset=[column])
        acc_ax.plot(held["step"], held[column], marker="o", label=f"depth {column.rsplit('_', 1)[1]}")
    acc_ax.set(xlabel="step", ylabel="held-out chain acceptance", title=f"{title}: acceptance per depth")
    loss_ax.legend(), acc_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def show(s: EagleTrainConfig) -> None:
    from experiments.models.heads import train_command

    folder = drafter_folder(s)
    config = folder / "config.json"
    if not config.is_file():
        raise SystemExit(f"no EAGLE drafter for {s.model.name} at {folder}; train one with "
                         f"`{train_command(s.model.name, 'eagle')}`")
    training = json.loads(config.read_text()).get("training", {})
    print(folder)
    print(json.dumps(training, indent=1))


@hydra.main(config_path=str(repo_root() / "conf"), config_name="eagle", version_base="1.3")
def main(cfg: DictConfig) -> None:
    s = app.checked(cfg, check)
    show(s) if s.show else train(s)


if __name__ == "__main__":
    app.launch("eagle", main, check)

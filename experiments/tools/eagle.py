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
from experiments.tools.distill import CHUNK, HELD_OUT, cache_hidden, corpus_chunks, load_hidden, write_curve


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
    for key in ("lr", "ce_weight"):
        if not getattr(s, key) > 0:
            raise ConfigError(f"{key}: must be positive, got {getattr(s, key)}")
    if s.draft_vocab < 0:
        raise ConfigError(f"draft_vocab: must be 0 (the whole vocabulary) or more, got {s.draft_vocab}")
    if s.depth >= CHUNK - 1:
        raise ConfigError(f"depth: must be below the chunk length {CHUNK - 1}, got {s.depth}")
    if s.threads is not None and s.threads < 1:
        raise ConfigError(f"threads: must be at least 1 or null, got {s.threads}")
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

    from experiments.models.loader import load_model
    from lookahead_core.eagle import EagleDrafter, save_drafter

    if s.threads:
        torch.set_num_threads(s.threads)
    out = drafter_folder(s)
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    model, tokenizer = load_model(s.model.spec, dtype="float32", device=s.device, cache_dir=s.model.cache_dir)
    if tokenizer is None:                           # the tiny random test models ship none
        from experiments.models.tiny_tokenizer import ByteTokenizer
        tokenizer = ByteTokenizer(model.config.vocab_size)
    for p in model.parameters():
        p.requires_grad_(False)
    chunks, record = corpus_chunks(tokenizer, s.tokens, s.seed)
    if len(chunks) < 20:
        raise SystemExit(f"the corpus gave {len(chunks)} chunks of {CHUNK} tokens: ask for more tokens (tokens=)")
    key = {"model": s.model.name, **{k: record[k] for k in ("corpus", "python", "seed", "tokens")}}
    hidden_dir = work / ("hidden_" + "_".join(f"{v}" for v in key.values()).replace("/", "-"))
    cache_seconds = cache_hidden(model, chunks, hidden_dir)
    hidden, argmax = load_hidden(hidden_dir)
    tokens = torch.tensor(chunks)
    n_eval = max(1, int(len(chunks) * HELD_OUT))
    g = torch.Generator().manual_seed(s.seed)
    order = torch.randperm(len(chunks), generator=g)
    train_chunks, eval_chunks = order[n_eval:], order[:n_eval]

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
    state_path = work / "train_state.pt"
    state_key = {**key, "lr": s.lr, "batch": s.batch, "ce_weight": s.ce_weight, "ce_positions": s.ce_positions,
                 "draft_vocab": s.draft_vocab}
    step, seconds, curve, acceptance = 0, 0.0, [], None
    if state_path.is_file():
        saved = torch.load(state_path, weights_only=False, map_location=drafter.fc.weight.device)
        if saved["key"] == state_key:
            drafter.fc.load_state_dict(saved["fc"])
            drafter.layer.load_state_dict(saved["layer"])
            optimizer.load_state_dict(saved["optimizer"])
            step, seconds, curve = saved["step"], saved["seconds"], saved["curve"]
            g.set_state(saved["generator"])
            print(f"resuming at step {step} of {s.steps}")
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
            tmp = state_path.with_suffix(".tmp")
            torch.save({"key": state_key, "fc": drafter.fc.state_dict(), "layer": drafter.layer.state_dict(),
                        "optimizer": optimizer.state_dict(), "step": step, "seconds": seconds, "curve": curve,
                        "generator": g.get_state()}, tmp)
            tmp.rename(state_path)
    bar.close()
    drafter.eval()
    if acceptance is None:                         # resumed after the last step: nothing evaluated yet
        acceptance = chain_acceptance(drafter, tokens, hidden, argmax, eval_chunks, s.depth)
    training = {**record, "targets": "the base's next feature and argmax (self-distillation)",
                "held_out_chunks": n_eval, "steps": s.steps, "batch": s.batch, "lr": s.lr, "ce_weight": s.ce_weight,
                "ce_positions": s.ce_positions, "draft_vocab": s.draft_vocab or model.config.vocab_size,
                "draft_vocab_coverage": round(coverage, 4), "train_seconds": round(seconds, 1),
                "hidden_cache_seconds": round(cache_seconds, 1), "threads": torch.get_num_threads(),
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

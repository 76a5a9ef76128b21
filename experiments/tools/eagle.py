"""Train an EAGLE drafter for a model the harness runs, on text no evaluated item contains.

    python -m experiments.tools.eagle                                         # SmolLM2-135M, EAGLE-3
    python -m experiments.tools.eagle model=qwen25_coder_05b tokens=60000 steps=600 draft_vocab=8192
    python -m experiments.tools.eagle version=1                               # EAGLE-1/2's recipe
    python -m experiments.tools.eagle model=smollm2_135m show=true            # where it is, how it did

Configured by ``conf/eagle.yaml`` (the ``model`` group of ``run.py`` and this tool's keys, typed by
:class:`EagleTrainConfig`); a bad key or value fails in one line naming it, before torch loads.

The text (``experiments/tools/distill.py``, no benchmark item drawn from it): ``answers`` of it the
base's own greedy answers to requests drawn from the Python standard library's docstrings, the rest
the standard library's code and docstrings, cut in 256-token chunks. The base's hidden states
(the last, after its final norm, and for EAGLE-3 those after the fused layers) and its argmax at
every position are cached once, outside the repository.

Method, the base frozen, its argmax the target (self-distillation: what greedy decoding verifies):

* ``version=3`` (EAGLE-3, ``lookahead_core.eagle.Eagle3Drafter``): the training-time test unrolls
  ``ttt`` draft steps as the tree runs them (:func:`rollout`); the loss is the cross-entropy at every
  step, step k weighted 0.8^k, on ``ce_positions`` positions per step. Its head and final norm start
  as the base's (the draft vocabulary's rows).
* ``version=1`` (EAGLE-1/2, ``EagleDrafter``): teacher-forced; SmoothL1 between predicted and true
  next features plus ``ce_weight`` (0.1) times the token cross-entropy.

With ``draft_vocab`` the head scores only the training text's most frequent tokens (a target outside
them scores nothing; ``draft_vocab_coverage``: the share of held-out targets inside). 5% of the
chunks are held out: their *chain acceptance per depth* (``acceptance``, in ``config.json`` and the
curve) is the share of start positions where the drafter's top token equals the base's argmax at
depths 1..``depth`` in a row, drafted as the tree drafts. Every stage resumes: the answers
generated so far, the feature shards, and training from its last checkpoint.

The drafter goes to ``<model.cache_dir or $LOOKAHEAD_CACHE>/eagle/<model.name>`` (default
``~/.cache/lookahead_bench``) in EAGLE's published layout, where ``decoding=eagle`` finds it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.config.errors import ConfigError
from experiments.data.datasets import repo_root
from experiments.tools import app
from experiments.tools.distill import CHUNK, Checkpoint, distil, write_curve


@dataclass
class EagleTrainConfig(app.Training):
    """``conf/eagle.yaml``: the base model and the run (:class:`app.Training`), and EAGLE's training."""

    version: int = 3                       # 3: EAGLE-3 (fused layers, own head, training-time test);
                                           # 1: EAGLE-1/2 (the last layer's feature, feature + token loss)
    ttt: int = 7                           # EAGLE-3: draft steps unrolled in training (its training-time test)
    layer_ids: Optional[list[int]] = None  # EAGLE-3: the base's layers fused; None: 1, L/2 - 1, L - 4
    answers: float = 0.5                   # the corpus's share that is the base's own greedy answers to
                                           # requests drawn from the standard library's docstrings (the
                                           # rest: its code and docstrings, half each)
    batch: int = 4                         # chunks per step (CHUNK - 1 positions each)
    ce_positions: int = 256                # positions per step scored by the LM head's cross-entropy
    ce_weight: float = 0.1
    lr: float = 3e-4
    depth: int = 4                         # held-out chain acceptance measured to this depth
    draft_vocab: int = 0                   # the head's vocabulary: this many of the training text's most
                                           # frequent tokens (0: all of the base's)


ConfigStore.instance().store(name="eagle_schema", node=EagleTrainConfig)


def check(cfg: DictConfig) -> EagleTrainConfig:
    """The composed config as a :class:`EagleTrainConfig`; a value out of range (or a model whose
    packages are missing) is a ConfigError naming its key."""
    s = OmegaConf.to_object(cfg)
    app.check_training(s, "drafter training")
    app.at_least_one(s, "batch", "ce_positions", "depth", "ttt")
    app.positive(s, "lr", "ce_weight")
    if s.draft_vocab < 0:
        raise ConfigError(f"draft_vocab: must be 0 (the whole vocabulary) or more, got {s.draft_vocab}")
    if not 0 <= s.answers < 1:
        raise ConfigError(f"answers: a share of the corpus in [0, 1), got {s.answers}")
    if s.version not in (1, 3):
        raise ConfigError(f"version: 1 (EAGLE-1/2) or 3 (EAGLE-3), got {s.version}")
    if s.version == 1 and s.layer_ids is not None:
        raise ConfigError("layer_ids: EAGLE-1/2 reads the last layer only; set version=3 to fuse layers")
    if s.layer_ids is not None and (not s.layer_ids or min(s.layer_ids) < 0):
        raise ConfigError(f"layer_ids: decoder layer indices (0 or more), got {s.layer_ids}")
    if max(s.depth, s.ttt) >= CHUNK - 1:
        raise ConfigError(f"{'depth' if s.depth >= s.ttt else 'ttt'}: must be below the chunk length {CHUNK - 1}, "
                          f"got {max(s.depth, s.ttt)}")
    return s


def drafter_folder(s: EagleTrainConfig) -> Path:
    from experiments.models.heads import heads_dir   # the loader's cache root: imports torch

    return Path(s.out).expanduser() if s.out else heads_dir(s.model.name, s.model.cache_dir, kind="eagle")


def losses(drafter, tokens, hidden, argmax, chunks, s: EagleTrainConfig, generator):
    """EAGLE-1's (feature loss, token loss) of one batch: ``chunks`` (B,) rows of the cached corpus."""
    import torch

    device = drafter.fc.weight.device
    ids = tokens[chunks].to(device)
    features = hidden[chunks].to(device).float()
    predicted = drafter.forward_train(ids[:, 1:], features[:, :-1])              # (B, T-1, H)
    feature_loss = torch.nn.functional.smooth_l1_loss(predicted, features[:, 1:])
    flat = predicted.reshape(-1, predicted.shape[-1])
    pick = torch.randint(len(flat), (min(s.ce_positions, len(flat)),), generator=generator).to(device)
    targets = draft_targets(drafter, argmax[chunks][:, 1:].reshape(-1).to(device)[pick])
    token_loss = torch.nn.functional.nll_loss(drafter.log_probs(flat[pick]), targets, ignore_index=-100)
    return feature_loss, token_loss


def rollout(drafter, ids, features, depth: int):
    """The drafter's outputs (B, T - 1, H) at draft steps k = 0..``depth`` - 1, run as drafting runs
    them, for every start position t of the chunks ``ids`` (B, T) at once: step 0 reads token t + 1
    with the base's features at t (``features``: the cached layers), step k token t + 1 + k with
    its own output of step k - 1, at position t + k, seeing the text's keys up to t and its own
    chain's (EAGLE-3's training-time test; the text's tokens are fed, the base's are the targets)."""
    import torch
    from transformers import DynamicCache

    steps = ids.shape[1] - 1
    padded = torch.cat([ids, ids.new_zeros(ids.shape[0], depth)], 1)
    causal = torch.ones(steps, steps, dtype=torch.bool, device=ids.device).tril()
    own = torch.eye(steps, dtype=torch.bool, device=ids.device)
    positions = torch.arange(steps, device=ids.device)[None]
    cache, hidden = DynamicCache(), drafter.from_base(features[:, :-1])
    for k in range(depth):
        hidden = drafter(padded[:, 1 + k:1 + k + steps], hidden, positions + k, torch.cat([causal] + [own] * k, 1)[None],
                         cache)
        yield hidden


def draft_targets(drafter, argmax):
    """The base's argmax as draft-vocabulary indices (-100: outside it, scoring nothing)."""
    import torch

    if drafter.vocab is None:
        return argmax
    size = max(int(argmax.max()), int(drafter.vocab.max())) + 1
    index = torch.full((size,), -100, dtype=torch.long, device=argmax.device)
    index[drafter.vocab] = torch.arange(len(drafter.vocab), device=argmax.device)
    return index[argmax]


def ttt_loss(drafter, tokens, hidden, argmax, chunks, s: EagleTrainConfig, generator):
    """EAGLE-3's loss of one batch: the cross-entropy against the base's argmax at each of ``ttt``
    unrolled draft steps, step k weighted 0.8^k, on ``ce_positions`` start positions per step."""
    import torch

    device = drafter.device
    ids, features = tokens[chunks].to(device), hidden[chunks].to(device).float()
    targets = draft_targets(drafter, argmax[chunks].to(device))
    total, weights = 0.0, 0.0
    for k, out in enumerate(rollout(drafter, ids, features, s.ttt)):
        valid = out.shape[1] - k                                  # start positions whose target is in the chunk
        flat = out[:, :valid].reshape(-1, out.shape[-1])
        pick = torch.randint(len(flat), (min(s.ce_positions, len(flat)),), generator=generator).to(device)
        aimed = targets[:, 1 + k:1 + k + valid].reshape(-1)[pick]
        total = total + 0.8 ** k * torch.nn.functional.nll_loss(drafter.log_probs(flat[pick]), aimed, ignore_index=-100)
        weights += 0.8 ** k
    return total / weights


def chain_acceptance(drafter, tokens, hidden, argmax, chunks, depth: int) -> list[float]:
    """Per depth d = 1..``depth``: the share of start positions where the drafter's top token equals
    the base's argmax at depths 1..d in a row, drafted as :func:`rollout` runs it."""
    import torch

    device = drafter.device
    ok_total = torch.zeros(depth)
    starts = 0
    with torch.inference_mode():
        for c in chunks.split(8):
            ids, features = tokens[c].to(device), hidden[c].to(device).float()
            steps = ids.shape[1] - depth                                   # starts with `depth` positions ahead
            running = torch.ones(len(c), steps, dtype=torch.bool, device=device)
            for d, out in enumerate(rollout(drafter, ids, features, depth)):
                top = drafter.token_ids(drafter.log_probs(out[:, :steps]).argmax(-1))
                running &= top == argmax[c][:, 1 + d:1 + d + steps].to(device)
                ok_total[d] += running.sum().item()
            starts += len(c) * steps
    return (ok_total / max(starts, 1)).tolist()


def train(s: EagleTrainConfig) -> Path:
    import torch
    from tqdm import tqdm

    from lookahead_core import eagle

    out = drafter_folder(s)
    layer_ids = (lambda m: tuple(s.layer_ids)) if s.layer_ids is not None else eagle.default_layer_ids
    layers = (-1,) if s.version == 1 else (lambda m: (-1, *eagle.outputs_in_hidden_states(layer_ids(m))))
    base = distil(s.model, s.tokens, s.seed, out / "work", s.device, s.threads, layers, s.answers)
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
    if s.version == 1:
        drafter = eagle.EagleDrafter(model, vocab=vocab).float()
    else:
        drafter = eagle.Eagle3Drafter(model, eagle.eagle3_config(model, s.draft_vocab or None), layer_ids(model),
                                      vocab=vocab).float()
        start_from_the_base(drafter, model)
    drafter.train()
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=s.lr, weight_decay=0.0)
    state = Checkpoint(base.work / f"train_state_v{s.version}.pt",
                       {**base.key, "lr": s.lr, "batch": s.batch, "ce_weight": s.ce_weight, "ttt": s.ttt,
                        "ce_positions": s.ce_positions, "draft_vocab": s.draft_vocab},
                       {"drafter": drafter, "optimizer": optimizer}, drafter.device)
    step, seconds, curve = state.resume(s.steps, g)
    acceptance = None
    bar = tqdm(total=s.steps, initial=step, desc=f"EAGLE-{s.version} drafter ({s.model.name})", unit="step")
    while step < s.steps:
        t = time.perf_counter()
        batch = train_chunks[torch.randint(len(train_chunks), (s.batch,), generator=g)]
        if s.version == 1:
            feature_loss, token_loss = losses(drafter, tokens, hidden, argmax, batch, s, g)
            loss = feature_loss + s.ce_weight * token_loss
        else:
            feature_loss, token_loss = None, ttt_loss(drafter, tokens, hidden, argmax, batch, s, g)
            loss = token_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        seconds += time.perf_counter() - t
        row = {"step": step, "seconds": round(seconds, 1), "token_loss": round(float(token_loss.detach()), 4)}
        if feature_loss is not None:
            row["feature_loss"] = round(float(feature_loss.detach()), 5)
        checkpoint = step % s.eval_every == 0 or step == s.steps     # the last step always is one
        if checkpoint:
            drafter.eval()
            acceptance = chain_acceptance(drafter, tokens, hidden, argmax, eval_chunks, s.depth)
            drafter.train()
            row.update({f"heldout_accept_{d + 1}": round(a, 4) for d, a in enumerate(acceptance)})
        curve.append(row)
        bar.update(1)
        bar.set_postfix(token=f"{row['token_loss']:.2f}")
        if checkpoint:
            state.save(step, seconds, curve, g)
    bar.close()
    drafter.eval()
    if acceptance is None:                         # resumed after the last step: nothing evaluated yet
        acceptance = chain_acceptance(drafter, tokens, hidden, argmax, eval_chunks, s.depth)
    recipe = ({"version": 1, "targets": "the base's next feature and argmax (self-distillation)"} if s.version == 1 else
              {"version": 3, "targets": "the base's argmax at each unrolled draft step (self-distillation)",
               "ttt": s.ttt, "layer_ids": list(drafter.layer_ids)})
    training = {**base.record, **recipe,
                "held_out_chunks": len(eval_chunks), "steps": s.steps, "batch": s.batch, "lr": s.lr, "ce_weight": s.ce_weight,
                "ce_positions": s.ce_positions, "draft_vocab": s.draft_vocab or model.config.vocab_size,
                "draft_vocab_coverage": round(coverage, 4), "train_seconds": round(seconds, 1),
                "hidden_cache_seconds": round(base.cache_seconds, 1), "threads": torch.get_num_threads(),
                "acceptance": [round(a, 4) for a in acceptance], "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    eagle.save_drafter(drafter.to(model.dtype), out, training=training)
    write_curve(curve, out / "curve.csv")
    plot_curve(curve, out / "curve.png", f"EAGLE-{s.version} drafter, {s.model.name}")
    print(f"drafter saved to {out}; held-out chain acceptance per depth: {[round(a, 3) for a in acceptance]}")
    return out


def plot_curve(curve: list[dict], path: Path, title: str) -> Path:
    """The two training losses (20-step means) and the held-out chain acceptance per depth, against steps."""
    import pandas as pd
    from matplotlib.figure import Figure

    df = pd.DataFrame(curve)
    fig = Figure(figsize=(10, 4))
    loss_ax, acc_ax = fig.subplots(1, 2)
    if "feature_loss" in df:
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


def start_from_the_base(drafter, model) -> None:
    """An EAGLE-3 drafter's head and final norm start as the base's own (its head's rows of the draft
    vocabulary), where the shapes agree: it then starts near the base's own prediction."""
    import torch

    head = model.get_output_embeddings().weight
    rows = head if drafter.vocab is None else head[drafter.vocab.to(head.device)]
    norm = getattr(model.get_decoder(), "norm", None)
    with torch.no_grad():
        drafter.lm_head.weight.copy_(rows)
        if getattr(norm, "weight", None) is not None and norm.weight.shape == drafter.norm.weight.shape:
            drafter.norm.weight.copy_(norm.weight)


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

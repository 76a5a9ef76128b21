"""Medusa-1 heads (Cai et al., 2024) as a draft source of the token tree.

K heads sit on the base model's last hidden state (after its final norm). Head k (1-based) is a
residual block ``x + SiLU(W x + b)`` (``layers`` of them) followed by an LM head, and predicts the
token k + 1 positions after the hidden state's own: at the row whose logits give the step's last
committed token t, the base predicts t (the next step's input token) and head k the token k places
after it. Each step's tree is then the heads' top-k tokens per depth combined along a fixed set of
(depth, rank) paths, :func:`medusa_tree` (Medusa's "sparse tree": the paths with the highest
product of per-(head, rank) accuracies). The base model verifies the tree like any other draft,
so the output is token-identical to greedy decoding whatever the heads propose.

LM heads: a published checkpoint (FasterDecoding's format, :func:`load_heads`) either gives each
head an LM head of its own (``{k}.{layers}.weight`` in the state dict, initialised from the base's
before training) or none (their first release), in which case the base's own output embedding is
shared. The heads this project trains (``experiments/tools/medusa.py``) share the base's: only the
residual blocks are trained (hidden^2 + hidden parameters a head), which is what makes training
on a CPU possible and keeps the saved heads small.

Format (what ``load_heads`` reads and ``save_heads`` writes), a directory holding
  * ``config.json``: ``medusa_num_heads``, ``medusa_num_layers``, ``base_model_name_or_path``, and
    where known ``hidden_size``, ``vocab_size`` (checked against the base), plus this project's
    ``accuracy`` (per head, top-k accuracy per rank on held-out text: the tree's prior) and
    ``training`` (what the heads were trained on);
  * ``medusa_lm_head.safetensors`` or ``medusa_lm_head.pt``: the ``ModuleList`` state dict, keys
    ``{k}.{j}.linear.weight`` / ``.bias`` (residual block j of head k) and ``{k}.{layers}.weight``
    (its own LM head, if any).
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from .layout import Draft

CONFIG_FILE = "config.json"
WEIGHT_FILES = ("medusa_lm_head.safetensors", "medusa_lm_head.pt")
TOP_RANKS = 10                   # ranks per head the tree may use (and the accuracy table covers)


class ResBlock(nn.Module):
    """``x + SiLU(W x + b)``, W starting at zero (the block starts as the identity)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class MedusaHeads(nn.Module):
    """K Medusa-1 heads. ``heads`` is the FasterDecoding ``ModuleList`` (its state dict is the file
    format); ``lm_head`` is the base's output embedding when the heads share it (not a parameter
    of the heads: never saved, never trained).

    ``accuracy[k][r]``: how often head k+1's rank-r token was the right one on held-out text (the
    tree's prior; a flat guess when unknown).
    """

    def __init__(self, hidden_size: int, vocab_size: int, num_heads: int, num_layers: int = 1, *,
                 lm_head: nn.Module | None = None, base_model: str = "", accuracy: Sequence[Sequence[float]] = (),
                 training: dict | None = None) -> None:
        super().__init__()
        if num_heads < 1 or num_layers < 0:
            raise ValueError(f"Medusa needs num_heads >= 1 and num_layers >= 0, got {num_heads}, {num_layers}")
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        self.num_heads, self.num_layers = num_heads, num_layers
        self.base_model, self.training_record = base_model, dict(training or {})
        own = lm_head is None
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)],
                          *([nn.Linear(hidden_size, vocab_size, bias=False)] if own else []))
            for _ in range(num_heads))
        self._shared = [lm_head]          # a list: not registered as a submodule (never saved or trained)
        self.accuracy = [list(map(float, a)) for a in accuracy] or default_accuracy(num_heads)

    @property
    def shares_lm_head(self) -> bool:
        return self._shared[0] is not None

    def head_logits(self, k: int, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) last hidden states -> (..., V) logits of head k (0-based)."""
        out = self.heads[k](hidden)
        shared = self._shared[0]
        return out if shared is None else shared(out)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) last hidden states -> (K, ..., V) logits of the K heads."""
        return torch.stack([self.head_logits(k, hidden) for k in range(self.num_heads)])

    @torch.inference_mode()
    def top_tokens(self, hidden: torch.Tensor, k: int, heads: int | None = None) -> list[list[int]]:
        """(H,) one hidden state -> per head (the first ``heads``, default all) its ``k`` most likely
        tokens, best first: every head's read in one copy."""
        hidden = hidden.to(device=self.device, dtype=self.dtype)
        return torch.stack([self.head_logits(h, hidden) for h in range(heads or self.num_heads)]).topk(k).indices.tolist()

    @property
    def device(self) -> torch.device:
        return next(self.heads.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.heads.parameters()).dtype


def default_accuracy(num_heads: int) -> list[list[float]]:
    """The prior when none was measured: head k's rank-r token right with 0.6 ** k / (r + 1)."""
    return [[0.6 ** k / (r + 1) for r in range(TOP_RANKS)] for k in range(1, num_heads + 1)]


def for_model(model: nn.Module, num_heads: int, num_layers: int = 1, *, shared: bool = True,
              **kwargs) -> MedusaHeads:
    """Fresh heads for ``model`` (a transformers causal LM), on its device and dtype: own LM heads
    are initialised from the base's, as Medusa does before training."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    lm_head = model.get_output_embeddings()
    heads = MedusaHeads(config.hidden_size, lm_head.weight.shape[0], num_heads, num_layers,
                        lm_head=lm_head if shared else None,
                        base_model=getattr(config, "_name_or_path", "") or "", **kwargs)
    if not shared:
        for head in heads.heads:
            head[-1].weight.data.copy_(lm_head.weight.data)
    return heads.to(device=model.device, dtype=model.dtype)


def save_heads(heads: MedusaHeads, directory: str | Path) -> Path:
    """Writes ``config.json`` and ``medusa_lm_head.safetensors`` (the format :func:`load_heads` reads)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = {"medusa_num_heads": heads.num_heads, "medusa_num_layers": heads.num_layers,
              "base_model_name_or_path": heads.base_model, "hidden_size": heads.hidden_size,
              "vocab_size": heads.vocab_size, "shared_lm_head": heads.shares_lm_head,
              "accuracy": heads.accuracy, "training": heads.training_record}
    state = {k: v.detach().contiguous().cpu() for k, v in heads.heads.state_dict().items()}
    save_file(state, str(directory / WEIGHT_FILES[0]))
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=1) + "\n")
    return directory


def load_heads(directory: str | Path, model: nn.Module) -> MedusaHeads:
    """Medusa heads from ``directory`` (FasterDecoding's format, or :func:`save_heads`'s) for ``model``.

    Raises ``ValueError`` naming what does not fit: a missing file, a hidden size or vocabulary
    other than the base model's, weights of the wrong shape or keys the format does not have.
    """
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ValueError(f"no Medusa heads in {directory}: {CONFIG_FILE} is missing")
    config = json.loads(config_path.read_text())
    try:
        num_heads, num_layers = int(config["medusa_num_heads"]), int(config.get("medusa_num_layers", 1))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{config_path}: medusa_num_heads (and medusa_num_layers) must be ints: {error}") from error
    weights = next((directory / name for name in WEIGHT_FILES if (directory / name).is_file()), None)
    if weights is None:
        raise ValueError(f"no Medusa weights in {directory}: none of {', '.join(WEIGHT_FILES)}")
    if weights.suffix == ".safetensors":
        from safetensors.torch import load_file
        state = load_file(str(weights))
    else:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    base = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    lm_head = model.get_output_embeddings()
    hidden, vocab = base.hidden_size, lm_head.weight.shape[0]
    for key, want in (("hidden_size", hidden), ("vocab_size", vocab)):
        if key in config and int(config[key]) != want:
            raise ValueError(f"Medusa heads in {directory} were made for {key} {config[key]}, the base model has "
                             f"{want} (heads for {config.get('base_model_name_or_path') or 'another model'})")
    own = any(k.endswith(f".{num_layers}.weight") and k.count(".") == 2 for k in state)
    for key, tensor in state.items():
        if key.endswith(f".{num_layers}.weight") and tuple(tensor.shape) != (vocab, hidden):
            raise ValueError(f"Medusa heads in {directory}: {key} is {tuple(tensor.shape)}, the base model's LM "
                             f"head is {(vocab, hidden)} (heads for {config.get('base_model_name_or_path') or 'another model'})")
        if key.endswith("linear.weight") and tuple(tensor.shape) != (hidden, hidden):
            raise ValueError(f"Medusa heads in {directory}: {key} is {tuple(tensor.shape)}, the base model's hidden "
                             f"size is {hidden}")
    heads = MedusaHeads(hidden, vocab, num_heads, num_layers, lm_head=None if own else lm_head,
                        base_model=config.get("base_model_name_or_path", ""),
                        accuracy=config.get("accuracy") or (), training=config.get("training"))
    missing, unexpected = heads.heads.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"Medusa heads in {directory} do not match {num_heads} heads of {num_layers} layers: "
                         f"missing {sorted(missing)[:4]}, unexpected {sorted(unexpected)[:4]}")
    return heads.to(device=model.device, dtype=model.dtype)


def medusa_tree(accuracy: Sequence[Sequence[float]], size: int) -> list[tuple[int, ...]]:
    """The ``size`` (rank, rank, ...) paths with the highest estimated acceptance, parents first.

    A path (r1, .., rd) takes head 1's rank-r1 token, then head 2's rank-r2, ...; its estimate is
    the product of ``accuracy[k][r_k]`` along it. Paths are added best first, each after its parent
    (a prefix-closed set: every node's parent is in the tree), as Medusa builds its sparse trees.

    >>> medusa_tree([[0.6, 0.2], [0.5, 0.1]], 3)
    [(0,), (0, 0), (1,)]
    """
    chosen: list[tuple[int, ...]] = []
    frontier = [(-accuracy[0][0], (0,), 1.0)] if accuracy and accuracy[0] else []   # (-score, path, parent's)
    while frontier and len(chosen) < size:
        score, path, parent = heapq.heappop(frontier)
        chosen.append(path)
        depth, rank = len(path), path[-1]
        if rank + 1 < len(accuracy[depth - 1]):           # the next sibling
            heapq.heappush(frontier, (-parent * accuracy[depth - 1][rank + 1], path[:-1] + (rank + 1,), parent))
        if depth < len(accuracy) and accuracy[depth]:     # the first child
            heapq.heappush(frontier, (score * accuracy[depth][0], path + (0,), -score))
    return chosen


class MedusaSource:
    """The ``medusa`` draft source (registered in ``lookahead_core/sources.py``): drafts from Medusa
    heads, ``size`` tree nodes (:func:`medusa_tree`), tagged ``medusa:<rank>`` per depth (= head), so
    acceptance is measured per head and rank."""

    topk = 0

    def __init__(self, heads: MedusaHeads, size: int, depth: int) -> None:
        depth = min(depth, heads.num_heads)
        accuracy = [row[:min(TOP_RANKS, heads.vocab_size)] for row in heads.accuracy[:depth]]
        self.heads, self.paths = heads, medusa_tree(accuracy, size)
        self.ranks = 1 + max((max(p) for p in self.paths), default=0)
        self.depth = max((len(p) for p in self.paths), default=0)        # heads the tree uses
        parents = {p[:-1] for p in self.paths}
        self.leaves = [p for p in self.paths if p not in parents]
        self.top: list[list[int]] | None = None
        self.seconds = 0.0                 # in the heads' forwards (their tokens read back: the device has finished)

    @classmethod
    def from_config(cls, config, size: int, context, drafter: MedusaHeads) -> MedusaSource:
        return cls(drafter, size, config.draft_depth)

    def propose(self, context: Sequence[int]) -> list[Draft]:
        if self.top is None:
            return []
        return [Draft(tuple(self.top[d][r] for d, r in enumerate(path)), tuple(f"medusa:{r}" for r in path))
                for path in self.leaves]

    def update(self, outcome) -> None:
        if outcome.hidden is None or not self.depth:
            self.top = None
        else:
            start = time.perf_counter()
            self.top = self.heads.top_tokens(outcome.hidden, self.ranks, self.depth)
            self.seconds += time.perf_counter() - start

"""EAGLE drafters (Li et al., 2024: EAGLE-1 and EAGLE-2) as a draft source of the token tree.

The drafter is one decoder layer of the base model's own architecture. At position i it reads
``fc([embedding of token i+1 ; the base's feature at i])`` (2H -> H; the feature is the base's last
hidden state, after its final norm: what its LM head reads) and predicts the feature at i + 1,
whose token distribution the base's own LM head gives. The base's embeddings and LM head are
reused, frozen; the layer's first norm is dropped, as in EAGLE's published drafters (its input is
already a projection of normed features).

Each step (:class:`EagleSource`):

* ``update`` feeds the drafter the step's committed tokens with the base's features at the rows
  that predicted them (``StepOutcome.features``: every prompt row after the prefill, the input row
  and the accepted path's rows after a step), so the drafter's own KV cache holds exactly the
  committed text, and keeps its last output: the predicted feature of the next position;
* ``propose`` grows a tree from there as EAGLE-2 does: each level feeds the ``width`` best nodes of
  the level above (by the product of the drafter's own probabilities along the path, which are well
  calibrated to acceptance), each node seeing the committed cache and its ancestors, and takes each
  one's top ``width`` children; after ``depth`` levels the ``size`` best nodes of the whole tree
  (a prefix-closed set: a node never scores above its parent) become the drafts. The tree's nodes
  then compete in the one token tree with every other source's (``Proposer``): each token is tagged
  ``eagle:p<d>``, d the decile of the drafter's probability for it, so the acceptance measured per
  tag and depth recalibrates it. The base verifies the tree like any other draft, so the output is
  token-identical to greedy decoding whatever the drafter proposes.

The tree's nodes enter the drafter's cache only while the tree grows: it is cut back to the
committed text before the next ``update``. Time in the drafter's forwards is counted apart
(``EagleSource.seconds``, summed into ``DecodeStats.draft_seconds``).

Format (EAGLE-1/2's published layout, SafeAILab/EAGLE; what :func:`load_drafter` reads and
:func:`save_drafter` writes), a directory holding
  * ``config.json``: the base architecture's config with ``num_hidden_layers: 1`` (``hidden_size``
    and ``vocab_size`` are checked against the base), ``bias`` (fc's), and this project's
    ``training`` record where it trained the drafter;
  * ``model.safetensors`` or ``pytorch_model.bin``: flat keys ``fc.weight`` (H x 2H), ``fc.bias``,
    ``layers.0.<the decoder layer's own names>`` (no ``input_layernorm``), and optionally
    ``embed_tokens.weight`` / ``lm_head.weight`` (copies of the base's, which the drafter uses
    itself: a copy that differs from the base's is refused). A drafter with a reduced draft
    vocabulary adds ``d2t`` (EAGLE-3's convention: the token of draft index i is i + d2t[i]) and
    ``draft_vocab_size`` in the config.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from .layout import Draft
from .model_io import truncate_kv

WIDTH = 8                       # nodes expanded per level, and children taken from each (EAGLE-2's top-k)
CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class EagleDrafter(nn.Module):
    """``fc`` (2H -> H) and one decoder layer of the base's architecture, on the base's embeddings
    and LM head (held by reference, not parameters of the drafter)."""

    def __init__(self, model: nn.Module, *, bias: bool = True, vocab: Sequence[int] | torch.Tensor | None = None) -> None:
        super().__init__()
        decoder = model.get_decoder()
        problem = _unserved(decoder)
        if problem is not None:
            raise ValueError(f"an EAGLE drafter is one decoder layer of the base's own architecture, with its "
                             f"rotary embedding; {type(model).__name__} {problem}")
        config = _one_layer(model.config)
        hidden = config.hidden_size
        self.config = config
        self.fc = nn.Linear(2 * hidden, hidden, bias=bias)
        self.layer = type(decoder.layers[0])(config, layer_idx=0)
        self.layer.input_layernorm = nn.Identity()
        self.rotary = type(decoder.rotary_emb)(config=config)
        self.base = [model]           # a list: the base is not a submodule (its weights are not the drafter's)
        # The draft vocabulary: the token ids its head scores (None: all of the base's). A reduced one
        # (the most frequent tokens of the training text) cuts the LM head's rows, the main cost of a
        # draft step on a small base with a large vocabulary.
        if vocab is not None:
            vocab = torch.as_tensor(vocab, dtype=torch.long)
            if vocab.ndim != 1 or not len(vocab) or len(set(vocab.tolist())) != len(vocab) \
                    or int(vocab.min()) < 0 or int(vocab.max()) >= config.vocab_size:
                raise ValueError(f"a draft vocabulary is distinct token ids below {config.vocab_size}")
        self.register_buffer("vocab", vocab, persistent=False)
        self._rows: tuple[int, torch.Tensor] | None = None
        self.to(device=model.device, dtype=model.dtype)

    @property
    def embed(self) -> nn.Module:
        return self.base[0].get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.base[0].get_output_embeddings()

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor, cache: DynamicCache) -> torch.Tensor:
        """Predicted features (q, H) of ``tokens`` (q,) read with ``features`` (q, H) at ``positions``
        (q,), after what ``cache`` holds; ``mask`` (q, cache length + q) bool: what each row sees."""
        inputs = self.fc(torch.cat([self.embed(tokens), features.to(self.fc.weight.dtype)], dim=-1))[None]
        position_ids = positions[None]
        additive = torch.zeros(mask.shape, dtype=inputs.dtype, device=inputs.device)
        additive.masked_fill_(~mask, torch.finfo(inputs.dtype).min)
        out = self.layer(inputs, attention_mask=additive[None, None], position_ids=position_ids, cache=cache,
                         use_cache=True, position_embeddings=self.rotary(inputs, position_ids))
        return (out[0] if isinstance(out, tuple) else out)[0]

    def forward_train(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Whole sequences at once, no cache (training): ``tokens`` (B, T) read with ``features``
        (B, T, H), position t seeing positions <= t; predicted features (B, T, H)."""
        inputs = self.fc(torch.cat([self.embed(tokens), features.to(self.fc.weight.dtype)], dim=-1))
        steps = tokens.shape[1]
        position_ids = torch.arange(steps, device=tokens.device)[None].expand(tokens.shape[0], -1)
        causal = torch.ones(steps, steps, dtype=torch.bool, device=tokens.device).tril()
        additive = torch.zeros(steps, steps, dtype=inputs.dtype, device=inputs.device)
        additive.masked_fill_(~causal, torch.finfo(inputs.dtype).min)
        out = self.layer(inputs, attention_mask=additive[None, None].expand(tokens.shape[0], 1, -1, -1),
                         position_ids=position_ids, use_cache=False,
                         position_embeddings=self.rotary(inputs, position_ids))
        return out[0] if isinstance(out, tuple) else out

    def log_probs(self, features: torch.Tensor) -> torch.Tensor:
        """(q, V') log-probabilities of the next token from predicted features (q, H), over the draft
        vocabulary (V' = its size; :meth:`token_ids` maps an index to its token)."""
        if self.vocab is None:
            return torch.log_softmax(self.lm_head(features).float(), dim=-1)
        weight = self.lm_head.weight
        if self._rows is None or self._rows[0] != weight.data_ptr():     # the head's rows, sliced once
            self._rows = (weight.data_ptr(), weight[self.vocab])
        logits = features.to(weight.dtype) @ self._rows[1].T
        bias = getattr(self.lm_head, "bias", None)
        if bias is not None:
            logits = logits + bias[self.vocab]
        return torch.log_softmax(logits.float(), dim=-1)

    def token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """The token ids of draft-vocabulary ``indices``."""
        return indices if self.vocab is None else self.vocab[indices]


def _unserved(decoder: nn.Module) -> str | None:
    """Why the drafter cannot be built on this decoder (None: it can): it needs a list of decoder
    layers and one rotary embedding module called with (x, position_ids)."""
    import inspect

    if not isinstance(getattr(decoder, "layers", None), nn.ModuleList):
        return "has no list of decoder layers (`model.layers`)"
    rotary = getattr(decoder, "rotary_emb", None)
    if rotary is None:
        return "has no rotary embedding (`model.rotary_emb`): its positions are not rotary"
    required = [p for p in inspect.signature(rotary.forward).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind is not inspect.Parameter.VAR_KEYWORD]
    if len(required) > 2:
        return f"has a rotary embedding that needs {', '.join(p.name for p in required[2:])} (per-layer rotary)"
    return None


def _one_layer(config):
    """The base's text config with one hidden layer (the drafter's own)."""
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    one = type(config).from_dict(config.to_dict())
    one.num_hidden_layers = 1
    one._attn_implementation = "sdpa" if config._attn_implementation == "flex_attention" else config._attn_implementation
    for name in ("layer_types", "sliding_window_pattern"):
        if getattr(one, name, None) is not None and isinstance(getattr(one, name), list):
            setattr(one, name, getattr(one, name)[:1])
    return one


@dataclass
class _Node:
    token: int
    score: float                 # log of the product of the drafter's probabilities along the path
    parent: int                  # index in the node list, -1 for a child of the root
    depth: int
    prob: float                  # the drafter's probability of this token after its parent


class EagleSource:
    """The ``eagle`` draft source: ``size`` nodes of an EAGLE-2 tree ``depth`` levels deep."""

    topk = 0

    def __init__(self, drafter: EagleDrafter, size: int, depth: int, width: int = WIDTH) -> None:
        self.drafter, self.size, self.depth, self.width = drafter, size, depth, width
        self.cache = DynamicCache()
        self.first = 0                            # the position of the cache's first pair
        self.next = None                          # position of the next pair to feed
        self.root: torch.Tensor | None = None     # (H,) predicted feature of the position after the text
        self.seconds = 0.0

    @classmethod
    def from_config(cls, config, size: int, context, drafter: EagleDrafter) -> EagleSource:
        return cls(drafter, size, config.draft_depth)

    @torch.no_grad()
    def update(self, outcome) -> None:
        features = outcome.features
        if features is None or not len(features):
            return
        start = time.perf_counter()
        context = outcome.context
        first = len(context) - 1 - len(features)          # the position of the first feature
        if self.next is None:
            self.first = self.next = first
        elif first != self.next:
            raise ValueError(f"the drafter's text ends at position {self.next}, the step's features start at {first}")
        device = self.drafter.fc.weight.device
        tokens = torch.tensor(context[first + 1:], device=device)
        positions = torch.arange(first, first + len(tokens), device=device)
        past = self.cache.get_seq_length()
        mask = torch.ones(len(tokens), past + len(tokens), dtype=torch.bool, device=device)
        mask[:, past:] = torch.ones(len(tokens), len(tokens), dtype=torch.bool, device=device).tril()
        out = self.drafter(tokens, features, positions, mask, self.cache)
        self.next = first + len(tokens)
        self.root = out[-1]
        self._count(start)

    @torch.no_grad()
    def propose(self, context: Sequence[int]) -> list[Draft]:
        if self.root is None or not self.size or not self.depth:
            return []
        start = time.perf_counter()
        nodes = self._grow()
        truncate_kv(self.cache, self.next - self.first)   # the tree's entries go: the cache holds the text
        self._count(start)
        return _drafts(nodes, self.size)

    def _count(self, start: float) -> None:
        """Add the seconds since ``start`` to ``seconds``, once the drafter's device has done the
        work queued (a GPU runs it asynchronously; the next tree needs it anyway)."""
        device = self.drafter.fc.weight.device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.seconds += time.perf_counter() - start

    def _grow(self) -> list[_Node]:
        """Every node the levels generated (their ``width`` best per level expanded, ``width``
        children each)."""
        drafter, device = self.drafter, self.drafter.fc.weight.device
        nodes: list[_Node] = []
        log_probs = drafter.log_probs(self.root[None])[0]
        width = min(self.width, log_probs.shape[-1])
        top = torch.topk(log_probs, width)
        for value, token in zip(top.values.tolist(), drafter.token_ids(top.indices).tolist()):
            nodes.append(_Node(token, value, -1, 1, math.exp(value)))
        frontier = list(range(len(nodes)))
        inputs = {i: self.root for i in frontier}          # a node's input feature: its parent's output
        slots: dict[int, int] = {}                         # node -> its slot in the drafter's cache
        committed = self.next - self.first
        for depth in range(2, self.depth + 1):
            past = self.cache.get_seq_length()
            q = len(frontier)
            mask = torch.zeros(q, past + q, dtype=torch.bool)       # built on the host, moved once a level
            mask[:, :committed] = True
            for row, node in enumerate(frontier):
                mask[row, past + row] = True
                parent = nodes[node].parent
                while parent >= 0:
                    mask[row, slots[parent]] = True
                    parent = nodes[parent].parent
            mask = mask.to(device)
            tokens = torch.tensor([nodes[n].token for n in frontier], device=device)
            features = torch.stack([inputs[n] for n in frontier])
            positions = torch.full((q,), self.next - 1 + depth - 1, device=device)
            out = drafter(tokens, features, positions, mask, self.cache)
            for row, node in enumerate(frontier):
                slots[node] = past + row
            top = torch.topk(drafter.log_probs(out), width)
            tokens_of = drafter.token_ids(top.indices).tolist()
            children = []
            for row, node in enumerate(frontier):
                for value, token in zip(top.values[row].tolist(), tokens_of[row]):
                    nodes.append(_Node(token, nodes[node].score + value, node, depth, math.exp(value)))
                    inputs[len(nodes) - 1] = out[row]
                    children.append(len(nodes) - 1)
            frontier = sorted(children, key=lambda n: -nodes[n].score)[:width]
        return nodes


def _drafts(nodes: list[_Node], size: int) -> list[Draft]:
    """The ``size`` best nodes (by score; every kept node's parent is kept too: a child never
    scores above its parent, ties broken parent first) as one draft per leaf, tagged
    ``eagle:p<decile of the drafter's probability>``."""
    order = sorted(range(len(nodes)), key=lambda n: (-nodes[n].score, nodes[n].depth, n))
    kept = set(order[:size])
    kept = {n for n in kept if all(p in kept for p in _ancestors(nodes, n))}
    parents = {nodes[n].parent for n in kept}
    drafts = []
    for leaf in sorted(n for n in kept if n not in parents):
        path = [*reversed(_ancestors(nodes, leaf)), leaf]
        drafts.append(Draft(tuple(nodes[n].token for n in path),
                            tuple(f"eagle:p{min(int(nodes[n].prob * 10), 9)}" for n in path)))
    return drafts


def _ancestors(nodes: list[_Node], n: int) -> list[int]:
    out, parent = [], nodes[n].parent
    while parent >= 0:
        out.append(parent)
        parent = nodes[parent].parent
    return out


# ---------------------------------------------------------------------------------------------
# The published layout


def save_drafter(drafter: EagleDrafter, directory: str | Path, training: dict | None = None) -> Path:
    """Write ``drafter`` in EAGLE's published layout (``config.json`` and ``model.safetensors``)."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = drafter.config.to_dict()
    config.update(num_hidden_layers=1, bias=drafter.fc.bias is not None, architectures=["LlamaForCausalLM"])
    if training is not None:
        config["training"] = training
    state = {f"fc.{k}": v for k, v in drafter.fc.state_dict().items()}
    state |= {f"layers.0.{k}": v for k, v in drafter.layer.state_dict().items()}
    if drafter.vocab is not None:             # EAGLE-3's convention: token = draft index + d2t[draft index]
        config["draft_vocab_size"] = len(drafter.vocab)
        state["d2t"] = drafter.vocab.cpu() - torch.arange(len(drafter.vocab))
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(directory / WEIGHT_FILES[0]))
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    return directory


def load_drafter(directory: str | Path, model: nn.Module) -> EagleDrafter:
    """The drafter saved in ``directory`` (EAGLE's published layout), on ``model``; a checkpoint made
    for another base (hidden size, vocabulary, layer shapes, embeddings) is refused, naming why."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ValueError(f"{directory} holds no {CONFIG_FILE}: not an EAGLE drafter")
    config = json.loads(config_path.read_text())
    base = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for key in ("hidden_size", "vocab_size"):
        if key in config and config[key] != getattr(base, key):
            raise ValueError(f"the EAGLE drafter in {directory} was made for {key}={config[key]}, the base has "
                             f"{getattr(base, key)}")
    if config.get("num_hidden_layers", 1) != 1:
        raise ValueError(f"the EAGLE drafter in {directory} has {config['num_hidden_layers']} layers; one is served")
    state = _read_weights(directory)
    d2t = state.pop("d2t", None)
    vocab = None if d2t is None else torch.arange(len(d2t)) + d2t.long()
    if vocab is not None and config.get("draft_vocab_size", len(vocab)) != len(vocab):
        raise ValueError(f"the EAGLE drafter in {directory}: draft_vocab_size {config['draft_vocab_size']} but d2t "
                         f"has {len(vocab)} entries")
    drafter = EagleDrafter(model, bias="fc.bias" in state, vocab=vocab)
    for key, mine in (("embed_tokens.weight", drafter.embed.weight), ("lm_head.weight", getattr(drafter.lm_head, "weight", None))):
        if key in state:
            theirs = state.pop(key)
            if mine is None or theirs.shape != mine.shape or not torch.allclose(theirs.to(mine), mine, atol=1e-3):
                raise ValueError(f"the EAGLE drafter in {directory} carries {key} that is not the base's own")
    ours = {f"fc.{k}": v for k, v in drafter.fc.state_dict().items()}
    ours |= {f"layers.0.{k}": v for k, v in drafter.layer.state_dict().items()}
    missing, unexpected = sorted(set(ours) - set(state)), sorted(set(state) - set(ours))
    if missing or unexpected:
        raise ValueError(f"the EAGLE drafter in {directory} does not fit {type(model).__name__}'s decoder layer: "
                         f"missing {missing[:5]}, unexpected {unexpected[:5]}")
    for key, value in state.items():
        if value.shape != ours[key].shape:
            raise ValueError(f"the EAGLE drafter in {directory}: {key} is {tuple(value.shape)}, the base's layer "
                             f"needs {tuple(ours[key].shape)}")
    drafter.fc.load_state_dict({k[3:]: v for k, v in state.items() if k.startswith("fc.")})
    drafter.layer.load_state_dict({k[9:]: v for k, v in state.items() if k.startswith("layers.0.")})
    drafter.training_record = config.get("training")
    return drafter.to(device=model.device, dtype=model.dtype)


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
    raise ValueError(f"{directory} holds none of {', '.join(WEIGHT_FILES)}")

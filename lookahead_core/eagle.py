"""EAGLE drafters (Li et al., 2024, 2025: EAGLE-1/2 and EAGLE-3) as a draft source of the token tree.

Two drafters, one interface (``from_base``, ``forward``, ``log_probs``, ``token_ids``, ``aux_layers``):

* :class:`EagleDrafter` (EAGLE-1/2): one decoder layer of the base model's own architecture. At
  position i it reads ``fc([embedding of token i+1 ; the base's feature at i])`` (2H -> H; the
  feature is the base's last hidden state, after its final norm: what its LM head reads) and
  predicts the feature at i + 1, whose token distribution the base's own LM head gives (optionally
  over a draft vocabulary: its rows of the head). The layer's first norm is dropped, as in EAGLE's
  published drafters.
* :class:`Eagle3Drafter` (EAGLE-3): ``fc`` (kH -> H) fuses the base's hidden states after k of its
  layers (``aux_layers``, which the step returns beside the last: ``CausalLM.feature_layers``); one
  Llama layer reads ``[embedding ; feature]`` (2H) and predicts the next feature, which its own norm
  and head read over a draft vocabulary, and which the next draft step reads as its feature.

Each step (:class:`EagleSource`):

* ``update`` feeds the drafter the step's committed tokens with the base's features at the rows
  that predicted them (``StepOutcome.features``: every prompt row after the prefill, the input row
  and the accepted path's rows after a step), so the drafter's own KV cache holds exactly the
  committed text, and keeps its last output: the predicted feature of the next position;
* ``propose`` grows a tree from there as EAGLE-2 does: each level feeds the ``width`` best nodes of
  the level above (by the product of the drafter's own probabilities along the path, which are well
  calibrated to acceptance), each node seeing the committed cache and its ancestors, and takes each
  one's top ``width`` children; after ``depth`` levels (fewer where a level's price,
  ``LookaheadConfig.draft_cost``, exceeds what it can add) the ``size`` best nodes of the whole tree
  (a prefix-closed set: a node never scores above its parent) become the drafts. The tree grows
  on the drafter's device and the host reads it once a step (``launch``: the decode loop reads
  every sequence's in one copy); per-level stops under ``draft_cost`` are applied as it is read. The tree's nodes
  then compete in the one token tree with every other source's (``Proposer``): each token is tagged
  ``eagle:p<d>``, d the decile of the drafter's probability for it, so the acceptance measured per
  tag and depth recalibrates it. The base verifies the tree like any other draft, so the output is
  token-identical to greedy decoding whatever the drafter proposes.

The tree's nodes enter the drafter's cache only while the tree grows: it is cut back to the
committed text before the next ``update``. Time in the drafter's forwards is counted apart
(``EagleSource.seconds``, summed into ``DecodeStats.draft_seconds``).

Formats (:func:`load_drafter` reads each, :func:`save_drafter` writes the first two), a directory
holding ``config.json`` and ``model.safetensors`` or ``pytorch_model.bin``:

* EAGLE-1/2 (SafeAILab/EAGLE): the base architecture's config with ``num_hidden_layers: 1`` and
  ``bias``; flat keys ``fc.weight`` (H x 2H), ``fc.bias``, ``layers.0.<the layer's own names>`` (no
  ``input_layernorm``), optionally ``embed_tokens.weight`` / ``lm_head.weight`` (copies of the
  base's: one that differs is refused);
* EAGLE-3, official and SpecForge's ``LlamaForCausalLMEagle3``: a Llama config with one layer and
  ``draft_vocab_size`` (SpecForge: ``eagle_config.eagle_aux_hidden_state_layer_ids``, layer outputs;
  absent: :func:`default_layer_ids`); ``fc.weight`` (H x kH), ``midlayer.*``, ``norm.weight``,
  ``lm_head.weight``;
* EAGLE-3, vLLM speculators' ``Eagle3Speculator``: ``transformer_layer_config``, the layer ids counted
  as hidden-state indices (id L, the layer count: the last layer's output before the final norm),
  ``layers.0.*`` for ``midlayer.*``, ``embed_tokens.weight``.

In every layout the output of layer i is the residual stream after it, before any final norm (the
step reads the last layer's through :func:`lookahead_core.model_io.last_layer_output`:
transformers' ``hidden_states[L]`` is after the final norm). A dense EAGLE-1/2 layer for a
mixture-of-experts base is refused (docs/eagle.md lists what is not served and why).

A draft vocabulary travels as ``d2t`` (the token of draft index i is i + d2t[i]) and ``t2d`` (which
tokens are drafted); hidden size, vocabulary, layer ids and shapes are checked against the base.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import DynamicCache

from .layout import Draft
from .model_io import ForwardClock, cache_keyword, truncate_kv
from .positions import position_limit

WIDTH = 8                       # nodes expanded per level, and children taken from each (EAGLE-2's top-k)
CONFIG_FILE = "config.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class _OnBase(nn.Module):
    """What both drafters share: the base model, held by reference (a list: its weights are not the
    drafter's), whose embeddings they read; the draft vocabulary (``vocab``: the token id of each
    draft index, None: the base's whole vocabulary); the device of ``fc``, their first layer."""

    aux_layers: tuple[int, ...] = ()      # the base's hidden states read besides the last: none

    def _hold(self, model: nn.Module, vocab: Sequence[int] | torch.Tensor | None, size: int) -> torch.Tensor | None:
        self.base = [model]
        self.register_buffer("vocab", _checked_vocab(vocab, size), persistent=False)
        return self.vocab

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def embed(self) -> nn.Module:
        return self.base[0].get_input_embeddings()

    def token_ids(self, indices: torch.Tensor) -> torch.Tensor:
        """The token ids of draft-vocabulary ``indices``."""
        return indices if self.vocab is None else self.vocab[indices]


class EagleDrafter(_OnBase):
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
        self._cache_kw = cache_keyword(self.layer)
        self.rotary = type(decoder.rotary_emb)(config=config)
        # A reduced draft vocabulary (the most frequent tokens of the training text) cuts the LM
        # head's rows, the main cost of a draft step on a small base with a large vocabulary.
        self._hold(model, vocab, config.vocab_size)
        self._rows: tuple[int, torch.Tensor] | None = None
        self.to(device=model.device, dtype=model.dtype)

    @property
    def lm_head(self) -> nn.Module:
        return self.base[0].get_output_embeddings()

    def from_base(self, features: torch.Tensor) -> torch.Tensor:
        """The drafter's input feature from the base's (the last layer's, first in ``features``)."""
        return features[..., :self.config.hidden_size]

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor, cache: DynamicCache | None = None) -> torch.Tensor:
        """Predicted features (..., q, H) of ``tokens`` (q,) or (B, q) read with features ``hidden``
        (..., q, H) at ``positions`` (..., q), after what ``cache`` holds; ``mask`` (..., q, cache
        length + q) bool: what each row sees."""
        inputs = self.fc(torch.cat([self.embed(tokens), hidden.to(self.fc.weight.dtype)], dim=-1))
        cached = {self._cache_kw: cache}
        return _run(inputs, positions, mask, self.rotary, lambda x, **kw: self.layer(x, **cached, **kw))

    def forward_train(self, tokens: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        """Whole sequences at once, no cache (training): ``tokens`` (B, T) read with ``features``
        (B, T, H), position t seeing positions <= t; predicted features (B, T, H)."""
        return self(tokens, features, *causal(tokens.shape[1], tokens.device))

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


class Eagle3Drafter(_OnBase):
    """EAGLE-3 (Li et al., 2025): ``fc`` (kH -> H, no bias) fuses the base's hidden states after k of
    its decoder layers (``layer_ids``: a low, a middle and a high one); one Llama decoder layer
    (``midlayer``) whose attention reads ``[input_layernorm(embedding) ; hidden_norm(feature)]`` (2H)
    and whose residual stream is the feature; its own ``norm`` and ``lm_head`` over a draft
    vocabulary (``vocab``: the token id of each draft index; None: the base's whole vocabulary).
    The layer's output, before ``norm``, is the feature the next draft step reads. The module's
    state dict is the published one's (``fc.weight``, ``midlayer.*``, ``norm.weight``, ``lm_head.weight``)."""

    def __init__(self, model: nn.Module, config, layer_ids: Sequence[int], *,
                 vocab: Sequence[int] | torch.Tensor | None = None, norm_before_residual: bool = False) -> None:
        super().__init__()
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

        base = _text_config(model.config)
        hidden, layers = base.hidden_size, base.num_hidden_layers
        if config.hidden_size != hidden:
            raise ValueError(f"an EAGLE-3 drafter of hidden size {config.hidden_size} cannot read a base of {hidden}")
        layer_ids = tuple(int(i) for i in layer_ids)
        if not layer_ids or any(not 0 <= i < layers for i in layer_ids):
            raise ValueError(f"an EAGLE-3 drafter reads the outputs of decoder layers {list(layer_ids)}; the base "
                             f"has layers 0..{layers - 1}")
        self.config, self.layer_ids = config, layer_ids
        self.aux_layers = outputs_in_hidden_states(layer_ids)
        self.norm_before_residual = norm_before_residual
        self.fc = nn.Linear(len(layer_ids) * hidden, hidden, bias=False)
        self.midlayer = LlamaDecoderLayer(config, layer_idx=0)
        attention = self.midlayer.self_attn
        self._cache_kw = cache_keyword(attention)
        for name in ("q_proj", "k_proj", "v_proj"):         # the attention reads embedding and feature: 2H
            setattr(attention, name, nn.Linear(2 * hidden, getattr(attention, name).out_features,
                                               bias=bool(getattr(config, "attention_bias", False))))
        self.midlayer.hidden_norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        vocab = self._hold(model, vocab, base.vocab_size)
        self.lm_head = nn.Linear(hidden, base.vocab_size if vocab is None else len(vocab), bias=False)
        self.rotary = LlamaRotaryEmbedding(config=config)
        self.to(device=model.device, dtype=model.dtype)

    def from_base(self, features: torch.Tensor) -> torch.Tensor:
        """The fused feature from the base's: its last layer's (first in ``features``, unread here)
        and then those of ``layer_ids``."""
        hidden = self.config.hidden_size
        return self.fc(features[..., hidden:].to(self.fc.weight.dtype))

    def forward(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                mask: torch.Tensor, cache: DynamicCache | None = None) -> torch.Tensor:
        """As :meth:`EagleDrafter.forward`: the layer's outputs (..., q, H) for ``tokens`` read with
        features ``hidden`` (fused ones, or the layer's own outputs one draft step before)."""
        layer = self.midlayer
        embedded = layer.input_layernorm(self.embed(tokens).to(self.fc.weight.dtype))
        normed = layer.hidden_norm(hidden.to(self.fc.weight.dtype))
        residual = normed if self.norm_before_residual else hidden.to(normed.dtype)

        def body(x, *, attention_mask, position_ids, position_embeddings):
            attended, _ = layer.self_attn(hidden_states=x, position_embeddings=position_embeddings,
                                          attention_mask=attention_mask, **{self._cache_kw: cache})
            out = residual + attended
            return out + layer.mlp(layer.post_attention_layernorm(out))

        return _run(torch.cat([embedded, normed], dim=-1), positions, mask, self.rotary, body)

    def log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        """(q, V') log-probabilities over the draft vocabulary of the layer's outputs (q, H)."""
        return torch.log_softmax(self.lm_head(self.norm(hidden.to(self.fc.weight.dtype))).float(), dim=-1)


def eagle3_config(model: nn.Module, draft_vocab: int | None = None):
    """A Llama config for an EAGLE-3 drafter of ``model`` trained here: the base's width, heads,
    MLP size, norm epsilon and rotary base, one layer."""
    from transformers import LlamaConfig

    base = _text_config(model.config)
    hidden = base.hidden_size
    heads = getattr(base, "num_attention_heads", None) or getattr(base, "n_head")
    rope = dict(getattr(base, "rope_parameters", None) or {}) or {"rope_type": "default", "rope_theta": 10000.0}
    if rope.get("rope_type", "default") != "default":          # the drafter's positions are plain rotary ones
        rope = {"rope_type": "default", "rope_theta": rope.get("rope_theta", 10000.0)}
    return LlamaConfig(hidden_size=hidden, num_hidden_layers=1, num_attention_heads=heads,
                       num_key_value_heads=getattr(base, "num_key_value_heads", None) or heads,
                       head_dim=getattr(base, "head_dim", None) or hidden // heads,
                       intermediate_size=getattr(base, "intermediate_size", None) or 4 * hidden,
                       rms_norm_eps=getattr(base, "rms_norm_eps", None) or 1e-6, rope_parameters=rope,
                       max_position_embeddings=position_limit(base) or 4096, vocab_size=base.vocab_size,
                       draft_vocab_size=draft_vocab or base.vocab_size, tie_word_embeddings=False,
                       attn_implementation="sdpa")


def outputs_in_hidden_states(layer_ids: Sequence[int]) -> tuple[int, ...]:
    """Where the outputs of decoder layers ``layer_ids`` sit in a model's ``hidden_states`` (the
    embeddings come first): what an EAGLE-3 drafter fuses, as the step returns it."""
    return tuple(i + 1 for i in layer_ids)


def default_layer_ids(model: nn.Module) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers of an L-layer base: the outputs of layers 1, L/2 - 1
    and L - 4 (SpecForge's default; the official code's hidden states 2, L/2 and L - 3)."""
    layers = _text_config(model.config).num_hidden_layers
    return tuple(sorted((min(1, layers - 1), max(layers // 2 - 1, 0), max(layers - 4, 0))))


def _text_config(config):
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def _checked_vocab(vocab, size: int) -> torch.Tensor | None:
    """A draft vocabulary as a tensor of distinct token ids below ``size`` (None: the whole one)."""
    if vocab is None:
        return None
    vocab = torch.as_tensor(vocab, dtype=torch.long)
    if vocab.ndim != 1 or not len(vocab) or len(set(vocab.tolist())) != len(vocab) \
            or int(vocab.min()) < 0 or int(vocab.max()) >= size:
        raise ValueError(f"a draft vocabulary is distinct token ids below {size}")
    return vocab


def causal(steps: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions (1, steps) and mask (1, steps, steps) of a plain causal pass with no cache."""
    return (torch.arange(steps, device=device)[None],
            torch.ones(steps, steps, dtype=torch.bool, device=device).tril()[None])


def _run(inputs: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, rotary, body) -> torch.Tensor:
    """``body`` (a decoder layer's step, which passes the drafter's cache under the name its module
    reads: :func:`cache_keyword`) over ``inputs`` (q, D) or (B, q, D) with the boolean ``mask`` made
    additive and the rotary embedding of ``positions``; unbatched in, unbatched out."""
    single = inputs.ndim == 2
    if single:
        inputs, positions, mask = inputs[None], positions[None], mask[None]
    additive = torch.zeros(mask.shape, dtype=inputs.dtype, device=inputs.device)
    additive.masked_fill_(~mask, torch.finfo(inputs.dtype).min)
    out = body(inputs, attention_mask=additive[:, None], position_ids=positions,
               position_embeddings=rotary(inputs, positions))
    out = out[0] if isinstance(out, tuple) else out
    return out[0] if single else out


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
    config = _text_config(config)
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
    """The ``eagle`` draft source: ``size`` nodes of an EAGLE-2 tree ``depth`` levels deep. Its cache
    holds the text's (token, feature) pairs from ``first``; a conversation's next turn resumes it
    (``handover``/``resume``), so the drafter drafts with the earlier turns' context."""

    name = "eagle"
    topk = 0

    def __init__(self, drafter: EagleDrafter | Eagle3Drafter, size: int, depth: int, width: int = WIDTH,
                 level_cost: float = 0.0) -> None:
        self.drafter, self.size, self.depth, self.width = drafter, size, depth, width
        self.level_cost = level_cost              # a level's price in greedy steps (LookaheadConfig.draft_cost)
        self.cache = DynamicCache()
        self.first = 0                            # the position of the cache's first pair
        self.next = None                          # position of the next pair to feed
        self.root: torch.Tensor | None = None     # (H,) predicted feature of the position after the text
        self.clock = ForwardClock(drafter.device)   # times the drafter's work without waiting for it
        self.spans: list = []
        self.landed: list[float] | None = None      # the host's copy of the tree launched for this step
        self.resumed = False                      # the cache is an earlier turn's, not yet extended

    @classmethod
    def from_config(cls, config, size: int, context, drafter: EagleDrafter) -> EagleSource:
        return cls(drafter, size, config.draft_depth, level_cost=config.draft_cost)

    def handover(self) -> dict | None:
        """The drafter's cache of the committed text, for the conversation's next turn."""
        return None if self.next is None else {"drafter": id(self.drafter), "cache": self.cache,
                                                "first": self.first, "next": self.next}

    def resume(self, state: dict) -> None:
        """Take over an earlier turn's cache (of this drafter): used where the next turn's features
        start right where it ends, else the first update starts afresh."""
        if state["drafter"] == id(self.drafter):
            self.cache, self.first, self.next, self.resumed = state["cache"], state["first"], state["next"], True

    @property
    def seconds(self) -> float:
        """Seconds in the drafter's work (on a GPU from its events: the first read waits for them)."""
        return self.clock.seconds(self.spans)

    @torch.no_grad()
    def update(self, outcome) -> None:
        features = outcome.features
        if features is None or not len(features):
            return
        span = self.clock.start()
        context = outcome.context
        first = len(context) - 1 - len(features)          # the position of the first feature
        if self.resumed and first != self.next:           # the new turn left the earlier text before its end
            self.cache, self.next = DynamicCache(), None
        self.resumed = False
        if self.next is None:
            self.first = self.next = first
        elif first != self.next:
            raise ValueError(f"the drafter's text ends at position {self.next}, the step's features start at {first}")
        device = self.drafter.device
        tokens = outcome.feature_tokens if outcome.feature_tokens is not None else \
            torch.tensor(context[first + 1:], device=device)
        positions = torch.arange(first, first + len(tokens), device=device)
        past = self.cache.get_seq_length()
        mask = torch.ones(len(tokens), past + len(tokens), dtype=torch.bool, device=device)
        mask[:, past:] = torch.ones(len(tokens), len(tokens), dtype=torch.bool, device=device).tril()
        out = self.drafter(tokens, self.drafter.from_base(features.to(device)), positions, mask, self.cache)
        self.next = first + len(tokens)
        self.root = out[-1]
        self._stop(span)

    @torch.no_grad()
    def launch(self) -> torch.Tensor | None:
        """Grow the step's tree on the device (queued, not waited for); what the host must read of
        it, which the decode loop reads with every sequence's in one copy and hands to :meth:`land`
        (None: no tree this step)."""
        if self.root is None or not self.size or not self.depth:
            return None
        span = self.clock.start()
        tree = self._grow_on_device()
        truncate_kv(self.cache, self.next - self.first)   # the tree's entries go: the cache holds the text
        self._stop(span)
        return tree

    def land(self, read: list[float]) -> None:
        """The host's copy of what :meth:`launch` returned, for the next :meth:`propose`."""
        self.landed = read

    @torch.no_grad()
    def propose(self, context: Sequence[int]) -> list[Draft]:
        if self.landed is None:                             # not launched by the loop: launch and read here
            tree = self.launch()
            self.landed = tree.tolist() if tree is not None else None
        read, self.landed = self.landed, None
        return _drafts(self._nodes(read), self.size) if read is not None else []

    def _stop(self, span: list) -> None:
        """Close ``span``, the drafter's work since it opened (on a GPU: events, not waited for)."""
        self.clock.stop(span)
        self.spans.append(span)

    def _grow_on_device(self) -> torch.Tensor:
        """The tree grown on the drafter's device, as :meth:`_nodes` reads it (float64, (n,))."""
        drafter, device = self.drafter, self.drafter.device
        log_probs = drafter.log_probs(self.root[None])[0]
        width = min(self.width, log_probs.shape[-1])
        top = torch.topk(log_probs, width)
        tokens, scores = drafter.token_ids(top.indices), top.values.double()    # of the nodes the next level feeds
        read = [tokens.double(), scores]              # what the host reads (token ids below 2 ** 53 stay exact)
        ids = torch.arange(width, device=device)      # their indices in the node list
        features = self.root.expand(width, -1)        # a node's input feature: its parent's output
        seen = torch.zeros(width, 0, dtype=torch.bool, device=device)   # the tree slots of a node's ancestors
        eye = torch.eye(width, dtype=torch.bool, device=device)
        committed, count = self.next - self.first, width
        for depth in range(2, self.depth + 1):
            # The next level adds at most the acceptance mass of the nodes it feeds (a child never scores
            # above its parent; one path is accepted): worth its forward only above ``level_cost``. On
            # the CPU, where a read costs no wait, growth stops there; elsewhere the host drops the levels
            # past it when it reads the tree (_nodes).
            if self.level_cost and device.type == "cpu" and _mass(scores.tolist()) < self.level_cost:
                break
            mask = torch.cat([torch.ones(width, committed, dtype=torch.bool, device=device), seen, eye], 1)
            positions = torch.full((width,), self.next + depth - 2, device=device)
            out = drafter(tokens, features, positions, mask, self.cache)
            top = torch.topk(drafter.log_probs(out), width)           # each fed node's ``width`` children
            children, values = drafter.token_ids(top.indices).flatten(), top.values.double().flatten()
            read += [ids.double(), children.double(), values]
            paths = scores.repeat_interleave(width) + values            # the children's scores
            best = torch.sort(paths, descending=True, stable=True).indices[:width]
            ids, tokens, scores = count + best, children[best], paths[best]
            features, seen = out[best // width], torch.cat([seen, eye], 1)[best // width]
            count += width * width
        return torch.cat([torch.full((1,), width, dtype=torch.float64, device=device), *read])

    def _nodes(self, read: list[float]) -> list[_Node]:
        """The nodes from the host's copy of :meth:`_grow_on_device`: the width, the first level's
        tokens and log-probabilities, then per level grown the fed nodes' indices and their
        children's tokens and log-probabilities (row by row); from the first level whose fed
        nodes' mass is below ``level_cost`` on, none."""
        width, read = int(read[0]), read[1:]
        nodes = [_Node(int(token), value, -1, 1, math.exp(value)) for token, value in zip(read[:width], read[width:2 * width])]
        at, children = 2 * width, width * width
        while at < len(read):
            fed = [int(n) for n in read[at:at + width]]
            if self.level_cost and _mass([nodes[n].score for n in fed]) < self.level_cost:
                break
            tokens, values = read[at + width:at + width + children], read[at + width + children:at + width + 2 * children]
            depth = nodes[fed[0]].depth + 1
            for k, (token, value) in enumerate(zip(tokens, values)):
                parent = fed[k // width]
                nodes.append(_Node(int(token), nodes[parent].score + value, parent, depth, math.exp(value)))
            at += width + 2 * children
        return nodes


def _mass(scores: list[float]) -> float:
    """The acceptance mass of nodes of log-scores ``scores`` (at most one of them is accepted)."""
    return min(1.0, sum(math.exp(s) for s in scores))


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


def save_drafter(drafter: EagleDrafter | Eagle3Drafter, directory: str | Path, training: dict | None = None) -> Path:
    """Write ``drafter`` in EAGLE's published layout (``config.json`` and ``model.safetensors``): an
    EAGLE-3 drafter as the official code and SpecForge write theirs (``midlayer.*``; the layer ids
    in ``eagle_config``), an EAGLE-1/2 one with ``layers.0.*``."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = drafter.config.to_dict()
    if isinstance(drafter, Eagle3Drafter):
        config.update(architectures=[SPECFORGE], num_hidden_layers=1, norm_before_residual=drafter.norm_before_residual,
                      draft_vocab_size=drafter.lm_head.out_features,
                      eagle_config={"eagle_aux_hidden_state_layer_ids": list(drafter.layer_ids)})
        state = dict(drafter.state_dict())
    else:
        config.update(num_hidden_layers=1, bias=drafter.fc.bias is not None, architectures=["LlamaForCausalLM"])
        state = {f"fc.{k}": v for k, v in drafter.fc.state_dict().items()}
        state |= {f"layers.0.{k}": v for k, v in drafter.layer.state_dict().items()}
        if drafter.vocab is not None:
            config["draft_vocab_size"] = len(drafter.vocab)
    config.pop("_attn_implementation_autoset", None)
    if training is not None:
        config["training"] = training
    if drafter.vocab is not None:       # the token of draft index i is i + d2t[i]; t2d marks the tokens drafted
        state["d2t"] = drafter.vocab.cpu() - torch.arange(len(drafter.vocab))
        state["t2d"] = torch.zeros(config["vocab_size"], dtype=torch.bool).index_fill_(0, drafter.vocab.cpu(), True)
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(directory / WEIGHT_FILES[0]))
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True, default=str))
    return directory


SPECFORGE = "LlamaForCausalLMEagle3"
SPECULATORS = "Eagle3Speculator"


def load_drafter(directory: str | Path, model: nn.Module) -> EagleDrafter | Eagle3Drafter:
    """The drafter saved in ``directory`` on ``model``: EAGLE-1/2's published layout, or EAGLE-3's
    (the official one, SpecForge's ``LlamaForCausalLMEagle3``, vLLM speculators' ``Eagle3Speculator``).
    A checkpoint made for another base (hidden size, vocabulary, layer ids, layer shapes,
    embeddings) is refused, naming why."""
    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise ValueError(f"{directory} holds no {CONFIG_FILE}: not an EAGLE drafter")
    config = json.loads(config_path.read_text())
    state = _read_weights(directory)
    speculators = SPECULATORS in config.get("architectures", []) or "speculators_model_type" in config
    if speculators or any(k.startswith("midlayer.") for k in state):
        drafter = _load_eagle3(directory, config, state, model, speculators)
    else:
        drafter = _load_eagle(directory, config, state, model)
    drafter.training_record = config.get("training")
    return drafter.to(device=model.device, dtype=model.dtype)


def _refuse(directory: Path, why: str) -> ValueError:
    return ValueError(f"the EAGLE drafter in {directory} {why}")


def _fits_base(directory: Path, config: dict, model: nn.Module) -> None:
    base = _text_config(model.config)
    for key in ("hidden_size", "vocab_size", "target_hidden_size"):
        theirs = config.get(key)
        ours = getattr(base, "hidden_size" if key == "target_hidden_size" else key)
        if theirs is not None and theirs != ours:
            raise _refuse(directory, f"was made for {key}={theirs}, the base has {ours}")
    if config.get("num_hidden_layers", 1) != 1:
        raise _refuse(directory, f"has {config['num_hidden_layers']} layers; one is served")


def _draft_vocab(directory: Path, config: dict, state: dict, size: int) -> torch.Tensor | None:
    """The draft vocabulary from ``d2t`` (and ``t2d``, which must agree), popped from ``state``."""
    d2t, t2d = state.pop("d2t", None), state.pop("t2d", None)
    if d2t is None:
        if t2d is not None and not bool(t2d.all()):
            raise _refuse(directory, "has a t2d map without the d2t map")
        return None
    vocab = torch.arange(len(d2t)) + d2t.long()
    if config.get("draft_vocab_size", len(vocab)) != len(vocab):
        raise _refuse(directory, f"says draft_vocab_size {config['draft_vocab_size']} but d2t has {len(vocab)} entries")
    if len(vocab) and (int(vocab.min()) < 0 or int(vocab.max()) >= size):
        raise _refuse(directory, f"maps draft tokens outside the base's vocabulary of {size}")
    if t2d is not None:
        if len(t2d) != size or sorted(t2d.nonzero().flatten().tolist()) != sorted(vocab.tolist()):
            raise _refuse(directory, "has d2t and t2d maps that disagree")
    if len(vocab) == size and bool((vocab == torch.arange(size)).all()):
        return None                     # the whole vocabulary, in order
    return vocab


def _same_as_base(directory: Path, state: dict, key: str, mine: torch.Tensor | None) -> None:
    """Pop ``key`` (a copy of a base weight the drafter uses by reference); refuse one that differs."""
    if key in state:
        theirs = state.pop(key)
        if mine is None or theirs.shape != mine.shape or not torch.allclose(theirs.to(mine), mine, atol=1e-3):
            raise _refuse(directory, f"carries {key} that is not the base's own")


def _load_into(directory: Path, module: nn.Module, state: dict, owner: str) -> None:
    """Load ``state`` into ``module``, refusing a missing, unexpected or misshapen weight."""
    ours = module.state_dict()
    missing, unexpected = sorted(set(ours) - set(state)), sorted(set(state) - set(ours))
    if missing or unexpected:
        raise _refuse(directory, f"does not fit {owner}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for key, value in state.items():
        if value.shape != ours[key].shape:
            raise _refuse(directory, f"has {key} of shape {tuple(value.shape)}; {owner} needs {tuple(ours[key].shape)}")
    module.load_state_dict(state)


EXPERTS = ("num_local_experts", "num_experts", "n_routed_experts")    # a mixture-of-experts base's config keys


def _load_eagle(directory: Path, config: dict, state: dict, model: nn.Module) -> EagleDrafter:
    _fits_base(directory, config, model)
    base = _text_config(model.config)
    experts = next(((key, getattr(base, key)) for key in EXPERTS if getattr(base, key, None)), None)
    if experts and not any("expert" in key for key in state if key.startswith("layers.0.")):
        raise _refuse(directory, f"is a dense layer for a mixture-of-experts base ({type(model).__name__}, "
                                 f"{experts[0]}={experts[1]}): EAGLE-1/2's layer is the base's own, experts "
                                 "included, so a dense one is not served (docs/eagle.md, What is not served)")
    vocab = _draft_vocab(directory, config, state, _text_config(model.config).vocab_size)
    drafter = EagleDrafter(model, bias="fc.bias" in state, vocab=vocab)
    _same_as_base(directory, state, "embed_tokens.weight", drafter.embed.weight)
    _same_as_base(directory, state, "lm_head.weight", getattr(drafter.lm_head, "weight", None))
    mine = nn.ModuleDict({"fc": drafter.fc, "layers": nn.ModuleList([drafter.layer])})
    _load_into(directory, mine, state, f"{type(model).__name__}'s decoder layer")
    return drafter


def _load_eagle3(directory: Path, config: dict, state: dict, model: nn.Module, speculators: bool) -> Eagle3Drafter:
    from transformers import LlamaConfig

    base = _text_config(model.config)
    if speculators:             # vLLM speculators: the layer's config nested, its weights under layers.0
        layer = dict(config.get("transformer_layer_config") or {})
        if layer.get("model_type", "llama") != "llama":
            raise _refuse(directory, f"has a {layer['model_type']} layer; EAGLE-3's Llama layer is served")
        # counted as the residual stream before layer i (i = L: after the last layer, before the final
        # norm): the outputs of layers i - 1, as the other layouts count them (CausalLM.feature_layers)
        ids = config.get("eagle_aux_hidden_state_layer_ids")
        ids = None if ids is None else [i - 1 for i in ids]
        state = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v for k, v in state.items()}
        layer |= {k: config[k] for k in ("draft_vocab_size", "target_hidden_size") if k in config}
    else:                       # the official layout and SpecForge's: a Llama config with one layer
        layer = config
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    unserved = [o for o in ("fc_norm", "norm_before_fc", "input_norm") if config.get(o) or layer.get(o)]
    if speculators and config.get("norm_output"):       # speculators: the normed output fed back
        unserved.append("norm_output")
    if unserved:
        raise _refuse(directory, f"sets {', '.join(unserved)}: a variant of the EAGLE-3 layer not served here")
    _fits_base(directory, layer, model)
    ids = default_layer_ids(model) if ids is None else ids
    vocab = _draft_vocab(directory, layer, state, base.vocab_size)
    fc = state.get("fc.weight")
    if fc is not None and fc.shape[1] != len(ids) * base.hidden_size:
        raise _refuse(directory, f"fuses {fc.shape[1]} feature columns; its layer ids {list(ids)} give "
                                 f"{len(ids)} x {base.hidden_size}")
    llama = LlamaConfig.from_dict({k: v for k, v in layer.items() if k not in ("architectures", "eagle_config", "training")})
    llama.num_hidden_layers = 1
    llama._attn_implementation = "sdpa"
    drafter = Eagle3Drafter(model, llama, ids, vocab=vocab,
                            norm_before_residual=bool(config.get("norm_before_residual", False)))
    _same_as_base(directory, state, "embed_tokens.weight", drafter.embed.weight)
    _load_into(directory, drafter, state, "an EAGLE-3 Llama layer of the base's width")
    return drafter


def _read_weights(directory: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = directory / name
        if path.is_file():
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
    raise ValueError(f"{directory} holds none of {', '.join(WEIGHT_FILES)}")

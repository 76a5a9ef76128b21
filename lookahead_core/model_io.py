"""The only place that touches the model: its forward call and the KV cache API.

No model class is imported and nothing is patched. What differs between architectures is read
from the config: which attention types the layers use (``config.layer_types``, or a single
``config.sliding_window`` as Mistral has) and therefore which masks the forward needs.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .inputs import vocab_size
from .layout import attention_mask
from .positions import position_limit

SUPPORTED_ATTENTION = ("eager", "sdpa", "flex_attention")
_FULL, _SLIDING = "full_attention", "sliding_attention"


class CausalLM:
    """A Hugging Face causal LM seen through ``model(input_ids, position_ids, attention_mask, cache)``.

    A step whose rows branch (window, several candidates) passes an explicit mask per attention
    type: a float 4-D mask under eager and SDPA, a flex ``BlockMask`` under flex_attention (built
    from the same rule, :mod:`lookahead_core.flex`). A step that is a plain causal chain (the
    prefill, greedy steps, one candidate and no window) passes none under eager and SDPA: the
    model builds its own causal mask, which lets SDPA take its unmasked kernel for 1-token steps,
    as ``generate`` does; under flex_attention it gets a chain ``BlockMask`` (transformers' own
    sliding-window block mask does not compile on the CPU, see :mod:`lookahead_core.flex`). The
    cache is a plain ``DynamicCache`` that keeps every position: sliding-window layers get the window from the mask (ours, or the
    model's own, built from the same positions) instead of from a cache that drops old rows, which
    keeps KV commits a simple re-index.

    ``drafters``: trained draft models by source name (``{"medusa": MedusaHeads}``), for the
    sources registered with ``drafter=True`` (``lookahead_core/sources.py``).

    :class:`lookahead_core.parallel.ShardedLM` is the same interface with each step's rows split
    over the ranks of a process group (``sharded``; ``comm_seconds``: time in its collectives).
    """

    sharded = False
    comm_seconds = 0.0

    def __init__(self, model: torch.nn.Module, drafters: dict | None = None) -> None:
        config = model.config
        attn = getattr(config, "_attn_implementation", None) or "eager"
        if attn not in SUPPORTED_ATTENTION:
            raise ValueError(
                f"attention implementation {attn!r} takes no custom mask of a step's layout; load the model "
                f"with attn_implementation in {SUPPORTED_ATTENTION}"
            )
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError("encoder-decoder models are not supported; pass a causal LM")
        self.model = model
        self.drafters = dict(drafters or {})
        self.attention = attn
        self.windows = _attention_windows(config)
        self.vocab_size = vocab_size(model)
        self.position_limit = position_limit(config)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in params
        self.flex = None
        if attn == "flex_attention":
            try:
                from .flex import FlexMasks       # torch.nn.attention.flex_attention, only when used
            except ImportError as error:
                raise ValueError(f"flex_attention needs torch.nn.attention.flex_attention (torch >= 2.5; this is "
                                 f"torch {torch.__version__}): {error}; load the model with sdpa or eager") from error
            self.flex = FlexMasks(model.device)

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @staticmethod
    def new_cache() -> DynamicCache:
        return DynamicCache()

    def commit(self, cache: DynamicCache, past: int, keep_rows: list[list[int]], valid: list[int] | None = None) -> None:
        """After a step: keep the rows each sequence accepted (:func:`commit_kv`)."""
        commit_kv(cache, past, keep_rows, valid)

    def forward(
        self,
        cache: DynamicCache,
        tokens: list[int],
        offsets: torch.Tensor,
        visible: torch.Tensor | None,
        position: int,
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """One sequence: feed ``tokens`` at ``position + offsets`` after the cache; logits (r, V) of
        ``logit_rows``. ``position`` must be the cache length."""
        if position != cache.get_seq_length():
            raise ValueError(f"a sequence's tokens must start right after the cache ({cache.get_seq_length()}), "
                             f"not at {position}")
        return self.forward_batch(cache, [Feed(tokens, offsets, visible, position, logit_rows)])[0]

    def forward_batch(self, cache: DynamicCache, feeds: list[Feed], hidden: bool = False):
        """One forward over every sequence of the batch (``feeds[b]`` is cache row b); logits per sequence
        (with ``hidden``: ``(logits, last hidden states)`` per sequence, both of its ``logit_rows``).

        Feeds are right-padded to the longest; a padding row sits at the sequence's ``position`` and
        sees only itself. The step's KV lands in slots ``past .. past + q - 1`` of every row
        (``past`` = the cache length); :func:`commit_kv` then keeps what each sequence accepted.
        When every feed is a causal chain of one length right after a full cache (one sequence, or
        a batch in lockstep), eager and SDPA get no mask (the model builds its own) and flex a
        chain ``BlockMask``.
        """
        past = cache.get_seq_length()
        q = max(len(f.tokens) for f in feeds)
        if any(f.position > past for f in feeds):
            raise ValueError(f"a sequence's committed KV cannot be longer than the cache ({past})")
        device = self.device
        offsets = torch.zeros(len(feeds), q, dtype=torch.long)
        visible = torch.eye(q, dtype=torch.bool).repeat(len(feeds), 1, 1)
        for b, f in enumerate(feeds):
            n = len(f.tokens)
            offsets[b, :n] = f.offsets
            visible[b, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril() if f.visible is None else f.visible
        positions = torch.tensor([f.position for f in feeds])
        chain = all(f.visible is None and len(f.tokens) == q and f.position == past for f in feeds)
        if self.flex is not None:
            masks = self.flex.masks(self.windows, past, positions, None if chain else offsets,
                                    None if chain else visible, q)
        elif chain:
            masks = None
        else:
            valid = None if bool((positions == past).all()) else positions
            masks = {
                kind: attention_mask(offsets, visible, past, positions, sliding_window=window, dtype=self.dtype,
                                     device=device, valid=valid)
                for kind, window in self.windows.items()
            }
        mask = next(iter(masks.values())) if masks is not None and len(masks) == 1 else masks
        needed = torch.unique(torch.cat([f.logit_rows for f in feeds]))            # sorted, shared by the batch
        kwargs = {self._cache_kw: cache}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = needed.to(device)
        out = self.model(
            input_ids=torch.tensor([f.tokens + [0] * (q - len(f.tokens)) for f in feeds], device=device),
            position_ids=(positions[:, None] + offsets).to(device),
            attention_mask=mask,
            use_cache=True,
            output_hidden_states=hidden,
            **kwargs,
        )
        logits = out.logits if self._keeps_logits else out.logits[:, needed.to(device)]      # (B, r, V)
        per_feed = [logits[0]] if len(feeds) == 1 else \
            [logits[b, torch.searchsorted(needed, f.logit_rows).to(device)] for b, f in enumerate(feeds)]
        if not hidden:
            return per_feed
        states = out.hidden_states[-1]                  # after the final norm: what the LM head reads
        return [(lg, states[b, f.logit_rows.to(device)]) for b, (lg, f) in enumerate(zip(per_feed, feeds))]


@dataclass(frozen=True)
class Feed:
    """One sequence's part of a batched forward."""

    tokens: list[int]
    offsets: torch.Tensor            # (q,) positions relative to ``position``
    visible: torch.Tensor | None     # (q, q) bool; None: a causal chain
    position: int                    # the sequence's committed KV length = position of its first token
    logit_rows: torch.Tensor         # (r,) sorted rows whose logits are returned


def commit_kv(cache: DynamicCache, past: int, keep_rows: list[list[int]], valid: list[int] | None = None) -> None:
    """Keep the rows each sequence accepted in the last step and drop the rest.

    ``past`` is the cache length before the step (its rows start there); ``keep_rows[b]`` lists
    sequence b's kept rows relative to ``past``, sorted; ``valid[b]`` is its committed KV length
    before the step (default ``past`` for every sequence). The kept rows move to slots
    ``valid[b], valid[b] + 1, ...``, so each sequence's KV stays a prefix of its cache row, slot =
    position; the cache is cut to the longest. Only the moved rows are copied.
    """
    valid = valid if valid is not None else [past] * len(keep_rows)
    moves = [(b, start + i, past + r) for b, (start, rows) in enumerate(zip(valid, keep_rows))
             for i, r in enumerate(rows) if start + i != past + r]
    new_len = max(start + len(rows) for start, rows in zip(valid, keep_rows))
    if moves:
        row, dst, src = torch.tensor(moves).T
    for layer in cache.layers:
        if moves:
            device = layer.keys.device
            row, dst, src = row.to(device), dst.to(device), src.to(device)
            layer.keys[row, :, dst] = layer.keys[row, :, src]
            layer.values[row, :, dst] = layer.values[row, :, src]
        layer.keys = layer.keys[..., :new_len, :]
        layer.values = layer.values[..., :new_len, :]


def truncate_kv(cache: DynamicCache, length: int) -> None:
    """Drop every cached position from ``length`` on."""
    for layer in cache.layers:
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


def select_sequences(cache: DynamicCache, rows: list[int], length: int) -> None:
    """Keep only the cache rows ``rows`` (in that order), cut to ``length`` slots."""
    index = torch.tensor(rows)
    for layer in cache.layers:
        layer.keys = layer.keys[index.to(layer.keys.device), :, :length]
        layer.values = layer.values[index.to(layer.values.device), :, :length]


def sequence_cache(cache: DynamicCache, row: int, length: int) -> DynamicCache:
    """A cache of its own for sequence ``row``: its first ``length`` slots (the cache itself if it holds
    that sequence alone)."""
    if cache.layers and cache.layers[0].keys.shape[0] == 1:
        truncate_kv(cache, length)
        return cache
    own = DynamicCache()
    for i, layer in enumerate(cache.layers):
        own.update(layer.keys[row:row + 1, :, :length].clone(), layer.values[row:row + 1, :, :length].clone(), i)
    return own


def _attention_windows(config) -> dict[str, int | None]:
    """Attention type -> sliding window (None = full attention) for the layers this model has."""
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        # Mistral-style configs: one window for every layer, or none.
        return {_FULL: getattr(config, "sliding_window", None)}
    windows: dict[str, int | None] = {}
    for kind in dict.fromkeys(layer_types):
        if kind == _FULL:
            windows[kind] = None
        elif kind == _SLIDING:
            windows[kind] = config.sliding_window
        else:
            raise ValueError(f"layer type {kind!r} is not supported (only {_FULL!r} and {_SLIDING!r})")
    return windows

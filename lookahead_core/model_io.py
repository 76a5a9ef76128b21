"""The only place that touches the model: its forward call and the KV cache API.

No model class is imported and nothing is patched. What differs between architectures is read
from the config: which attention types the layers use (``config.layer_types``, or a single
``config.sliding_window`` as Mistral has) and therefore which masks the forward needs.
"""

from __future__ import annotations

import inspect
import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .inputs import vocab_size
from .layout import attention_mask
from .positions import position_limit

SUPPORTED_ATTENTION = ("eager", "sdpa", "flex_attention")
_FULL, _SLIDING = "full_attention", "sliding_attention"
GQA_SDPA = "lookahead_gqa_sdpa"
"""transformers' SDPA attention with grouped-query heads folded into the query rows on branching
steps (:func:`gqa_sdpa_attention`); ``CausalLM`` selects it for a GQA model loaded with ``sdpa``."""


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
        if attn == "sdpa" and _kv_groups(config) > 1:
            model.set_attn_implementation(GQA_SDPA)          # the same SDPA, without repeat_kv on branching steps
        attn = "sdpa" if attn == GQA_SDPA else attn
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
        self._cache_kw = cache_keyword(model)
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters
        # Spread over devices by a device_map, the last hidden states (which logits_to_keep indexes)
        # are on the last device, and accelerate's hooks move every tensor argument of the model to
        # the first: logits_to_keep is then an int (the rows from the first one needed on).
        self.spread = len(set(getattr(model, "hf_device_map", {}).values())) > 1
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

    def commit(self, cache: DynamicCache, past: int, keep_rows: list[list[int]], valid: list[int] | None = None,
               also: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """After a step: keep the rows each sequence accepted (:func:`commit_kv`); ``also``: host
        tensors that travel to the model's device in the same copy as the moved rows' indices."""
        return commit_kv(cache, past, keep_rows, valid, also, self.device)

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

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """The base's hidden states a step with ``hidden`` returns, side by side (r, k * H): the last
        (after the final norm: what the LM head reads), then those a drafter fuses (EAGLE-3's
        ``aux_layers``, indices into ``hidden_states``; index L, the layer count, is the last
        layer's output before the final norm, as every EAGLE-3 layout counts it, where
        transformers' ``hidden_states[L]`` is after it: :func:`last_layer_output`)."""
        return (-1, *(i for d in self.drafters.values() for i in getattr(d, "aux_layers", ())))

    def forward_batch(self, cache: DynamicCache, feeds: list[Feed], hidden: bool = False):
        """One forward over every sequence of the batch (``feeds[b]`` is cache row b); logits per sequence
        (with ``hidden``: ``(logits, hidden states)`` per sequence, of its ``logit_rows`` and its
        ``hidden_rows``: the last layer's, and any other :attr:`feature_layers`' beside them).

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
        offsets = torch.zeros(len(feeds), q, dtype=torch.long)
        visible = torch.eye(q, dtype=torch.bool).repeat(len(feeds), 1, 1)
        for b, f in enumerate(feeds):
            n = len(f.tokens)
            offsets[b, :n] = f.offsets
            visible[b, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril() if f.visible is None else f.visible
        positions = torch.tensor([f.position for f in feeds])
        chain = all(f.visible is None and len(f.tokens) == q and f.position == past for f in feeds)
        needed = torch.unique(torch.cat([f.logit_rows for f in feeds]))            # sorted, shared by the batch
        # Every index the step needs reaches the device in one copy (tests/test_transfers.py counts them).
        host = {"input_ids": torch.tensor([f.tokens + [0] * (q - len(f.tokens)) for f in feeds]),
                "position_ids": positions[:, None] + offsets, "needed": needed, "positions": positions}
        if len(feeds) > 1:
            host |= {f"pick{b}": torch.searchsorted(needed, f.logit_rows) for b, f in enumerate(feeds)}
        if hidden:
            host |= {f"rows{b}": f.logit_rows if f.hidden_rows is None else f.hidden_rows for b, f in enumerate(feeds)}
        if not chain:
            host |= {"offsets": offsets, "visible": visible}
        on = to_device(host, self.device)
        if self.flex is not None:
            masks = self.flex.masks(self.windows, past, on["positions"],
                                    None if chain else on["offsets"], None if chain else on["visible"], q)
        elif chain:
            masks = None
        else:
            valid = None if bool((positions == past).all()) else on["positions"]
            masks = {
                kind: attention_mask(on["offsets"], on["visible"], past, on["positions"], sliding_window=window,
                                     dtype=self.dtype, device=self.device, valid=valid)
                for kind, window in self.windows.items()
            }
        mask = next(iter(masks.values())) if masks is not None and len(masks) == 1 else masks
        kwargs = {self._cache_kw: cache}
        first = 0                                          # the row of the model's first logits
        if self._keeps_logits and not self.spread:
            kwargs["logits_to_keep"] = on["needed"]
        elif self._keeps_logits:
            first = int(needed[0])
            kwargs["logits_to_keep"] = q - first
        layers = self.feature_layers if hidden else (-1,)
        with last_layer_output(self.model) if len(layers) > 1 else nullcontext() as pre_norm:
            out = self.model(
                input_ids=on["input_ids"],
                position_ids=on["position_ids"],
                attention_mask=mask,
                use_cache=True,
                output_hidden_states=hidden,
                **kwargs,
            )
        # Each index goes to the device of what it indexes (a no-op on one device, and under a
        # device_map, whose hooks return the outputs on the device of the inputs).
        kept = self._keeps_logits and not self.spread
        logits = out.logits if kept else out.logits[:, (on["needed"] - first).to(out.logits.device)]     # (B, r, V)
        per_feed = [logits[0]] if len(feeds) == 1 else \
            [logits[b, on[f"pick{b}"].to(logits.device)] for b in range(len(feeds))]
        if not hidden:
            return per_feed
        last, top = out.hidden_states[-1], len(out.hidden_states) - 1
        states = last if len(layers) == 1 else \
            torch.cat([(pre_norm[-1] if i == top else out.hidden_states[i]).to(last.device) for i in layers], -1)
        return [(lg, states[b, on[f"rows{b}"].to(states.device)]) for b, lg in enumerate(per_feed)]


@contextmanager
def last_layer_output(model: torch.nn.Module):
    """During a forward of ``model``, the output of its last decoder layer (``[tensor]``): the
    residual stream after every layer, before the final norm."""
    layers = decoder_layers(model)
    seen: list[torch.Tensor] = []
    handle = layers[-1].register_forward_hook(
        lambda module, args, output: seen.append(output[0] if isinstance(output, tuple) else output))
    try:
        yield seen
    finally:
        handle.remove()


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The model's list of decoder layers (``layers``, GPT-2's ``h``: the decoder's list of as many
    modules as the config has layers)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    for child in model.get_decoder().children():
        if isinstance(child, torch.nn.ModuleList) and len(child) == config.num_hidden_layers:
            return child
    raise ValueError(f"{type(model).__name__} has no list of its {config.num_hidden_layers} decoder layers: "
                     "its hidden states cannot be read")


class ForwardClock:
    """Times forwards (the model's, a drafter's) without stalling the host between them: on a GPU
    each span is a pair of CUDA events recorded around the work (no synchronize), read at the end,
    waiting once for the last one recorded; elsewhere the wall clock (CPU work is done when its
    call returns)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.last = None                # the end event recorded last, until it has been waited for

    def start(self) -> list:
        """A span opened now (before the work is launched)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record(torch.cuda.current_stream(self.device))
            return [event, None]
        return [time.perf_counter(), None]

    def stop(self, span: list) -> None:
        """Close ``span`` (after the work is launched; on a GPU the event marks when it ran)."""
        if self.cuda:
            span[1] = self.last = torch.cuda.Event(enable_timing=True)
            span[1].record(torch.cuda.current_stream(self.device))
        else:
            span[1] = time.perf_counter()

    @contextmanager
    def span(self):
        """``with clock.span() as span: <work>``; ``span`` goes to :meth:`seconds`."""
        span = self.start()
        yield span
        self.stop(span)

    def seconds(self, spans) -> float:
        """The spans' total, in seconds (on a GPU: first waits for the last span this clock closed,
        once: the events on one stream complete in order)."""
        if not spans:
            return 0.0
        if self.cuda:
            if self.last is not None:
                self.last.synchronize()
                self.last = None
            return sum(start.elapsed_time(end) for start, end in spans) / 1e3
        return sum(end - start for start, end in spans)


def cache_keyword(module: torch.nn.Module) -> str:
    """The keyword under which ``module``'s forward (a model, a decoder layer, an attention) takes the
    KV cache, read from its signature: ``cache`` in newer transformers, ``past_key_values`` before,
    ``layer_past`` in some layers (GPT-NeoX's). A module's ``**kwargs`` swallows any other name without
    a word, and the cache goes unread (tests/test_module_keywords.py)."""
    params = inspect.signature(module.forward).parameters
    found = [name for name in _CACHE_KEYWORDS if name in params]
    if not found:
        raise ValueError(f"{type(module).__name__}.forward takes no KV cache (none of "
                         f"{', '.join(f'`{n}`' for n in _CACHE_KEYWORDS)}): not a module of a causal LM served here")
    return found[0]


_CACHE_KEYWORDS = ("cache", "past_key_values", "layer_past")


def to_device(tensors: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """Integer and bool host tensors on ``device`` in one copy (one host-to-device transfer, not one
    per tensor); each keeps its shape and dtype."""
    flat = torch.cat([t.reshape(-1).to(torch.long) for t in tensors.values()]).to(device)
    out, at = {}, 0
    for name, t in tensors.items():
        out[name] = flat[at:at + t.numel()].view(t.shape).to(t.dtype)
        at += t.numel()
    return out


@dataclass(frozen=True)
class Feed:
    """One sequence's part of a batched forward."""

    tokens: list[int]
    offsets: torch.Tensor            # (q,) positions relative to ``position``
    visible: torch.Tensor | None     # (q, q) bool; None: a causal chain
    position: int                    # the sequence's committed KV length = position of its first token
    logit_rows: torch.Tensor         # (r,) sorted rows whose logits are returned
    hidden_rows: torch.Tensor | None = None   # rows whose hidden states are returned (default: logit_rows)


def commit_kv(cache: DynamicCache, past: int, keep_rows: list[list[int]], valid: list[int] | None = None,
              also: dict[str, torch.Tensor] | None = None, device: torch.device | None = None) -> dict[str, torch.Tensor]:
    """Keep the rows each sequence accepted in the last step and drop the rest; return ``also``
    (integer host tensors) on ``device``, moved in the same copy as the moved rows' indices.

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
    host = dict(also or {}) | ({"moves": torch.tensor(moves).T} if moves else {})
    on = to_device(host, device or cache.layers[0].keys.device) if host else {}
    index = _on_devices(cache, on["moves"]) if moves else {}    # one copy, not one per layer
    for layer in cache.layers:
        if moves:
            row, dst, src = index[layer.keys.device]
            layer.keys[row, :, dst] = layer.keys[row, :, src]
            layer.values[row, :, dst] = layer.values[row, :, src]
        layer.keys = layer.keys[..., :new_len, :]
        layer.values = layer.values[..., :new_len, :]
    return {name: on[name] for name in also or {}}


def _on_devices(cache: DynamicCache, index: torch.Tensor) -> dict[torch.device, torch.Tensor]:
    """``index`` on every device the cache's layers live on (one device, unless a ``device_map``
    spreads the model; a device index moves between devices without the host)."""
    return {device: index.to(device) for device in dict.fromkeys(layer.keys.device for layer in cache.layers)}


def truncate_kv(cache: DynamicCache, length: int) -> None:
    """Drop every cached position from ``length`` on."""
    for layer in cache.layers:
        layer.keys = layer.keys[..., :length, :]
        layer.values = layer.values[..., :length, :]


def select_sequences(cache: DynamicCache, rows: list[int] | torch.Tensor, length: int) -> None:
    """Keep only the cache rows ``rows`` (in that order; a list, or already a tensor on the device),
    cut to ``length`` slots."""
    index = _on_devices(cache, rows if isinstance(rows, torch.Tensor) else torch.tensor(rows))
    for layer in cache.layers:
        layer.keys = layer.keys[index[layer.keys.device], :, :length]
        layer.values = layer.values[index[layer.values.device], :, :length]


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


def gqa_sdpa_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                       **kwargs):
    """transformers' ``sdpa`` attention, except on a step of several rows under a mask (a branching
    step) of a grouped-query model. There transformers copies K and V once per query head
    (``repeat_kv``: 4x on Llama-3-8B and Mistral-7B) in every layer, since SDPA's masked kernels take
    no ``enable_gqa``; here the query heads that share a K/V head are stacked along the query rows
    instead, the mask repeated with them (once per step, not per layer), and SDPA attends to the
    cache's K/V as they are. Every other call is transformers' own."""
    groups = getattr(module, "num_key_value_groups", 1)
    batch, heads, rows, dim = query.shape
    if groups == 1 or rows == 1 or attention_mask is None or attention_mask.shape[1] != 1 \
            or any(kwargs.get(name) is not None for name in _CHANGES_THE_SCORES):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    out = torch.nn.functional.scaled_dot_product_attention(
        query.reshape(batch, heads // groups, groups * rows, dim), key, value,
        attn_mask=_stacked_mask(attention_mask, groups), dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, rows, -1).transpose(1, 2).contiguous(), None


_CHANGES_THE_SCORES = ("softcap", "position_bias", "s_aux", "sinks", "output_attentions")   # left to transformers
_STACKED: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}


def _stacked_mask(mask: torch.Tensor, groups: int) -> torch.Tensor:
    """``mask`` (B, 1, q, kv) repeated ``groups`` times along q, made once per mask (every layer of a
    step gets the same mask object)."""
    held = _STACKED.get(id(mask))
    if held is not None and held[0]() is mask and held[1] == groups:
        return held[2]
    stacked = mask.repeat(1, 1, groups, 1)
    _STACKED[id(mask)] = (weakref.ref(mask, lambda _, key=id(mask): _STACKED.pop(key, None)), groups, stacked)
    return stacked


AttentionInterface.register(GQA_SDPA, gqa_sdpa_attention)
AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)      # the model's own masks (plain causal steps): SDPA's


def _kv_groups(config) -> int:
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None) or heads
    return heads // kv if heads and kv else 1


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

"""The only place that touches the model: its forward call and the KV cache API.

No model class is imported and nothing is patched. What differs between architectures is read
from the config: which attention types the layers use (``config.layer_types``, or a single
``config.sliding_window`` as Mistral has) and therefore which masks the forward needs.
"""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from .inputs import vocab_size
from .layout import attention_mask
from .positions import position_limit

SUPPORTED_ATTENTION = ("eager", "sdpa")
_FULL, _SLIDING = "full_attention", "sliding_attention"


class CausalLM:
    """A Hugging Face causal LM seen through ``model(input_ids, position_ids, attention_mask, cache)``.

    A step whose rows branch (window, several candidates) passes an explicit float 4-D mask per
    attention type. A step that is a plain causal chain (the prefill, greedy steps, one candidate
    and no window) passes none: the model builds its own causal mask, which lets SDPA take its
    unmasked kernel for 1-token steps, as ``generate`` does. The cache is a plain ``DynamicCache``
    that keeps every position: sliding-window layers get the window from the mask (ours, or the
    model's own, built from the same positions) instead of from a cache that drops old rows, which
    keeps KV commits a simple re-index.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        config = model.config
        attn = getattr(config, "_attn_implementation", None) or "eager"
        if attn not in SUPPORTED_ATTENTION:
            raise ValueError(
                f"attention implementation {attn!r} takes no custom 4-D mask; load the model with "
                f"attn_implementation in {SUPPORTED_ATTENTION}"
            )
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError("encoder-decoder models are not supported; pass a causal LM")
        self.model = model
        self.windows = _attention_windows(config)
        self.vocab_size = vocab_size(model)
        self.position_limit = position_limit(config)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in params

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.dtype

    @staticmethod
    def new_cache() -> DynamicCache:
        return DynamicCache()

    def forward(
        self,
        cache: DynamicCache,
        tokens: list[int],
        offsets: torch.Tensor,
        visible: torch.Tensor | None,
        position: int,
        logit_rows: torch.Tensor,
    ) -> torch.Tensor:
        """Feed ``tokens`` at ``position + offsets`` after the cache; return logits (r, V) of ``logit_rows``.

        ``visible=None`` declares the tokens a causal chain right after the cache (``offsets`` =
        0..q-1, ``position`` = cache length): the model then builds its own mask.
        """
        past = cache.get_seq_length()
        device = self.device
        if visible is None:
            if position != past:
                raise ValueError(f"a causal chain must start right after the cache ({past}), not at {position}")
            mask = None
        else:
            masks = {
                kind: attention_mask(offsets, visible, past, position, sliding_window=window, dtype=self.dtype,
                                     device=device)
                for kind, window in self.windows.items()
            }
            mask = next(iter(masks.values())) if len(masks) == 1 else masks
        kwargs = {self._cache_kw: cache}
        if self._keeps_logits:
            kwargs["logits_to_keep"] = logit_rows.to(device)
        out = self.model(
            input_ids=torch.tensor([tokens], device=device),
            position_ids=(position + offsets).to(device)[None],
            attention_mask=mask,
            use_cache=True,
            **kwargs,
        )
        logits = out.logits[0]                                            # (r or q, V)
        return logits if self._keeps_logits else logits[logit_rows.to(device)]


def commit_kv(cache: DynamicCache, past: int, keep_rows: list[int]) -> None:
    """Keep the committed rows of the last step (given relative to ``past``) and drop the rest.

    ``keep_rows`` is sorted and starts with 0 (the input token), so the rows only move left:
    copying them into place and slicing touches just the accepted rows, not the whole cache.
    """
    keep = torch.tensor(keep_rows) + past
    new_len = past + len(keep_rows)
    contiguous = keep_rows == list(range(len(keep_rows)))
    for layer in cache.layers:
        if not contiguous:
            index = keep.to(layer.keys.device)
            layer.keys[..., past:new_len, :] = layer.keys[..., index, :]
            layer.values[..., past:new_len, :] = layer.values[..., index, :]
        layer.keys = layer.keys[..., :new_len, :]
        layer.values = layer.values[..., :new_len, :]


def truncate_kv(cache: DynamicCache, length: int) -> None:
    """Drop every cached position from ``length`` on."""
    commit_kv(cache, length, [])


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

"""Tiny random models for tests, and the harness's ``tiny-<arch>`` model specs (conf/model/tiny_*.yaml):
token ids in, logits out; no tokenizer (tiny_tokenizer.py stands in)."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
)

TINY_ARCHS: tuple[str, ...] = ("llama", "mistral", "qwen2", "gemma3")

GEMMA3_TINY_WINDOW = 16
"""Gemma 3 always has sliding layers; a small default window lets short tests run past it."""

_TINY_SHAPE: dict[str, object] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 2048,
    # At the default 0.02 the logits are nearly uniform: greedy near-ties and dull text. At 0.5
    # the top-2 logit gap is typically 0.01-1.
    "initializer_range": 0.5,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": None,
    # No eos, so generation always runs to max_new_tokens; pass eos_token_id=... to test stopping.
    "eos_token_id": None,
}

# What each block writes into the residual stream is scaled by this, so that the current token's
# embedding and the context both matter: the text then varies, yet repeats n-grams now and then,
# which gives lookahead something to find. Measured over 96 greedy tokens from 8 seeds: 25-60
# distinct tokens, 0-60% repeated 4-grams (median 13-19%), no top-2 logit gap under 1e-3. Lower
# gains turn the model into a fixed token->token map that cycles; at gain 1 Llama-style models
# never repeat. Qwen2's q/k/v biases need a lower gain for the same effect; Gemma 3 normalises
# each block's output, so there the gain sets the post-norm scale.
_TINY_RESIDUAL_GAIN: dict[str, float] = {"llama": 0.01, "mistral": 0.01, "qwen2": 0.006, "gemma3": 2.0}


def _alternating_layer_types(num_layers: int) -> list[str]:
    return ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(num_layers)]


def tiny_config(
    arch: str, *, vocab_size: int = 128, sliding_window: int | None = None, **overrides: object
) -> PretrainedConfig:
    """The config of a tiny model: 2 layers, hidden 64, 4 heads, 2 kv heads (GQA).

    sliding_window: mistral uses it in every layer; qwen2 in the upper half of its layers (lower
    half full); gemma3 in alternate layers (default ``GEMMA3_TINY_WINDOW``); llama has none.
    overrides: any config field (e.g. ``num_hidden_layers=4``, ``eos_token_id=3``).
    """
    fields = {**_TINY_SHAPE, "vocab_size": vocab_size, **overrides}
    layers = int(fields["num_hidden_layers"])
    if arch == "llama":
        if sliding_window is not None:
            raise ValueError("llama has no sliding window; use mistral, qwen2 or gemma3")
        return LlamaConfig(**fields)
    if arch == "mistral":
        return MistralConfig(sliding_window=sliding_window, **fields)
    if arch == "qwen2":
        windowed = {"use_sliding_window": True, "sliding_window": sliding_window, "max_window_layers": layers // 2}
        return Qwen2Config(**(windowed if sliding_window is not None else {}), **fields)
    if arch == "gemma3":
        head_dim = int(fields["hidden_size"]) // int(fields["num_attention_heads"])
        gemma = {
            "head_dim": head_dim,
            "query_pre_attn_scalar": head_dim,
            "sliding_window": sliding_window if sliding_window is not None else GEMMA3_TINY_WINDOW,
            "layer_types": _alternating_layer_types(layers),
        }
        return Gemma3TextConfig(**{**gemma, **fields})
    raise ValueError(f"unknown tiny architecture {arch!r}; choose from {TINY_ARCHS}")


def _scale_residual_writes(model: PreTrainedModel, arch: str, gain: float) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if arch == "gemma3":
                # Gemma's RMSNorm multiplies by (1 + weight).
                if name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
                    param.fill_(gain - 1.0)
            elif name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
                param.mul_(gain)


def tiny_random_model(
    arch: str,
    *,
    seed: int = 0,
    vocab_size: int = 128,
    attn_implementation: str = "sdpa",
    sliding_window: int | None = None,
    residual_gain: float | None = None,
    **overrides: object,
) -> PreTrainedModel:
    """A tiny randomly initialised fp32 model in eval mode, identical for identical arguments.

    Tests feed token ids directly, e.g.::

        model = tiny_random_model("gemma3", sliding_window=8)
        ids = torch.tensor([[5, 17, 3, 99]])
        out = model.generate(ids, max_new_tokens=20, do_sample=False)

    residual_gain: see ``_TINY_RESIDUAL_GAIN`` (defaults per architecture); 1.0 gives the stock
    initialisation, whose output depends more on context and hardly ever repeats.
    The global RNG is left as it was.
    """
    config = tiny_config(arch, vocab_size=vocab_size, sliding_window=sliding_window, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation=attn_implementation
        )
    _scale_residual_writes(model, arch, _TINY_RESIDUAL_GAIN[arch] if residual_gain is None else residual_gain)
    return model.eval()

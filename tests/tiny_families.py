"""Tiny random models of the architecture families the probe is tested on (2 layers, width 64).

Each entry: transformers config class name and the fields that make it tiny. The families that
pass the probe are those the README lists; ``REFUSED`` build their positions from key indices
(ALiBi) and are refused by it.
"""

from __future__ import annotations

import torch
import transformers
from transformers import AutoModelForCausalLM

VOCAB = 128
_DECODER = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": VOCAB, "max_position_embeddings": 256}

PASSING: dict[str, tuple[str, dict]] = {
    "llama": ("LlamaConfig", _DECODER),
    "mistral": ("MistralConfig", _DECODER),
    "qwen2": ("Qwen2Config", _DECODER),
    "qwen3": ("Qwen3Config", {**_DECODER, "head_dim": 16}),
    "gemma2": ("Gemma2Config", {**_DECODER, "head_dim": 16, "sliding_window": 8}),
    "gemma3": ("Gemma3TextConfig", {**_DECODER, "head_dim": 16, "sliding_window": 8}),
    "phi3": ("Phi3Config", {**_DECODER, "pad_token_id": 0}),
    "gpt_neox": ("GPTNeoXConfig", {k: v for k, v in _DECODER.items() if k != "num_key_value_heads"}),
    "olmo2": ("Olmo2Config", _DECODER),
    "granite": ("GraniteConfig", _DECODER),
    "starcoder2": ("Starcoder2Config", _DECODER),
    "gpt2": ("GPT2Config", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256, "vocab_size": VOCAB}),
    "cohere": ("CohereConfig", _DECODER),
    "stablelm": ("StableLmConfig", _DECODER),
    "falcon_rotary": ("FalconConfig", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                       "vocab_size": VOCAB, "alibi": False}),
    "opt": ("OPTConfig", {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "word_embed_proj_dim": 64, "vocab_size": VOCAB, "max_position_embeddings": 256}),
    "gptj": ("GPTJConfig", {"n_embd": 64, "n_layer": 2, "n_head": 4, "rotary_dim": 8, "n_positions": 256,
                            "vocab_size": VOCAB}),
    "gpt_bigcode": ("GPTBigCodeConfig", {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256,
                                         "vocab_size": VOCAB}),
    "mixtral": ("MixtralConfig", {**_DECODER, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "persimmon": ("PersimmonConfig", {k: v for k, v in _DECODER.items() if k != "num_key_value_heads"}),
}

REFUSED: dict[str, tuple[str, dict]] = {
    "mpt": ("MptConfig", {"d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": VOCAB, "max_seq_len": 256}),
    "bloom": ("BloomConfig", {"hidden_size": 64, "n_head": 4, "n_layer": 2, "vocab_size": VOCAB}),
    "falcon_alibi": ("FalconConfig", {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                                      "vocab_size": VOCAB, "alibi": True}),
}


def tiny_family_model(family: str, *, attn_implementation: str = "sdpa", seed: int = 0, strict: bool = False,
                      **overrides) -> torch.nn.Module:
    """A tiny random fp32 model of ``family`` in eval mode; falls back to eager where SDPA is missing
    (``strict``: raises instead)."""
    class_name, fields = {**PASSING, **REFUSED}[family]
    # No special ids: the configs' defaults point outside the tiny vocabulary.
    config = getattr(transformers, class_name)(**{"bos_token_id": None, "eos_token_id": None, **fields, **overrides})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
        except ValueError:   # e.g. MPT and Bloom have no SDPA path
            if strict:
                raise
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    return model.eval()

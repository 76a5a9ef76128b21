"""The run's shapes and sizes: the mission models' published shapes (and tiny stand-ins), the
plans of a GPU run and of the CPU smoke test, the decoders checked and timed, and random-weight
models, drafters, prompts and pools built from them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import transformers
from transformers import AutoModelForCausalLM

from lookahead_core import DecodeState, LookaheadConfig, NGramPool
from lookahead_core import cost as cm
from lookahead_core.capability import attention_verdict
from lookahead_core.eagle import Eagle3Drafter, default_layer_ids, eagle3_config
from lookahead_core.medusa import for_model


@dataclass(frozen=True)
class Family:
    """A mission model's published shape (its Hugging Face config), and a tiny stand-in of the same
    structure (MHA or GQA, sliding window or not) for the CPU."""

    name: str
    config_class: str
    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    vocab_size: int
    rope_theta: float
    max_positions: int
    sliding_window: int | None = None
    layers: int = 32

    def config(self, *, tiny: bool, layers: int | None = None, window: int | None = None):
        dims = dict(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                    num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, vocab_size=self.vocab_size)
        if tiny:
            dims = dict(hidden_size=64, intermediate_size=64 * self.intermediate_size // self.hidden_size,
                        num_attention_heads=4, num_key_value_heads=4 * self.kv_heads // self.heads,
                        vocab_size=96 + self.vocab_size // 1000 + self.vocab_size % 1000 // 16)
        extra = {}
        if self.sliding_window is not None:
            extra["sliding_window"] = window or self.sliding_window
        return getattr(transformers, self.config_class)(
            **dims, num_hidden_layers=layers or (2 if tiny else self.layers), max_position_embeddings=self.max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta}, rms_norm_eps=1e-5,
            bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False, **extra)


FAMILIES: dict[str, Family] = {
    "llama2_7b": Family("Llama-2-7B", "LlamaConfig", 4096, 11008, 32, 32, 32000, 1e4, 4096),
    "llama3_8b": Family("Llama-3-8B", "LlamaConfig", 4096, 14336, 32, 8, 128256, 5e5, 8192),
    "mistral_7b": Family("Mistral-7B", "MistralConfig", 4096, 14336, 32, 8, 32000, 1e4, 32768, sliding_window=4096),
    "codellama_7b": Family("CodeLlama-7B", "LlamaConfig", 4096, 11008, 32, 32, 32016, 1e6, 16384),
}


@dataclass(frozen=True)
class Plan:
    """Sizes of one run: the GPU's, or the tiny CPU smoke test's."""

    check_layers: int           # (a) reduced depth
    check_window: int           # (a) a sliding window that binds within the prompt + new tokens
    prompts: int
    prompt_length: int
    new_tokens: int
    sizes: tuple[int, ...]      # (b) k of t(k)
    kv_lengths: tuple[int, ...]
    repeats: int
    extra_rounds: int
    host_tokens: int            # (b) tokens of each timed decode
    traffic_tokens: int         # (b) tokens of each decode whose copies and syncs are counted (profiled)
    # seconds a piece is expected to take, before one of its kind has run (then: the longest so far);
    # flex_attention's are "new" where its kernels compile (a dtype and attention structure not yet run)
    estimates: dict


GPU_PLAN = Plan(check_layers=2, check_window=64, prompts=2, prompt_length=128, new_tokens=48,
                sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256),
                kv_lengths=(512, 2048), repeats=3, extra_rounds=2, host_tokens=48, traffic_tokens=16,
                estimates={"check_sdpa": 10, "check_flex_new": 60, "check_flex_reuse": 15, "time_sdpa": 35,
                           "time_flex_new": 60, "time_flex_reuse": 15})
TINY_PLAN = Plan(check_layers=2, check_window=16, prompts=2, prompt_length=24, new_tokens=16,
                 sizes=(1, 2, 4, 8, 16, 32, 64, 128), kv_lengths=(32, 128), repeats=1, extra_rounds=0, host_tokens=12,
                 traffic_tokens=8,
                 estimates={"check_sdpa": 2, "check_flex_new": 30, "check_flex_reuse": 2, "time_sdpa": 3,
                            "time_flex_new": 30, "time_flex_reuse": 2})

# (a): what is checked against greedy, per family and attention implementation.
LOOKAHEAD = LookaheadConfig(window=5, ngram=4, guess=5)
POOL = LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True)         # keep_pool: the state's pool is used
CHECKS: dict[str, LookaheadConfig] = {
    "lookahead": LOOKAHEAD,
    "lookahead_pool": LookaheadConfig(window=5, ngram=4, guess=5, prompt_pool=True),
    "pool_used": POOL,
    "tree": cm.tree_config(16),
    "lookahead_tree": LookaheadConfig(window=5, ngram=4, guess=5, prompt_pool=True, tree=True,
                                      sources={"suffix": 4, "recycle": 4}, depth=6,
                                      budget=LOOKAHEAD.max_tokens_per_step),
    "medusa": LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, depth=4, sources={"medusa": 15}),
    "eagle": LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, depth=6, sources={"eagle": 10}),
    "eagle_tree": LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True, prompt_pool=True, tree=True, depth=6,
                                  budget=12, sources={"suffix": 4, "recycle": 4, "eagle": 10}),
}
DRAFTED = ("medusa", "eagle", "eagle_tree")      # the checks whose model carries the random drafters
BATCH_CHECKS: dict[str, LookaheadConfig | None] = {"batch_greedy": None, "batch_lookahead_pool": CHECKS["lookahead_pool"]}
MEDUSA_HEADS = 4
EAGLE_DRAFT_VOCAB = 32000       # EAGLE-3's published drafters for Llama-3.1-8B draft over 32k tokens

# (b): the decode loop's host cost, on steps that accept drafts.
PAPER = LookaheadConfig(window=15, ngram=5, guess=15)
# flex_attention's pieces: MHA first, then GQA with a sliding window; the other two reuse their kernels.
FLEX_ORDER = ("llama2_7b", "mistral_7b", "llama3_8b", "codellama_7b")


def random_prompts(vocab: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """Random prompts with a repeated motif, so that the prompt pool has something to find."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        motif = torch.randint(0, vocab, (8,), generator=gen).tolist()
        noise = torch.randint(0, vocab, (length,), generator=gen).tolist()
        out.append((motif + noise[: length // 2] + motif + noise[length // 2:])[:length])
    return out


def used_pool(config: LookaheadConfig, prompt: list[int], greedy: Sequence[int]) -> DecodeState:
    """A state whose pool the decoder keeps (capacity = G, the config's ``keep_pool``), holding every
    n-gram of the greedy continuation: steps accept up to N-1 drafts and commit several KV rows."""
    if not config.keep_pool:
        raise ValueError("the decoder keeps a state's pool only with keep_pool")
    pool = NGramPool(config.ngram, config.guess)
    pool.add_from_sequence(prompt[-1:] + list(greedy))
    return DecodeState.with_pool(pool)



def build(family: Family, device: torch.device, dtype: torch.dtype, *, tiny: bool, layers: int | None = None,
          window: int | None = None, seed: int = 0) -> torch.nn.Module:
    """Random weights of ``family``'s shape, allocated and initialised on ``device``."""
    config = family.config(tiny=tiny, layers=layers, window=window)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model = model.eval()
    if next(model.parameters()).device != device:      # a transformers that ignored the device context
        model = model.to(device)
    return model


def flex_kernels(family: Family, dtype: torch.dtype) -> tuple:
    """What flex_attention compiles its kernels for (the sliding window is a tensor: no new kernel)."""
    return str(dtype), family.kv_heads == family.heads


def admit(model: torch.nn.Module) -> None:
    """Raise the core's :class:`UnsupportedAttentionError` where the model's attention backend computes
    wrong logits on this device (torch's compiled CPU flex on AVX2): a refusal, not a failure."""
    verdict = attention_verdict(model)
    if not verdict.passed:
        raise verdict.error()


def to_flex(model: torch.nn.Module) -> None:
    """The same weights under flex_attention (the core then builds block masks)."""
    model.set_attn_implementation("flex_attention")


def random_heads(model: torch.nn.Module, seed: int = 0):
    """Medusa heads for ``model`` with random residual blocks (sharing the base's LM head)."""
    heads = for_model(model, MEDUSA_HEADS)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for head in heads.heads:
            for block in head:
                if hasattr(block, "linear"):
                    weight = torch.randn(block.linear.weight.shape, generator=gen) * 0.02
                    block.linear.weight.copy_(weight.to(block.linear.weight))
    return heads


def random_eagle(model: torch.nn.Module, seed: int = 0) -> Eagle3Drafter:
    """An EAGLE-3 drafter for ``model`` (its width, its default fused layers, a draft vocabulary of
    at most ``EAGLE_DRAFT_VOCAB`` tokens), random weights, on the model's device and dtype."""
    vocab = model.config.vocab_size
    draft = list(range(EAGLE_DRAFT_VOCAB)) if vocab > EAGLE_DRAFT_VOCAB else None
    torch.manual_seed(seed)
    with torch.device(model.device):
        drafter = Eagle3Drafter(model, eagle3_config(model, None if draft is None else len(draft)),
                                default_layer_ids(model), vocab=draft)
    return drafter.to(model.dtype)



def gpu_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "cpu" else torch.float16


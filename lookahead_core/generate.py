"""transformers' ``generate`` on this package's decode loop: ``model.generate(..., custom_generate=...)``.

transformers runs the ``generate`` function of a folder's (or a Hub repository's)
``custom_generate/generate.py`` in place of its own loop. The repository's ``hub/`` folder is such a
folder (on the installed package), and ``make hub`` builds the Hub repository, this package vendored
in it (hub/build.py); both call :func:`generate`::

    out = model.generate(**tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left"), max_new_tokens=128,
                         custom_generate="<clone>/hub", trust_remote_code=True, lookahead="auto")

What ``generate`` does and this does too: the generation config merged with the keyword arguments
as transformers merges them (model defaults, then the call's), the length as ``generate`` resolves it
(``max_new_tokens`` counts new tokens, ``max_length`` the input too, neither: 20 new tokens),
EOS ids, greedy or sampling (temperature, top-k, top-p, applied as transformers applies them),
stopping criteria and stop strings (checked after every token, so a sequence stops at exactly the
token it would stop at in ``generate``), a streamer (batch size 1, as in ``generate``), left-padded
batches, and the output: the input ids followed by the new ones, finished rows padded with the pad
id, or a ``GenerateDecoderOnlyOutput`` with ``sequences`` under ``return_dict_in_generate``. Any
other option that would change the output, or ask for what the loop does not record (scores,
logits, attentions, hidden states, beams, several return sequences, an assistant model, logits
processors beyond temperature/top-k/top-p), is refused with a ``ValueError`` naming it.

Options of its own (keyword arguments of ``generate``):

* ``lookahead`` (also read from the generation config, e.g. ``model.generation_config.lookahead``):
  ``"auto"`` (the default: the widest cost-aware token tree, each step feeding the
  nodes that pay on this device's latency curve, measured once per model and KV length in this
  process, and the draft acceptance learnt from the model's earlier calls), ``"lookahead"`` (the
  paper's W 15, N 5, G 15), ``"greedy"`` (this loop without drafts), a :class:`LookaheadConfig`,
  or a dict of its fields.
* ``latency_curve``: for ``"auto"`` instead of measuring: a :class:`lookahead_core.cost.CostModel`,
  or the path of a JSON file of its rows (``CostModel.to_rows()``, or a file holding them under
  ``"rows"``, as the harness's calibration cache keeps them).
* ``lookahead_stats``: a list; each sequence's :class:`DecodeStats` is appended to it.

A GQA model under SDPA decodes under ``lookahead_gqa_sdpa`` (:class:`CausalLM` switches it on the
first call); each call puts the model's own attention implementation back when it returns.

Greedy output is token-identical to transformers' greedy ``generate`` in float32
(tests/test_generate.py); sampling draws from the same distribution with other random numbers,
seeded from torch's generator (``torch.manual_seed`` repeats a call with a fixed config; ``auto``'s
tree changes as it learns, and with it which random numbers a call draws, not its distribution).
"""

from __future__ import annotations

import json
import os
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .cost import CostModel, kv_bucket, sizes_through, step_costs, widest_tree
from .config import DecodeLimits, LookaheadConfig, SamplingConfig
from .decoder import DecodeOutput, decode_batch
from .drafts import DraftStats
from .model_io import GQA_SDPA, CausalLM

PAPER = LookaheadConfig(window=15, ngram=5, guess=15)
PRESETS = ("auto", "lookahead", "greedy")

# Generation-config fields that change or add to the output, with the value that does neither.
_UNSERVED_FIELDS = {
    "num_beams": 1, "num_return_sequences": 1, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "output_scores": False, "output_logits": False, "output_attentions": False, "output_hidden_states": False,
    "prompt_lookup_num_tokens": None, "assistant_early_exit": None, "penalty_alpha": None, "dola_layers": None,
    "constraints": None, "force_words_ids": None, "guidance_scale": None, "watermarking_config": None,
    "token_healing": None, "use_mtp": None,
}
# Keyword arguments about transformers' own loop (its cache, compilation): refused when passed,
# since this loop keeps its own cache and would otherwise ignore them.
_LOOP_ARGUMENTS = ("past_key_values", "cache", "inputs_embeds", "cache_implementation", "cache_config",
                   "max_cache_len", "compile_config", "disable_compile", "prefill_chunk_size", "low_memory")
_SAMPLING_PROCESSORS = ("TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper")


@dataclass
class _ModelState:
    """What this process keeps per model between calls: its CausalLM (inspected once), ``auto``'s
    latency curves per KV bucket and the draft acceptance learnt so far; and the attention
    implementation ``CausalLM`` switched the model to (``switched``: each config it changed, with
    the value before and the one the decoder runs under), put back after every call."""

    lm: CausalLM
    switched: list[tuple[Any, Any, Any]] = field(default_factory=list)
    curves: dict[int, CostModel] = field(default_factory=dict)
    prior: DraftStats = field(default_factory=DraftStats)

    def attend(self, decoding: bool) -> None:
        """The decoder's attention implementation on the model (``decoding``), or the model's own:
        the configs' values set back as ``set_attn_implementation`` left them (a few attributes:
        the first switch, which walks every module, is not repeated per call)."""
        for config, before, during in self.switched:
            config._attn_implementation_internal = during if decoding else before


_STATES: weakref.WeakKeyDictionary[torch.nn.Module, _ModelState] = weakref.WeakKeyDictionary()


def _state(model: torch.nn.Module) -> _ModelState:
    """The model's state, made on its first call, or again when its attention implementation was
    changed since (the decoder inspects the model as it is)."""
    state = _STATES.get(model)
    if state is not None and state.lm.attention == _own_attention(model) \
            and all(c._attn_implementation_internal == before for c, before, _ in state.switched):
        return state
    configs = _configs(model)
    before = [c._attn_implementation_internal for c in configs]
    lm = CausalLM(model)
    switched = [(c, b, c._attn_implementation_internal) for c, b in zip(configs, before)
                if c._attn_implementation_internal != b]
    _STATES[model] = state = _ModelState(lm, switched)
    state.attend(False)
    return state


def _configs(model: torch.nn.Module) -> list:
    """Every config object the model and its sub-models read the attention implementation from."""
    found, todo = {}, [m.config for m in model.modules() if hasattr(getattr(m, "config", None), "sub_configs")]
    while todo:
        config = todo.pop()
        if id(config) not in found:
            found[id(config)] = config
            todo += [sub for key in config.sub_configs if hasattr(sub := getattr(config, key, None), "sub_configs")]
    return list(found.values())


def _own_attention(model: torch.nn.Module) -> str:
    """The model's attention implementation as ``CausalLM.attention`` names it."""
    attention = getattr(model.config, "_attn_implementation", None) or "eager"
    return "sdpa" if attention == GQA_SDPA else attention


def generate(model, inputs: torch.Tensor | None = None, generation_config=None, logits_processor=None,
             stopping_criteria=None, prefix_allowed_tokens_fn=None, synced_gpus=None, assistant_model=None,
             streamer=None, negative_prompt_ids=None, negative_prompt_attention_mask=None, *,
             lookahead: str | LookaheadConfig | Mapping[str, Any] | None = None,
             latency_curve: CostModel | str | os.PathLike | None = None, lookahead_stats: list | None = None,
             **kwargs):
    """``model.generate``'s arguments in, its output out, decoded by :func:`decode_batch` (module
    docstring: what is honoured, what is refused, the options of its own)."""
    # generate's own arguments this loop cannot serve: refused when given (anything but None / False)
    unserved = {"prefix_allowed_tokens_fn": prefix_allowed_tokens_fn, "synced_gpus": synced_gpus,
                "assistant_model": assistant_model, "negative_prompt_ids": negative_prompt_ids,
                "negative_prompt_attention_mask": negative_prompt_attention_mask}
    for name, given in unserved.items():
        if given not in (None, False):
            raise ValueError(f"lookahead generate: `{name}` is not supported (this decode loop does not run it)")
    for name in _LOOP_ARGUMENTS:
        if kwargs.get(name) is not None:
            raise ValueError(f"lookahead generate: `{name}` configures transformers' own decoding loop, which this "
                             "one replaces (it keeps its own KV cache); leave it out")
    input_ids = inputs if inputs is not None else kwargs.pop("input_ids", None)
    attention_mask = kwargs.pop("attention_mask", None)
    tokenizer = kwargs.pop("tokenizer", None)
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise ValueError("lookahead generate: pass `input_ids` (or `inputs`) as a 2-D tensor of token ids")
    if kwargs.pop("use_cache", True) is False:
        raise ValueError("lookahead generate: `use_cache=False` is not supported (the loop is built on the KV cache)")
    unset = {name: _unset(model, generation_config, kwargs, name) for name in ("max_length", "min_length")}
    gen, rest = model._prepare_generation_config(generation_config, **kwargs)
    config = _lookahead_config(lookahead if lookahead is not None else getattr(gen, "lookahead", "auto"))
    unknown = sorted(k for k in rest if k not in _UNSERVED_FIELDS)
    if unknown:
        raise ValueError(f"lookahead generate: `{unknown[0]}` is neither a generation option nor one of "
                         "this decoder's (lookahead, latency_curve, lookahead_stats)")
    model._prepare_special_tokens(gen, attention_mask is not None, device=input_ids.device)  # as generate does
    for name, neutral in _UNSERVED_FIELDS.items():
        value = rest.get(name, getattr(gen, name, None))
        if value is not None and value != neutral:
            raise ValueError(f"lookahead generate: `{name}={value!r}` is not supported (greedy or sampled "
                             "sequences only, one per prompt, without scores, attentions or hidden states)")
    if streamer is not None and input_ids.shape[0] > 1:
        raise ValueError("lookahead generate: a streamer takes batch size 1 (as in transformers' generate)")

    prompts, paddings = _prompts(input_ids, attention_mask)
    width = input_ids.shape[1]
    # generate's own length rules, by its own code: max_new_tokens counts new tokens, max_length the
    # input too (left padding included), and with neither set anywhere 20 new tokens (within
    # max_position_embeddings), with its warning; an input that leaves nothing to generate is refused.
    gen = model._prepare_generated_length(gen, unset["max_length"], unset["min_length"], "input_ids", width,
                                          input_ids)
    model._validate_generated_length(gen, width, unset["max_length"])
    max_new = gen.max_length - width
    eos = gen.eos_token_id
    eos = () if eos is None else (eos,) if isinstance(eos, int) else tuple(int(t) for t in eos)
    limits = DecodeLimits(max_new_tokens=max_new, eos_token_ids=eos)
    sampling = _sampling(model, gen, width, logits_processor)
    criteria = _criteria(gen, stopping_criteria, tokenizer)

    state = _state(model)
    state.attend(True)
    on_token = _on_token(paddings, criteria, streamer)
    if streamer is not None:
        streamer.put(input_ids.cpu())
    try:
        prior = None
        if config == "auto":
            config = widest_tree(_curve(state, prompts, max_new, latency_curve))
            prior = state.prior
        outs = decode_batch(state.lm, prompts, config, limits, sampling, prior=prior, on_token=on_token)
    finally:
        state.attend(False)
        if streamer is not None:
            streamer.end()
    if prior is not None:
        for out in outs:
            prior.merge(out.stats.drafts)
    if lookahead_stats is not None:
        lookahead_stats.extend(out.stats for out in outs)
    sequences = _sequences(input_ids, outs, gen.pad_token_id if gen.pad_token_id is not None else (eos or (0,))[0])
    if gen.return_dict_in_generate:
        from transformers.generation.utils import GenerateDecoderOnlyOutput

        return GenerateDecoderOnlyOutput(sequences=sequences)
    return sequences


def _unset(model, generation_config, kwargs: dict, name: str) -> bool:
    """``generate``'s test of a length left to the global default (``has_default_max_length``): neither
    the call, its generation config nor the model's sets ``name``."""
    return (kwargs.get(name) is None and getattr(generation_config, name, None) is None
            and getattr(model.generation_config, name, None) is None)


def _lookahead_config(option) -> LookaheadConfig | str | None:
    """``"auto"`` (resolved per call), a config, or ``None`` (greedy) from the ``lookahead`` option."""
    if isinstance(option, LookaheadConfig):
        return option
    if isinstance(option, Mapping):
        fields = LookaheadConfig.__dataclass_fields__
        unknown = sorted(str(k) for k in option if k not in fields)
        if unknown:
            raise ValueError(f"lookahead generate: `lookahead` has no key `{unknown[0]}` (a LookaheadConfig's "
                             f"fields: {', '.join(f for f in fields if not f.startswith('_'))})")
        return LookaheadConfig(**option)
    if option == "lookahead":
        return PAPER
    if option == "greedy":
        return None
    if option == "auto":
        return "auto"
    raise ValueError(f"lookahead generate: `lookahead` must be one of {', '.join(PRESETS)}, a LookaheadConfig or a "
                     f"dict of its fields, got {option!r}")


def _prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[list[list[int]], list[list[int]]]:
    """Each row's tokens without its left padding, and that padding."""
    rows = input_ids.tolist()
    if attention_mask is None:
        return rows, [[] for _ in rows]
    prompts, paddings = [], []
    for row, mask in zip(rows, attention_mask.tolist()):
        pad = len(mask) - sum(mask)
        if any(mask[:pad]) or not all(mask[pad:]):
            raise ValueError("lookahead generate: `attention_mask` must be left padding (zeros, then ones) on every "
                             "row, as tokenizer(..., padding=True, padding_side='left') gives")
        prompts.append(row[pad:])
        paddings.append(row[:pad])
    return prompts, paddings


def _sampling(model, gen, width: int, extra) -> SamplingConfig:
    """Greedy, or the temperature/top-k/top-p the generation config sets; the logits processors
    transformers would build for this call are checked first: any other one is refused."""
    processors = model._get_logits_processor(generation_config=gen, input_ids_seq_length=width,
                                             logits_processor=extra, device=str(model.device), model_kwargs={})
    others = [type(p).__name__ for p in processors if type(p).__name__ not in _SAMPLING_PROCESSORS]
    if others:
        raise ValueError(f"lookahead generate: logits processor {others[0]} (from the generation config or "
                         "`logits_processor`) is not supported: only temperature, top_k and top_p shape the "
                         "distribution here")
    if not gen.do_sample:
        return SamplingConfig()
    seed = int(torch.randint(0, 2**31 - 1, (1,)))     # from torch's generator: torch.manual_seed makes it repeat
    return SamplingConfig(temperature=float(gen.temperature if gen.temperature is not None else 1.0),
                          top_k=int(gen.top_k or 0), top_p=float(gen.top_p if gen.top_p is not None else 1.0),
                          seed=seed)


def _curve(state: _ModelState, prompts: list[list[int]], max_new: int,
           given: CostModel | None) -> CostModel:
    """``auto``'s latency curve: the given one, else the one measured in this process for the
    KV length's bucket, else measured now (the sizes the widest tree feeds)."""
    if isinstance(given, (str, os.PathLike)):
        stored = json.loads(Path(given).read_text())
        return CostModel.from_rows(stored["rows"] if isinstance(stored, dict) else stored)
    if given is not None:
        return given
    bucket = kv_bucket(int(sum(map(len, prompts)) / len(prompts) + max_new / 2))
    if bucket not in state.curves:
        widest = widest_tree(CostModel(tokens=(1,), seconds=(1.0,)))
        state.curves[bucket] = step_costs(state.lm, sizes_through(widest.budget), kv_length=bucket, one_logit=False)
    return state.curves[bucket]


def _criteria(gen, given, tokenizer) -> list:
    """The stopping criteria ``generate`` would add to ``given`` beyond EOS and the length (those
    are the loop's own ``DecodeLimits``): stop strings (with ``tokenizer``) and ``max_time``."""
    from transformers.generation.stopping_criteria import MaxTimeCriteria, StopStringCriteria

    criteria = list(given or [])
    if gen.stop_strings:
        if tokenizer is None:
            raise ValueError("lookahead generate: `stop_strings` needs `tokenizer=` (as in transformers' generate)")
        criteria.append(StopStringCriteria(tokenizer=tokenizer, stop_strings=gen.stop_strings))
    if gen.max_time is not None:
        criteria.append(MaxTimeCriteria(max_time=gen.max_time))
    return criteria


def _on_token(paddings: list[list[int]], criteria, streamer) -> Callable[[int, list[int]], bool] | None:
    """The decode loop's per-token hook: the streamer sees each committed token once, in order;
    the stopping criteria judge every prefix a token-by-token ``generate`` would have judged, the
    row's left padding (``paddings[b]``) in front as there (``scores`` is None: not recorded)."""
    if not criteria and streamer is None:
        return None

    def on_token(b: int, tokens: list[int]) -> bool:
        if streamer is not None:
            streamer.put(torch.tensor([tokens[-1]]))
        if not criteria:
            return False
        ids = torch.tensor([paddings[b] + tokens])
        return any(bool(criterion(ids, None).any()) for criterion in criteria)

    return on_token


def _sequences(input_ids: torch.Tensor, outs: list[DecodeOutput], pad: int) -> torch.Tensor:
    """``generate``'s layout: each input row as given (left padding kept), then its new tokens,
    rows that finished early filled with ``pad`` to the longest."""
    longest = max(len(out.tokens) for out in outs)
    new = torch.full((len(outs), longest), pad, dtype=input_ids.dtype)
    for b, out in enumerate(outs):
        new[b, :len(out.tokens)] = torch.tensor(out.tokens, dtype=input_ids.dtype)
    return torch.cat([input_ids, new.to(input_ids.device)], dim=1)

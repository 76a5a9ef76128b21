"""Every keyword the project passes to a transformers module is one the module reads.

A transformers module's ``forward`` ends in ``**kwargs``, so a keyword it does not take (the KV cache
under another version's name: ``cache`` where ``past_key_values`` is read, or where a layer reads
``layer_past``) is dropped without a word, and the module runs without it: an EAGLE drafter without
its cache still decodes losslessly, with its acceptance gone. Here every transformers module of tiny
models and their drafters is watched during decodes with lookahead, Medusa, EAGLE-1 and EAGLE-3: a
keyword that reaches a module's ``**kwargs`` from the project (the outermost transformers call) and
that neither that module nor any transformers module it calls takes by name, nor declares among the
fields of its ``**kwargs`` (``Unpack[TransformersKwargs]``: read by transformers' own decorators), fails
the test, named with the module."""

from __future__ import annotations

import functools
import inspect
import typing

import pytest
import torch
from transformers.utils.generic import TransformersKwargs

from lookahead_core import CausalLM, DecodeLimits, LookaheadConfig, decode, decode_batch
from lookahead_core.eagle import Eagle3Drafter, EagleDrafter, default_layer_ids, eagle3_config
from test_medusa import heads_for, prompt_for
from tiny_families import tiny_family_model

NEW = 12


def _taken(forward) -> tuple[set[str], bool]:
    """The keywords ``forward`` takes by name or declares as fields of its ``**kwargs``, or that are
    fields of transformers' ``TransformersKwargs`` (read by its decorators and attention functions on
    any model: ``output_hidden_states``, ...), and whether it has a ``**kwargs`` at all."""
    try:
        params = inspect.signature(forward, eval_str=True).parameters
    except NameError:
        params = inspect.signature(forward).parameters
    names = {n for n, p in params.items() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    rest = [p for p in params.values() if p.kind is p.VAR_KEYWORD]
    for typed in [TransformersKwargs, *(t for p in rest for t in typing.get_args(p.annotation) or (p.annotation,))]:
        names |= set(getattr(typed, "__required_keys__", ())) | set(getattr(typed, "__optional_keys__", ()))
    return names, bool(rest)


class KeywordAudit:
    """Wraps the ``forward`` of every transformers module under the modules given; ``unread`` maps
    ``Module <- caller keyword`` to the keywords no module of the call chain read."""

    def __init__(self, *roots: torch.nn.Module) -> None:
        self.unread: dict[str, set[str]] = {}
        self.calls = 0
        self._chain: list[set[str]] = []          # the keywords read so far, one set per outermost call
        for root in roots:
            for module in root.modules():
                if type(module).__module__.startswith("transformers.") and "forward" not in vars(module):
                    self._watch(module)

    def _watch(self, module: torch.nn.Module) -> None:
        forward = module.forward
        taken, swallows = _taken(forward)

        @functools.wraps(forward)                 # its signature stays the module's own
        def watched(*args, **kwargs):
            self.calls += 1
            if self._chain:                       # called by transformers: only what it reads counts
                self._chain[-1] |= kwargs.keys() & taken
                return forward(*args, **kwargs)
            self._chain.append(kwargs.keys() & taken)
            try:
                return forward(*args, **kwargs)
            finally:
                unread = set(kwargs) - self._chain.pop()
                if unread and swallows:
                    self.unread.setdefault(type(module).__name__, set()).update(unread)

        module.forward = watched


def decoders(model) -> dict[str, tuple[LookaheadConfig, dict]]:
    """A decoder of each kind on ``model``: lookahead (a window beside the pool), Medusa heads, an
    EAGLE-1 drafter (where the base's layer serves one) and an EAGLE-3 drafter, each in a tree."""
    tree = dict(window=1, ngram=4, guess=0, pool_only=True, tree=True, depth=4)
    kinds = {"lookahead": (LookaheadConfig(window=4, ngram=4, guess=4), {}),
             "medusa": (LookaheadConfig(**tree, sources={"medusa": 8}), {"medusa": heads_for(model, 0, 0.05)}),
             "eagle3": (LookaheadConfig(**tree, sources={"eagle": 8}),
                        {"eagle": Eagle3Drafter(model, eagle3_config(model), default_layer_ids(model))})}
    try:
        kinds["eagle"] = (LookaheadConfig(**tree, sources={"eagle": 8}), {"eagle": EagleDrafter(model)})
    except ValueError:                            # gpt2, opt: their layer is not a rotary one
        pass
    return kinds


# llama and qwen3: the common layer; gemma2: sliding windows (a mask per attention type); gpt_neox:
# its layer reads the cache as `layer_past`; gpt2: no rotary layer (EAGLE-3 and Medusa only).
@pytest.mark.parametrize("family", ["llama", "qwen3", "gemma2", "gpt_neox", "gpt2"])
def test_every_keyword_the_project_passes_to_a_transformers_module_is_read(family):
    torch.manual_seed(0)
    model = tiny_family_model(family, seed=3)
    kinds = decoders(model)
    audit = KeywordAudit(model, *(d for _, drafters in kinds.values() for d in drafters.values()))
    prompt = prompt_for(model.config.vocab_size, 1)
    for config, drafters in kinds.values():
        lm = CausalLM(model, drafters=drafters)
        decode(lm, prompt, config, DecodeLimits(max_new_tokens=NEW))
        decode_batch(lm, [prompt, prompt[:9]], config, DecodeLimits(max_new_tokens=NEW))
    assert audit.calls > 0
    assert audit.unread == {}, f"keywords passed to transformers modules that no module read: {audit.unread}"


class Layer(torch.nn.Module):
    """Stands in for a transformers decoder layer: reads ``past_key_values``, swallows the rest."""

    def __init__(self) -> None:
        super().__init__()
        self.attention = Attention()

    def forward(self, hidden_states, past_key_values=None, **kwargs):
        return self.attention(hidden_states, past_key_values=past_key_values, **kwargs)


class Attention(torch.nn.Module):
    def forward(self, hidden_states, past_key_values=None, position_ids=None, **kwargs):
        return hidden_states


Layer.__module__ = Attention.__module__ = "transformers.models.stand_in"


def test_the_audit_names_a_keyword_no_module_reads_and_passes_one_a_module_down_the_chain_reads():
    layer = Layer()
    audit = KeywordAudit(layer)
    layer(torch.ones(1), position_ids=1)          # read by the attention the layer calls
    assert audit.unread == {} and audit.calls == 2
    layer(torch.ones(1), cache=2)                 # read by none
    assert audit.unread == {"Layer": {"cache"}}


def test_the_cache_keyword_is_read_from_the_modules_own_signature():
    from lookahead_core.model_io import cache_keyword

    assert cache_keyword(Layer()) == "past_key_values"
    model = tiny_family_model("gpt_neox")
    assert cache_keyword(model.get_decoder().layers[0]) == "layer_past"
    with pytest.raises(ValueError, match="Linear.forward takes no KV cache"):
        cache_keyword(torch.nn.Linear(2, 2))

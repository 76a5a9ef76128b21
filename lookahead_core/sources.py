"""The registry of draft sources: registering a source class makes every part of the project know it.

A draft source is one class with the interface of :class:`lookahead_core.drafts.DraftSource`
(``propose(context) -> drafts``, ``update(outcome)``, ``topk``; ``name`` and ``carry(earlier)`` if
it keeps state across decodes, as Token Recycling's table travels in the prior) and a classmethod
``from_config(config, size, context)`` that builds it for one decode. Registering it
(:func:`register_source`) is all it takes for

* :class:`~lookahead_core.config.LookaheadConfig` to accept it: ``sources={"<name>": size}``
  (0 = off), and so every core decoder's yaml (``sources: {<name>: size}``);
* :meth:`lookahead_core.drafts.Proposer.from_config` to build it and merge its drafts into the
  step's token tree (verification keeps the output token-identical to greedy, whatever it proposes);
* ``decoding=auto``'s grid (:func:`lookahead_core.cost.grid.default_grid`) to add the configs the
  source lists in ``grid``.

``docs/draft_sources.md`` walks through an example; ``tests/test_draft_sources.py`` registers a
toy source from the test file alone. The built-in sources (suffix matches, Token Recycling,
Medusa heads) are registered below like any other and sized the same way,
``LookaheadConfig(sources={"suffix": 4, "recycle": 4})``; the n-gram pool and its Jacobi window
are the paper's and the base of every config (``N``, ``W``, ``G``), not a registered source.

This module imports neither torch nor the source classes: a config validates and is named
without them, and a source class given as ``"module:Class"`` is imported when a decode builds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class SourceKind:
    """A registered draft source.

    name: its key in ``LookaheadConfig.sources`` (and the yaml) and the tag its drafts carry.
    label: a short name, for the harness's labels of configs (``experiments/config/labels.py``).
    factory: the class (or ``"module:Class"``) whose ``from_config(config, size, context)`` builds it.
    before_pool: its drafts enter the tree before the n-gram pool's (the suffix source's do).
    flags: ``(field, label)`` pairs of boolean ``LookaheadConfig`` options it owns, with a short
        name each (the recycle source's ``recycle_window``, ``rw``).
    grid: a callable returning the configs ``decoding=auto`` adds to its grid for this source.
    drafter: it drafts with a trained model the user supplies (Medusa heads): ``from_config`` gets
        ``CausalLM.drafters[name]`` as a fourth argument, and a decode without one is refused.
    hidden: ``update`` needs the model's last hidden state at the row that predicted the step's last
        committed token (``StepOutcome.hidden``); the step's forward then returns hidden states.
    features: ``update`` needs the model's last hidden state at every row that predicted a committed
        token (``StepOutcome.features``: every prompt row after the prefill, the input row and the
        accepted path's rows after a step), as EAGLE's drafter reads them.
    """

    name: str
    label: str
    factory: Any
    before_pool: bool = False
    flags: tuple[tuple[str, str], ...] = ()
    grid: Callable[[], list] | None = None
    drafter: bool = False
    hidden: bool = False
    features: bool = False

    def size(self, config: Any) -> int:
        """How many drafts it proposes per step under ``config`` (0: off)."""
        return config.size(self.name)

    def build(self, config: Any, size: int, context: Any, drafters: dict | None = None) -> Any:
        drafter = (drafters or {}).get(self.name)
        if self.drafter and drafter is None:
            raise ValueError(f"sources={{{self.name!r}: {size}}} drafts with a trained model: pass it as "
                             f"CausalLM(model, drafters={{{self.name!r}: ...}})")
        factory = self.factory
        if isinstance(factory, str):
            module, _, name = factory.partition(":")
            factory = getattr(import_module(module, __package__), name)   # ".drafts": this package's
        if not self.drafter:
            return factory.from_config(config, size, context)
        return factory.from_config(config, size, context, drafter)


SOURCES: dict[str, SourceKind] = {}


def register_source(name: str, *, label: str, grid: Callable[[], list] | None = None, before_pool: bool = False,
                    drafter: bool = False, hidden: bool = False, features: bool = False) -> Callable[[type], type]:
    """Class decorator: registers a draft source under ``name`` (sized by ``sources={name: k}``).

    >>> @register_source("echo", label="echo")
    ... class Echo:
    ...     topk = 0
    ...     @classmethod
    ...     def from_config(cls, config, size, context): return cls()
    ...     def propose(self, context): return []
    ...     def update(self, outcome): pass
    >>> from lookahead_core.config import LookaheadConfig
    >>> LookaheadConfig(window=5, ngram=4, guess=5, tree=True, sources={"echo": 2}).sources
    (('echo', 2),)
    >>> unregister_source("echo")
    """
    def add(cls: type) -> type:
        _add(SourceKind(name, label, cls, grid=grid, before_pool=before_pool, drafter=drafter, hidden=hidden,
                        features=features))
        return cls
    return add


def unregister_source(name: str) -> None:
    """Removes a registered source (not one of the built-ins registered below)."""
    if name not in SOURCES or name in BUILT_IN:
        raise ValueError(f"{name!r} is not a registered source that can be removed")
    del SOURCES[name]


def _add(kind: SourceKind) -> None:
    if not kind.name.isidentifier():
        raise ValueError(f"a source's name must be an identifier, got {kind.name!r}")
    SOURCES[kind.name] = kind


def active(config: Any) -> list[tuple[SourceKind, int]]:
    """The registered sources ``config`` turns on, with their sizes, in registration order."""
    return [(kind, size) for kind in SOURCES.values() if (size := kind.size(config))]


_add(SourceKind("suffix", "sfx", ".drafts:SuffixSource", before_pool=True))
_add(SourceKind("recycle", "rc", ".drafts:RecycleSource", flags=(("recycle_window", "rw"),)))
# Trained drafters (lookahead_core/medusa.py and eagle.py, which need torch): registered here by name so that a
# config naming them validates without importing torch.
_add(SourceKind("medusa", "md", ".medusa:MedusaSource", drafter=True, hidden=True))
_add(SourceKind("eagle", "eg", ".eagle:EagleSource", drafter=True, features=True))
BUILT_IN = frozenset(SOURCES)

"""Short readable names of core configs, for reports, calibration records and decoder names in the
suites: ``greedy``, ``la_N5W15G15``, ``la_N5W15G15_pool``, ``pool_N4G3``, and for token trees and
the other sources ``..._tree_sfx4_rc4_d6_k8``.

A label is for a person; what tells results apart is the hash of their settings
(``experiments.config.identity``). Imports only the core's config, so the GPU command
(``scripts/gpu_run.py``) can use it without the harness's packages.
"""

from __future__ import annotations

from lookahead_core.config import LookaheadConfig
from lookahead_core.sources import SOURCES, SourceKind

# The words of the labels that are not a source's: ``la_N<n>W<w>G<g>`` / ``pool_N<n>G<g>``, then
# ``pool``, ``tree``, each source's ``<label><size>`` and its flags' ``<label>``, then ``d<depth>``,
# ``k<budget>``, ``ca``, ``dc``. No two configs share a label as long as no source's label is one of
# these words or another source's.
WORDS = ("la", "pool", "tree", "d", "k", "ca", "dc")


def config_label(config: LookaheadConfig | None) -> str:
    """``config``'s label: each registered source's label and size (suffix drafts, recycled top-k
    with ``_rw`` for recycle_window, ...), then draft depth, token budget, ``_ca`` for step_costs and
    ``_dc`` for draft_cost, each only when set."""
    if config is None:
        return "greedy"
    if config.pool_only:
        parts = [f"pool_N{config.ngram}G{config.guess}"]
    else:
        parts = [f"la_N{config.ngram}W{config.window}G{config.guess}"] + (["pool"] if config.prompt_pool else [])
    parts += ["tree"] if config.tree else []
    for kind in SOURCES.values():
        if size := config.size(kind.name):
            parts += [f"{_label(kind)}{size}"] + [label for flag, label in kind.flags if getattr(config, flag)]
    parts += [f"{short}{value}" for short, value in (("d", config.depth), ("k", config.budget)) if value]
    return "_".join(parts + (["ca"] if config.step_costs else []) + (["dc"] if config.draft_cost else []))


def _label(kind: SourceKind) -> str:
    """The source's label, once checked: lower-case letters, and neither a word of the labels nor
    another registered source's (or flag's) label."""
    labels = [kind.label] + [label for _, label in kind.flags]
    taken = {label for other in SOURCES.values() if other.name != kind.name
             for label in [other.label] + [flag for _, flag in other.flags]} | set(WORDS)
    clash = sorted(set(labels) & taken) or (labels if len(set(labels)) < len(labels) else [])
    if clash or not all(label.isascii() and label.isalpha() and label.islower() for label in labels):
        raise ValueError(f"source {kind.name}: label {(clash or labels)[0]!r} cannot name it (labels are lower-case "
                         f"letters, none of {sorted(taken)})")
    return kind.label

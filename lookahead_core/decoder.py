"""The decode loop: greedy baseline, lookahead (W, N, G), prompt pool, pool-only and token trees,
greedy or sampled.

One loop serves every mode. Each step:
  1. gather drafts from the sources (drafts.py: the n-gram pool, suffix matches, recycled
     successors) into one tree, cut to the token budget;
  2. fuse input token + window + tree into one forward (layout.py builds mask and positions);
  3. verify: walk the tree, the accepted path plus one token of the model's own (verify.py);
  4. commit: keep the KV rows of the accepted path, advance the window, update the sources.
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from dataclasses import dataclass, field, replace

import torch

from .config import DecodeLimits, LookaheadConfig, SamplingConfig
from .drafts import DraftStats, Proposer, StepOutcome
from .layout import EMPTY_TREE, DraftTree, causal_layout, step_layout
from .model_io import CausalLM, commit_kv, truncate_kv
from .pool import NGramPool
from .verify import Verdict, Verifier, make_verifier


@dataclass
class DecodeStats:
    """Accounting shared by every mode, so greedy and lookahead compare like for like."""

    prefill_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0                                        # forwards after the prefill
    step_tokens: list[int] = field(default_factory=list)  # tokens fed per step
    accepted: list[int] = field(default_factory=list)     # tokens committed per step
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0                           # the whole step loop
    model_seconds: float = 0.0                            # inside the model's forward
    drafts: DraftStats = field(default_factory=DraftStats)  # fed / tried / accepted per source and depth

    @property
    def compression(self) -> float:
        """Step compression S: tokens committed by decoding steps per step (greedy: 1.0)."""
        return sum(self.accepted) / self.steps if self.steps else 1.0

    @property
    def accepted_histogram(self) -> dict[int, int]:
        return dict(sorted(Counter(self.accepted).items()))

    @property
    def overhead_fraction(self) -> float:
        """Share of the decoding time spent outside the model: the core's own cost."""
        return 1.0 - self.model_seconds / self.decode_seconds if self.decode_seconds else 0.0


@dataclass
class DecodeState:
    """A conversation in progress: KV of ``cached_tokens`` and, optionally, the n-gram pool.

    ``decode`` takes the state over: it crops and extends the cache and grows the pool in place.
    To decode twice from the same state (repeated timings), pass ``state.copy()``.
    """

    cache: object | None
    cached_tokens: list[int]
    pool: NGramPool | None = None

    @classmethod
    def with_pool(cls, pool: NGramPool) -> "DecodeState":
        """A fresh conversation that starts from an existing (e.g. pre-filled) pool."""
        return cls(cache=None, cached_tokens=[], pool=pool)

    def copy(self) -> "DecodeState":
        return copy.deepcopy(self)


@dataclass
class DecodeOutput:
    tokens: list[int]
    stats: DecodeStats
    state: DecodeState


@torch.inference_mode()
def decode(
    model: torch.nn.Module | CausalLM,
    input_ids,
    lookahead: LookaheadConfig | None = None,
    limits: DecodeLimits | None = None,
    sampling: SamplingConfig | None = None,
    *,
    state: DecodeState | None = None,
    tokenizer=None,
    generator: torch.Generator | None = None,
) -> DecodeOutput:
    """Generate after ``input_ids`` (the whole conversation so far, batch size 1).

    ``lookahead=None`` is the greedy (or plain sampling) baseline through the same loop.
    With ``state`` from an earlier call, the cached KV of the longest common prefix is reused and
    only the rest of ``input_ids`` is prefilled.
    """
    limits = limits or DecodeLimits()
    sampling = sampling or SamplingConfig()
    prompt = _as_token_list(input_ids)
    if limits.stop_strings and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer")
    lm = model if isinstance(model, CausalLM) else CausalLM(model)
    verify = make_verifier(sampling, generator)
    stats = DecodeStats()

    cache, logits = _prefill(lm, prompt, state, stats)
    tokens = list(prompt)                 # committed context; the last one has no KV yet
    first = verify(EMPTY_TREE, logits[None])
    new = _accept(tokens, first.tokens, 0, limits, tokenizer, len(prompt))

    pool = _pool_for(lookahead, state)
    proposer = None
    if lookahead is not None:
        proposer = Proposer.from_config(lookahead, tokens, pool, prompt)
        proposer.stats = stats.drafts

    start = time.perf_counter()
    while not new.done:
        step = _step(lm, cache, tokens, proposer, verify, stats)
        stats.steps += 1
        before = len(tokens)
        new = _accept(tokens, step.verdict.tokens, new.count, limits, tokenizer, len(prompt))
        kept = len(tokens) - before          # what survived EOS / max / stop truncation
        stats.accepted.append(kept)
        # KV of the input token and of the accepted path's nodes; the last token has none yet.
        commit_kv(cache, step.past, [0] + step.path_rows[: kept - 1])
        if proposer is not None:
            proposer.update(replace(step.outcome, context=tokens, new_from=before), step.tree, step.verdict.path)
    stats.decode_seconds = time.perf_counter() - start
    stats.new_tokens = new.count

    out_state = DecodeState(cache, tokens[:-1], pool if lookahead is not None and lookahead.keep_pool else None)
    return DecodeOutput(tokens[len(prompt):], stats, out_state)


@dataclass(frozen=True)
class _Progress:
    count: int
    done: bool


@dataclass(frozen=True)
class _StepResult:
    verdict: Verdict
    tree: DraftTree
    path_rows: list[int]           # rows holding the KV of the accepted path's nodes
    past: int
    outcome: StepOutcome           # for the sources; context and new_from are filled in after the commit


def _step(lm: CausalLM, cache, tokens: list[int], proposer: Proposer | None, verify: Verifier,
          stats: DecodeStats) -> _StepResult:
    """One fused forward: the verdict, and the rows holding the KV of its accepted path."""
    x = tokens[-1]
    past = cache.get_seq_length()                       # == len(tokens) - 1
    window = proposer.window if proposer is not None else None
    levels = len(window.levels) if window is not None else 0
    window_width = window.window if window is not None else 0
    window_tokens = window.tokens() if window is not None else []
    tree = proposer.propose(tokens, 1 + len(window_tokens)) if proposer is not None else EMPTY_TREE
    layout = step_layout(window_width, levels, tree.parents)
    fed = [x] + window_tokens + list(tree.tokens)

    t0 = time.perf_counter()
    visible = None if layout.causal else layout.visible           # None: the model's own causal mask
    logits = lm.forward(cache, fed, layout.offsets, visible, past, layout.logit_rows)  # (r, V)
    if logits.is_cuda:
        torch.cuda.synchronize(logits.device)
    stats.model_seconds += time.perf_counter() - t0
    stats.step_tokens.append(layout.size)

    verdict = verify(tree, logits[layout.tree_logits])                     # logits (n+1, V)
    outcome = StepOutcome((), 0, x)
    if window is not None:
        outcome = replace(outcome, window_next=logits[layout.last_level_logits].argmax(-1).tolist())
    if proposer is not None and proposer.topk:
        outcome = replace(outcome, row_tokens=[fed[r] for r in layout.logit_rows.tolist()],
                          row_topk=logits.topk(proposer.topk, dim=-1).indices.cpu())
    path_rows = layout.tree_rows[verdict.path].tolist() if verdict.path else []
    return _StepResult(verdict, tree, path_rows, past, outcome)


def _accept(tokens: list[int], proposed: list[int], count: int, limits: DecodeLimits,
            tokenizer, prompt_len: int) -> _Progress:
    """Append ``proposed`` to ``tokens`` until EOS, max_new_tokens or a stop string."""
    for token in proposed:
        tokens.append(token)
        count += 1
        if token in limits.eos_token_ids or count >= limits.max_new_tokens:
            return _Progress(count, True)
        if limits.stop_strings and _hits_stop(tokenizer, tokens[prompt_len:], limits.stop_strings):
            return _Progress(count, True)
    return _Progress(count, False)


def _hits_stop(tokenizer, generated: list[int], stop_strings: tuple[str, ...]) -> bool:
    # Only the tail can hold a new match: decode a window wide enough for the longest stop string.
    tail = tokenizer.decode(generated[-(max(map(len, stop_strings)) + 8):])
    return any(s in tail for s in stop_strings)


def _prefill(lm: CausalLM, prompt: list[int], state: DecodeState | None,
             stats: DecodeStats) -> tuple[object, torch.Tensor]:
    """Fill the cache with the prompt (or the part not cached yet); return the last logits (V,)."""
    if state is not None and state.cache is not None:
        cache = state.cache
        reuse = _common_prefix(state.cached_tokens, prompt)
        reuse = min(reuse, len(prompt) - 1)             # at least one token must be fed
        truncate_kv(cache, reuse)
    else:
        cache, reuse = lm.new_cache(), 0
    fresh = prompt[reuse:]
    offsets, _ = causal_layout(len(fresh))
    t0 = time.perf_counter()
    logits = lm.forward(cache, fresh, offsets, None, reuse, torch.tensor([len(fresh) - 1]))
    stats.prefill_seconds = time.perf_counter() - t0
    stats.prefill_tokens = len(fresh)
    return cache, logits[0]


def _pool_for(lookahead: LookaheadConfig | None, state: DecodeState | None) -> NGramPool | None:
    if lookahead is None:
        return None
    if lookahead.keep_pool and state is not None and state.pool is not None \
            and state.pool.ngram == lookahead.ngram and state.pool.capacity == lookahead.guess:
        return state.pool
    return NGramPool(lookahead.ngram, lookahead.guess)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _as_token_list(input_ids) -> list[int]:
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise ValueError(f"batch size {input_ids.shape[0]} is not supported; decode one sequence at a time")
            input_ids = input_ids[0]
        input_ids = input_ids.tolist()
    tokens = [int(t) for t in input_ids]
    if not tokens:
        raise ValueError("input_ids is empty")
    return tokens

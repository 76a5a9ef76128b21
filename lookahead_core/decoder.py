"""The decode loop: greedy baseline, lookahead (W, N, G), prompt pool, pool-only and token trees,
greedy or sampled, for one sequence (``decode``) or a batch (``decode_batch``).

One loop serves every mode and batch size. ``_prefill`` fills the cache with the prompts and
gives each sequence its first token; then each step, for every live sequence:
  1. ``_draft``: gather drafts from the sources (drafts.py: the n-gram pool, suffix matches,
     recycled successors, a drafter's tree, which every sequence's drafter grows on the device
     and the host reads in one copy: ``_launch``) into one tree, cut to the token budget, and lay
     out what the sequence feeds: input token + window + tree (layout.py builds masks and positions);
  2. ``_forward``: one forward for every sequence's rows, in one batch;
  3. ``_verify``: read the logits to the host (``_read``: one copy for the batch: each row's argmax,
     a sampler's draw, a source's top-k) and walk the tree: the accepted path plus one token of
     the model's own (verify.py);
  4. ``_accept``: append those tokens to the sequence one by one, up to EOS, max_new_tokens, a stop
     string or the caller's ``on_token`` saying stop (streamers, stopping criteria);
  5. ``_keep``: the KV rows to keep, the input token's and the accepted path's (``commit_kv``,
     whose one copy also carries the rows the sources' features come from, and the rows that
     stay in the batch);
  6. ``_learn``: hand the sources the step's outcome (the committed text, the window's next level,
     the rows' top-k, hidden states) and count the tree's acceptance (``DraftStats``).
A finished sequence then leaves the batch with its output (``retire``). A step makes at most 4
host<->device transfers whatever the number of layers and the decoder (tests/test_transfers.py):
the feed (2), the drafter's tree (1), the logits read (3) and the commit's indices (5); no
synchronize: forwards are timed with CUDA events, read once the decode is done (``_read_clocks``).
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from .config import DecodeLimits, LookaheadConfig, SamplingConfig
from .drafts import DraftStats, Proposer, StepOutcome
from .layout import EMPTY_TREE, DraftTree, StepLayout, cut_tree, step_layout
from .model_io import CausalLM, Feed, ForwardClock, select_sequences, sequence_cache, truncate_kv
from .capability import require_support
from .inputs import check_vocabulary, validate_input_ids
from .positions import fit_step
from .pool import NGramPool
from .sources import active
from .verify import Verdict, Verifier, make_verifier, verify_greedy

# ``on_token(b, tokens)``: called after each token sequence b commits, in order, with its whole
# sequence so far (prompt included; do not modify it); returning True ends the sequence at that
# token, as EOS would. Tokens a step accepts beyond it are dropped, so a stopping rule sees exactly
# the prefixes plain token-by-token decoding would (transformers' streamers and stopping criteria).
OnToken = Callable[[int, list[int]], bool]


@dataclass
class DecodeStats:
    """Accounting shared by every mode, so greedy and lookahead compare like for like."""

    prefill_tokens: int = 0
    new_tokens: int = 0
    steps: int = 0                                        # forwards after the prefill
    step_tokens: list[int] = field(default_factory=list)  # tokens fed per step
    accepted: list[int] = field(default_factory=list)     # tokens committed per step
    prefill_seconds: float = 0.0                          # the prefill's forward (device time on a GPU)
    decode_seconds: float = 0.0                           # the whole step loop, wall clock
    model_seconds: float = 0.0                            # inside the model's forwards (device time on a GPU)
    comm_seconds: float = 0.0                             # of that, in collectives (lookahead parallelism)
    draft_seconds: float = 0.0                            # in draft sources' own forwards (a drafter model's)
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
    """A conversation in progress: KV of ``cached_tokens`` and, optionally, the n-gram pool and the
    draft acceptance measured so far (``drafts``: the next decode's ``DraftStats.prior``, so its
    token tree is cut by measured rates from its first step; a decode with ``keep_pool`` returns
    the prior's counts plus its own) and what stateful sources hand the next turn (``sources``:
    the EAGLE drafter's cache of the conversation).

    ``decode`` takes the state over: it crops and extends the cache and grows the pool in place.
    To decode twice from the same state (repeated timings), pass ``state.copy()``.
    """

    cache: object | None
    cached_tokens: list[int]
    pool: NGramPool | None = None
    drafts: DraftStats | None = None
    sources: dict[str, object] = field(default_factory=dict)   # what sources hand the next turn (Proposer.handover)

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
    on_token: OnToken | None = None,
) -> DecodeOutput:
    """Generate after ``input_ids`` (the whole conversation so far, batch size 1).

    ``lookahead=None`` is the greedy (or plain sampling) baseline through the same loop.
    With ``state`` from an earlier call, the cached KV of the longest common prefix is reused and
    only the rest of ``input_ids`` is prefilled. This is :func:`decode_batch` with a batch of one.
    ``on_token(0, tokens)`` is called after each committed token (see :data:`OnToken`).
    """
    sampling = sampling or SamplingConfig()
    verify = make_verifier(sampling, generator)
    prompt = validate_input_ids(input_ids)           # before the model is touched
    return _run(model, [prompt], lookahead, limits, [verify], state, tokenizer,
                state.drafts if state is not None else None, on_token)[0]


@torch.inference_mode()
def decode_batch(
    model: torch.nn.Module | CausalLM,
    prompts,
    lookahead: LookaheadConfig | None = None,
    limits: DecodeLimits | None = None,
    sampling: SamplingConfig | None = None,
    *,
    tokenizer=None,
    prior: DraftStats | None = None,
    on_token: OnToken | None = None,
) -> list[DecodeOutput]:
    """Generate after each of ``prompts`` (token lists of any lengths), one forward per step for all.

    Every sequence has its own window, pool, draft sources, accepted lengths and stop conditions,
    and gets exactly the tokens :func:`decode` gives it alone (greedy: token-identical; sampling:
    the same distribution, sequence b drawing from its own generator seeded ``sampling.seed + b``).

    The KV cache holds one row per live sequence, right-padded; slot = position, and sequence b's
    committed KV is always a prefix of its row, ``valid[b]`` = its committed tokens:

        cache slots (B, heads, past + q, dim), past = the longest valid
                 committed KV                      this step's rows
        seq 0   | k0 k1 k2 k3 k4 k5 k6 k7 .  .  | x  w  w  w  t  t |   valid = 8
        seq 1   | k0 k1 k2 .  .  .  .  .  .  .  | x  t  t  -  -  - |   valid = 3
        seq 2   | k0 k1 k2 k3 k4 k5 k6 k7 k8 k9 | x  w  w  w  -  - |   valid = 10
                  0                             past               past + q
        k = committed KV, . = stale slot (hidden), x = input token, w = window, t = tree node,
        - = padding row (sees only itself, never kept)

    A step feeds every live sequence's rows, right-padded to the longest (q), at its own positions
    ``valid[b] + offsets``; its 4-D float mask shows each row its own committed slots and its own
    step rows only (``.`` slots and padding are hidden; sliding windows count positions, which
    the slots are). After verification each sequence's kept rows move down to ``valid[b]...``
    (``commit_kv``) and the cache is cut to the longest sequence. A finished sequence leaves the
    batch: its cache row is dropped, and its output takes a copy of its KV (``DecodeOutput.state``).

    Stats are per sequence; a step's model time counts for every sequence in it (each waited for
    the whole forward), and ``decode_seconds`` runs until that sequence finished. ``prior``: the
    draft acceptance every sequence's tree starts from (``DraftStats.prior``; ``decode`` takes it
    as ``state.drafts``). ``on_token(b, tokens)``: after each token sequence b commits (:data:`OnToken`).
    """
    sampling = sampling or SamplingConfig()
    prompts = [validate_input_ids(p) for p in prompts]       # before the model is touched
    if not prompts:
        raise ValueError("prompts is empty")
    verifiers = [make_verifier(replace(sampling, seed=sampling.seed + b)) for b in range(len(prompts))]
    return _run(model, prompts, lookahead, limits, verifiers, None, tokenizer, prior, on_token)


@dataclass
class _Sequence:
    """One sequence of the batch while it decodes."""

    index: int                        # its place in the batch (what on_token is told)
    prompt: list[int]
    tokens: list[int]                 # committed context; the last one has no KV yet
    verify: Verifier
    proposer: Proposer | None
    pool: NGramPool | None
    stats: DecodeStats
    done: bool = False                            # EOS, max_new_tokens or a stop string reached
    spans: list = field(default_factory=list)     # the forwards it took part in (ForwardClock.span)

    @property
    def committed(self) -> int:
        """KV length: every committed token but the last."""
        return len(self.tokens) - 1


def _run(model, prompts: list[list[int]], lookahead: LookaheadConfig | None, limits: DecodeLimits | None,
         verifiers: list[Verifier], state: DecodeState | None, tokenizer,
         prior: DraftStats | None = None, on_token: OnToken | None = None) -> list[DecodeOutput]:
    """The decode loop, for one sequence or many."""
    limits = limits or DecodeLimits()
    if limits.stop_strings and tokenizer is None:
        raise ValueError("stop_strings need a tokenizer")
    lm = model if isinstance(model, CausalLM) else CausalLM(model)
    for prompt in prompts:
        check_vocabulary(prompt, lm.vocab_size)
    require_support(lm, lookahead)     # the attention backend and the probe, once per model: refuses what they would get wrong
    seqs = [_Sequence(b, p, list(p), v, None, _pool_for(lookahead, state), DecodeStats())
            for b, (p, v) in enumerate(zip(prompts, verifiers))]
    kinds = [kind for kind, _ in active(lookahead)] if lookahead is not None else []
    features = any(kind.features for kind in kinds)
    hidden = features or any(kind.hidden for kind in kinds)
    layers = len(lm.feature_layers)           # hidden states come as the last layer's, then a drafter's others
    clock = ForwardClock(lm.device)
    cache, first = _prefill(lm, prompts, state, [s.stats for s in seqs], hidden, clock, features)
    for seq, (logits, states) in zip(seqs, first):
        _accept(seq, seq.verify(EMPTY_TREE, logits[None]).tokens, limits, tokenizer, on_token)
        if lookahead is not None:
            seq.stats.drafts.prior = prior
            seq.proposer = Proposer.from_config(lookahead, seq.tokens, seq.pool, seq.prompt, lm.drafters,
                                                seq.stats.drafts)
            if state is not None:
                seq.proposer.resume(state.sources)
            if hidden:       # the prefill's outcome: no new n-grams, the hidden states the first tree drafts from
                seq.proposer.update(StepOutcome(seq.tokens, len(seq.tokens), seq.tokens[-1],
                                                hidden=_last_layer(states[-1], layers),
                                                features=states if features else None), EMPTY_TREE, [])
    outputs: dict[int, DecodeOutput] = {}
    live = list(range(len(seqs)))                     # cache row r holds sequence live[r]

    def retire(start: float, rest_index: torch.Tensor | None = None) -> None:
        """Sequences that are done leave the batch (``rest_index``: the others' rows, on the device)."""
        nonlocal live
        done = [r for r, i in enumerate(live) if seqs[i].done]
        for r in done:
            seq = seqs[live[r]]
            seq.stats.decode_seconds = time.perf_counter() - start
            seq.stats.new_tokens = len(seq.tokens) - len(seq.prompt)
            keep_pool = lookahead is not None and lookahead.keep_pool
            out_state = DecodeState(sequence_cache(cache, r, seq.committed), seq.tokens[:-1],
                                    seq.pool if keep_pool else None, seq.stats.drafts.learnt() if keep_pool else None,
                                    seq.proposer.handover() if seq.proposer is not None else {})
            outputs[live[r]] = DecodeOutput(seq.tokens[len(seq.prompt):], seq.stats, out_state)
        if done and len(done) < len(live):
            rest = [r for r in range(len(live)) if r not in done]
            live = [live[r] for r in rest]
            select_sequences(cache, rest if rest_index is None else rest_index, max(seqs[i].committed for i in live))
        elif done:
            live = []

    start = time.perf_counter()
    retire(start)
    while live:
        batch = [seqs[i] for i in live]
        _launch(batch)
        plans = [_draft(seq, lm.position_limit) for seq in batch]                      # 1. plans
        past, valid, comm = cache.get_seq_length(), [seq.committed for seq in batch], lm.comm_seconds
        logits, states = _forward(lm, cache, batch, plans, hidden, clock)              # 2. logits, states
        verdicts, reads = _verify(batch, plans, logits)                                # 3. verdicts, reads
        kept = [_accept(seq, verdict.tokens, limits, tokenizer, on_token)              # 4. tokens kept
                for seq, verdict in zip(batch, verdicts)]
        for seq, n in zip(batch, kept):
            seq.stats.accepted.append(n)
        on = _keep(lm, cache, past, valid, batch, plans, verdicts, kept, features)    # 5. what the copy carried
        for b, (seq, plan, verdict, read, row_states) in enumerate(zip(batch, plans, verdicts, reads, states)):
            chose = (on[f"rows{b}"], on[f"tokens{b}"]) if f"rows{b}" in on else None
            _learn(seq, plan, verdict, kept[b], read, row_states, chose, layers)         # 6.
        for seq in batch:
            seq.stats.comm_seconds += lm.comm_seconds - comm
        retire(start, on.get("rest"))
    _read_clocks(seqs, clock)
    return [outputs[i] for i in range(len(seqs))]


def _read_clocks(seqs: list[_Sequence], clock: ForwardClock) -> None:
    """Every sequence's model and draft seconds, read once the batch is done (on a GPU the first
    read of each clock waits for its last event: once per clock, not once per step or sequence)."""
    for seq in seqs:
        seq.stats.model_seconds = clock.seconds(seq.spans)
        seq.stats.draft_seconds = seq.proposer.draft_seconds if seq.proposer is not None else 0.0


@dataclass(frozen=True)
class _Plan:
    """What one sequence feeds a step, and how its rows are laid out."""

    tree: DraftTree
    layout: StepLayout
    feed: Feed
    with_window: bool                # the window's rows are in this step (not near the position limit)


def _launch(batch: list[_Sequence]) -> None:
    """Sources that draft on the device (an EAGLE drafter's tree) queue their work for every
    sequence, and the host reads all of it in one copy (``launch``, ``land``)."""
    launched = [(source, tree) for seq in batch if seq.proposer is not None for source in seq.proposer.sources
                if hasattr(source, "launch") and (tree := source.launch()) is not None]
    if launched:
        host, at = torch.cat([tree for _, tree in launched]).tolist(), 0
        for source, tree in launched:
            source.land(host[at:at + len(tree)])
            at += len(tree)


def _draft(seq: _Sequence, position_limit: int | None) -> _Plan:
    """1. What the sequence feeds this step: input token + window + the sources' draft tree, all
    below the model's last position (near it the window sits the step out and the tree is cut to
    the depth that fits)."""
    proposer = seq.proposer
    window = proposer.window if proposer is not None else None          # the JacobiWindow, if any
    levels = len(window.levels) if window is not None else 0
    fit = fit_step(position_limit, seq.committed, window.width if window is not None else 0, levels)
    if not fit.with_window:
        window, levels = None, 0
    width = window.width if window is not None else 0
    window_tokens = window.tokens() if window is not None else []
    tree = proposer.propose(seq.tokens, 1 + len(window_tokens)) if proposer is not None else EMPTY_TREE
    tree = cut_tree(tree, fit.max_depth)
    layout = step_layout(width, levels, tree.parents, window is not None and proposer.recycle_window)
    fed = [seq.tokens[-1]] + window_tokens + list(tree.tokens)
    visible = None if layout.causal else layout.visible           # None: a plain causal chain
    return _Plan(tree, layout, Feed(fed, layout.offsets, visible, seq.committed, layout.logit_rows),
                 with_window=window is not None)


def _forward(lm: CausalLM, cache, batch: list[_Sequence], plans: list[_Plan], hidden: bool,
             clock: ForwardClock) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
    """2. One forward over every sequence's rows: each one's logits (r, V) and, with ``hidden``,
    last hidden states (r, H) (else None), on the model's device; every sequence counts the step."""
    with clock.span() as span:
        outs = lm.forward_batch(cache, [plan.feed for plan in plans], hidden)
    for seq, plan in zip(batch, plans):
        seq.spans.append(span)
        seq.stats.steps += 1
        seq.stats.step_tokens.append(plan.layout.size)
    if hidden:
        return [logits for logits, _ in outs], [states for _, states in outs]
    return list(outs), [None] * len(outs)


def _verify(batch: list[_Sequence], plans: list[_Plan], logits: list[torch.Tensor]) -> tuple[list[Verdict], list[_Read]]:
    """3. Each sequence's verdict on its tree (verify.py), from what the host has read of its logits
    (``logits[b]``: (r, V), one row per ``logit_rows``) at the rows the verifier reads (``tree_picks``)."""
    reads = _read(batch, plans, logits)
    return [seq.verify(plan.tree, step_logits, plan.layout.tree_picks.tolist(), read.chosen)
            for seq, plan, step_logits, read in zip(batch, plans, logits, reads)], reads


@dataclass(frozen=True)
class _Read:
    """What the host reads of one sequence's step logits."""

    argmax: list[int]                        # every logit row's argmax (the window's next level)
    chosen: list[int]                        # every row's token as the verifier chose it (greedy: argmax)
    topk: torch.Tensor | None = None         # (r, k) top-k tokens of every row (Token Recycling)
    topk_probs: torch.Tensor | None = None   # (r, k) their probabilities


def _read(batch: list[_Sequence], plans: list[_Plan], logits: list[torch.Tensor]) -> list[_Read]:
    """The step's logits as the host needs them, for every sequence of the batch in one copy: each
    row's argmax and, where a sequence samples, its draw (``Verifier.choose``); the top-k and their
    probabilities where a source learns from them."""
    k = max((seq.proposer.topk for seq in batch if seq.proposer is not None), default=0)
    sizes = [len(step_logits) for step_logits in logits]
    flat = torch.cat(logits) if len(logits) > 1 else logits[0]
    columns = [flat.argmax(-1, keepdim=True)]
    sampled = any(seq.verify is not verify_greedy for seq in batch)
    if sampled:
        columns.append(torch.cat([seq.verify.choose(step_logits) for seq, step_logits in zip(batch, logits)])[:, None])
    if k:
        top = flat.topk(k, dim=-1)
        columns += [top.indices, (top.values - flat.logsumexp(-1, keepdim=True)).exp()]
    # float64 holds token ids (below 2 ** 53) and float32 probabilities exactly: one copy
    host = torch.cat([column.double() for column in columns], 1).cpu()
    argmax = host[:, 0].long().tolist()
    chosen = host[:, 1].long().tolist() if sampled else argmax
    topk = host[:, -2 * k:-k].long() if k else None
    probs = host[:, -k:].float() if k else None
    reads, at = [], 0
    for n in sizes:
        reads.append(_Read(argmax[at:at + n], chosen[at:at + n], None if topk is None else topk[at:at + n],
                           None if probs is None else probs[at:at + n]))
        at += n
    return reads


def _accept(seq: _Sequence, tokens: list[int], limits: DecodeLimits, tokenizer, on_token: OnToken | None) -> int:
    """4. Append ``tokens`` to the sequence, one at a time, until EOS, max_new_tokens, a stop string
    or ``on_token`` says stop (then it is done); return how many it kept."""
    for kept, token in enumerate(tokens, start=1):
        seq.tokens.append(token)
        stop = on_token is not None and on_token(seq.index, seq.tokens)
        if stop or token in limits.eos_token_ids or len(seq.tokens) - len(seq.prompt) >= limits.max_new_tokens or \
                limits.stop_strings and _hits_stop(tokenizer, seq.tokens[len(seq.prompt):], limits.stop_strings):
            seq.done = True
            return kept
    return len(tokens)


def _last_layer(states: torch.Tensor, layers: int) -> torch.Tensor:
    """The last layer's columns of hidden states that come as ``layers`` layers side by side
    (``CausalLM.feature_layers``: the last first)."""
    return states[..., :states.shape[-1] // layers]


def _chose(plan: _Plan, verdict: Verdict, kept: int) -> torch.Tensor:
    """The logit rows that chose the step's ``kept`` tokens: the input token's and the accepted path's."""
    return plan.layout.tree_picks[[0] + [node + 1 for node in verdict.path[:kept - 1]]]


def _learn(seq: _Sequence, plan: _Plan, verdict: Verdict, kept: int, read: _Read, hidden: torch.Tensor | None,
           chose: tuple[torch.Tensor, torch.Tensor] | None = None, layers: int = 1) -> None:
    """6. Hand the sequence's sources what the step showed (``StepOutcome``): the ``kept`` tokens it
    committed, the window's next level, every logit row's top-k, the hidden state of the row that
    gave the last kept token (the last layer's: the first of the ``layers`` side by side; with
    ``chose``, the rows that gave the kept tokens and those tokens, on the device: all of them, of
    each of those rows, and the tokens); and count the tree's acceptance (``Proposer.update``)."""
    proposer, layout, fed = seq.proposer, plan.layout, plan.feed.tokens
    if proposer is None:
        return
    outcome = StepOutcome(seq.tokens, len(seq.tokens) - kept, fed[0])
    if plan.with_window:
        outcome = replace(outcome, window_next=[read.argmax[r] for r in layout.last_level_picks.tolist()])
    if proposer.topk:
        outcome = replace(outcome, row_tokens=[fed[r] for r in layout.logit_rows.tolist()],
                          row_topk=read.topk, row_topk_probs=read.topk_probs)
    if hidden is not None:
        outcome = replace(outcome, hidden=_last_layer(hidden[int(_chose(plan, verdict, kept)[-1])], layers))
    if chose is not None:
        outcome = replace(outcome, features=hidden[chose[0]], feature_tokens=chose[1])
    proposer.update(outcome, plan.tree, verdict.path)


def _keep(lm: CausalLM, cache, past: int, valid: list[int], batch: list[_Sequence], plans: list[_Plan],
          verdicts: list[Verdict], kept: list[int], features: bool) -> dict[str, torch.Tensor]:
    """5. Keep each sequence's KV rows of the step, the input token's and the accepted path's as far
    as its ``kept`` tokens go (the last one has no KV yet), in one copy (``commit_kv``) that also
    carries, on the device, the rows that gave the kept tokens and those tokens (``rows{b}``,
    ``tokens{b}``, where a source learns from features) and the batch rows that stay (``rest``)."""
    keep, also = [], {}
    for b, (seq, plan, verdict, n) in enumerate(zip(batch, plans, verdicts, kept)):
        path_rows = plan.layout.tree_rows[verdict.path].tolist() if verdict.path else []
        keep.append([0] + path_rows[: n - 1])
        if features and seq.proposer is not None:
            also |= {f"rows{b}": _chose(plan, verdict, n), f"tokens{b}": torch.tensor(seq.tokens[-n:])}
    rest = [r for r, seq in enumerate(batch) if not seq.done]
    if 0 < len(rest) < len(batch):
        also["rest"] = torch.tensor(rest)
    return lm.commit(cache, past, keep, valid, also)


def _hits_stop(tokenizer, generated: list[int], stop_strings: tuple[str, ...]) -> bool:
    # Only the tail can hold a new match: decode a window wide enough for the longest stop string.
    tail = tokenizer.decode(generated[-(max(map(len, stop_strings)) + 8):])
    return any(s in tail for s in stop_strings)


def _prefill(lm: CausalLM, prompts: list[list[int]], state: DecodeState | None, stats: list[DecodeStats],
             hidden: bool, clock: ForwardClock, features: bool = False,
             ) -> tuple[object, list[tuple[torch.Tensor, torch.Tensor | None]]]:
    """Fill the cache with the prompts (right-padded; with a state, the one prompt's uncached part);
    return each prompt's last logits (V,) and, with ``hidden``, its last hidden state (1, H) (with
    ``features``: every fed row's, (n, H)), else None."""
    if state is not None and state.cache is not None:
        cache = state.cache
        reuse = _common_prefix(state.cached_tokens, prompts[0])
        reuse = min(reuse, len(prompts[0]) - 1)             # at least one token must be fed
        truncate_kv(cache, reuse)
    else:
        cache, reuse = lm.new_cache(), 0
    feeds = [Feed(p[reuse:], torch.arange(len(p) - reuse), None, reuse, torch.tensor([len(p) - reuse - 1]),
                  torch.arange(len(p) - reuse) if features else None) for p in prompts]
    with clock.span() as span:
        outs = lm.forward_batch(cache, feeds, hidden)
    seconds = clock.seconds([span])                   # the first token's logits are read next anyway
    for s, f in zip(stats, feeds):
        s.prefill_seconds, s.prefill_tokens = seconds, len(f.tokens)
    if hidden:
        return cache, [(logits[0], states) for logits, states in outs]
    return cache, [(logits[0], None) for logits in outs]


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


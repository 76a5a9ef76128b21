"""Where a step's candidates come from: one small interface, one class per source, one tree.

In the spirit of transformers' candidate generators, a source has two methods:

* ``propose(context) -> list[Draft]``: candidate continuations of the last committed token, each
  token tagged with the source (and variant) that proposed it;
* ``update(outcome)``: learn from the step just verified (the committed text, the logits' top-k
  successors, the lookahead window's new tokens).

Sources:

* :class:`NGramSource`: the paper's n-gram pool keyed on one token, fed by the Jacobi lookahead
  window (tag ``jacobi:h<hits>``) and, with ``prompt_pool``, by every n-gram of prompt and output
  (``pool:h<hits>``; hits: how often the n-gram was inserted, 1, 2, 3+); it owns the window, whose
  rows the step feeds beside the tree.
* :class:`SuffixSource`: continuations of the context's suffix where it occurred before in prompt +
  output (prompt lookup, SuffixDecoding), longest match first, several matches becoming branches
  (``suffix:<b>:c<n>``, b = the matched length's bucket: 1, 2, 3, 4, 8, 16, 32; n = how many of
  the occurrences looked up go on with the same next token: 1, 2, 3+).
* :class:`RecycleSource`: Token Recycling's adjacency: per token, the top-k successors from the last
  logits computed at that token (every row the step already computes: input, tree, the window's
  last level; with ``recycle_window`` every window row); a tree grown from it by a fixed
  template (``recycle:p<d>``, d = the decile of the successor's softmax probability there). The
  table outlasts the decode: it travels in the prior (``DraftStats.carried``), so a decode whose
  prior carries one drafts from its first step.
* ``MedusaSource`` (``lookahead_core/medusa.py``): trained Medusa heads' top tokens along their
  sparse tree (``medusa:<rank>``, depth = head), from the hidden state the step hands over.

:class:`Proposer` combines any subset: it merges every draft into one tree (``layout.build_tree``),
scores each node by the estimated probability that the walk reaches it (the product of per-(tag,
depth) acceptance rates, measured online as steps verify; a tag carries the node's own evidence
(match length and agreeing occurrences, hits, probability decile), so a rate is per node class,
and an unseen one starts from the tag's own estimate (a probability decile's midpoint) or the
depth above), keeps the best nodes within the step's token budget (``layout.prune_tree``) and
records fed / tried / accepted counts per tag and depth, and each tried node's estimate against
its outcome (``DraftStats.reliability``, :class:`Bins`: a reliability diagram per source).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import islice
from typing import Protocol

import torch

from .config import LookaheadConfig
from .layout import Draft, DraftTree, build_tree, prune_tree
from .pool import NGramPool
from .sources import active
from .window import JacobiWindow

SUFFIX_CONTEXT = 4          # the longest context suffix SuffixSource looks up in its index
MATCH_CAP = 32              # how far back a found match is measured (its tag's bucket)
LOOKUPS = 32                # occurrences of one key measured per step, most recent first
PRIOR_TRIES = 2             # the weight, in tries, of a (tag, depth)'s prior acceptance
RECALIBRATION_TRIES = 5     # the weight, in nodes, of "estimates are right" in DraftStats.corrected


@dataclass(frozen=True)
class StepOutcome:
    """What a verified step tells the sources."""

    context: Sequence[int]                 # every committed token (the last one has no KV yet)
    new_from: int                          # index in ``context`` of the first token committed this step
    input_token: int
    window_next: list[int] | None = None   # argmax of the window's last-level rows
    row_tokens: list[int] = field(default_factory=list)   # the token fed at each row with logits
    row_topk: torch.Tensor | None = None   # (rows, k) top-k successors of those rows' logits
    row_topk_probs: torch.Tensor | None = None   # (rows, k) their softmax probabilities
    hidden: torch.Tensor | None = None     # (H,) last hidden state of the row that predicted the last
                                           # committed token (for sources registered with hidden=True)
    features: torch.Tensor | None = None   # (k, H) last hidden states of the rows at positions
                                           # len(context) - 1 - k .. len(context) - 2, each of which predicted
                                           # the token after it (for sources registered with features=True)
    feature_tokens: torch.Tensor | None = None   # (k,) those tokens, context[-k:], on the features' device
                                                 # (None: the source makes them from ``context``)


class DraftSource(Protocol):
    """What the proposer asks of a source. A registered source (``lookahead_core/sources.py``) also
    has ``from_config(config, size, context)``; its drafts' tags start with its registered name."""

    topk: int                              # successors per computed row ``update`` wants (0: none)

    def propose(self, context: Sequence[int]) -> list[Draft]: ...

    def update(self, outcome: StepOutcome) -> None: ...

    # Optional, for a source that keeps what it learns across decodes (RecycleSource): ``name`` and
    # ``carry(earlier) -> state``, called once per decode: it starts from ``earlier`` (the state the
    # decode's prior carries under ``name``, read only) and returns its own state, a dict that
    # travels in ``DraftStats.carried`` to the next decode's prior, on top of ``earlier``.
    # Optional, for a source with state of the conversation's text (EagleSource's KV cache): ``name``,
    # ``handover() -> state | None`` at the decode's end and ``resume(state)`` before the next turn's
    # first update; the state travels in ``DecodeState.sources``.
    # Optional, for a source that drafts on the model's device (EagleSource): ``launch() -> tensor |
    # None`` queues the step's work, and the decode loop reads every sequence's tensor in one copy
    # and hands each its part (``land(values)``) before ``propose``.


class NGramSource:
    """The n-gram pool (one-token keys, up to G continuations each) and the Jacobi window feeding it."""

    topk = 0

    def __init__(self, pool: NGramPool, window: JacobiWindow | None, text: bool, context: Sequence[int]) -> None:
        self.pool, self.window, self.text = pool, window, text
        if text:
            pool.add_from_sequence(context)

    def propose(self, context: Sequence[int]) -> list[Draft]:
        """Each continuation tagged ``<origin>:h<hits>`` (hits 1, 2, 3 = three or more)."""
        return [Draft(c, (f"{origin}:h{min(hits, 3)}",) * len(c)) for c, origin, hits in self.pool.tagged(context[-1])]

    def update(self, outcome: StepOutcome) -> None:
        if self.window is not None and outcome.window_next is not None:
            self.pool.add_all(self.window.update(outcome.input_token, outcome.window_next), "jacobi")
        if self.text:
            self.pool.add_from_sequence(outcome.context, new_from=outcome.new_from)


class SuffixSource:
    """Continuations of the context's suffix where it matched longest before, longest match first.

    An index maps every m-gram (m = 1..``SUFFIX_CONTEXT``) of the context to the positions where it
    ends, updated as tokens are committed. ``propose`` looks up the last m tokens for m from long to
    short; each occurrence's match is then measured backwards, up to ``MATCH_CAP`` tokens, and the
    occurrences are taken longest match first (most recent first among equals, at most
    ``LOOKUPS`` per key), up to ``matches`` distinct continuations of ``depth`` tokens. Tags carry
    the match length's bucket and how many of the key's looked-up occurrences go on with the same
    next token (``suffix:<b>:c<n>``, :func:`match_bucket`, n capped at 3), so the acceptance
    measured per (tag, depth) learns that a 20-token match (a copy in progress) goes on deeper than
    a 1-token one, and that a continuation three occurrences agree on beats one of three that
    disagree; the budget keeps deep nodes where a copy is running and cuts them where it is not. A
    continuation that runs into the end of the text goes on copying itself (as an LZ77 overlapping
    copy does), so a text that repeats with period p gets full-depth drafts.
    """

    topk = 0

    def __init__(self, matches: int, depth: int, context: Sequence[int]) -> None:
        self.matches, self.depth = matches, depth
        self._ends: dict[tuple[int, ...], list[int]] = {}
        self._indexed = 0
        self._index(context)

    @classmethod
    def from_config(cls, config: LookaheadConfig, size: int, context: Sequence[int]) -> SuffixSource:
        return cls(size, config.draft_depth, context)

    def _index(self, context: Sequence[int]) -> None:
        for end in range(self._indexed, len(context)):
            for m in range(1, min(SUFFIX_CONTEXT, end + 1) + 1):
                self._ends.setdefault(tuple(context[end - m + 1:end + 1]), []).append(end)
        self._indexed = len(context)

    def propose(self, context: Sequence[int]) -> list[Draft]:
        self._index(context)
        last = len(context) - 1
        drafts: list[Draft] = []
        seen: set[tuple[int, ...]] = set()
        for m in range(min(SUFFIX_CONTEXT, len(context)), 0, -1):
            occurrences = reversed(self._ends.get(tuple(context[last - m + 1:]), ()))
            ends = list(islice((e for e in occurrences if e != last), LOOKUPS))   # not every one of a common token
            lengths = [match_length(context, end, last, m) for end in ends]
            agree = Counter(context[end + 1] for end in ends)          # occurrences per next token
            for length, end in sorted(zip(lengths, ends), key=lambda pair: -pair[0]):    # stable: recent first
                continuation = _copy(context, end + 1, self.depth)
                if continuation in seen:
                    continue
                seen.add(continuation)
                tag = f"suffix:{match_bucket(length)}:c{min(agree[continuation[0]], 3)}"
                drafts.append(Draft(continuation, (tag,) * len(continuation)))
                if len(drafts) == self.matches:
                    return drafts
        return drafts

    def update(self, outcome: StepOutcome) -> None:
        self._index(outcome.context)


def match_length(context: Sequence[int], end: int, last: int, known: int) -> int:
    """How many tokens ending at ``end`` equal those ending at ``last`` (``end < last``), at least
    ``known`` (already matched), at most ``MATCH_CAP``.

    >>> match_length([5, 1, 2, 9, 5, 1, 2], end=2, last=6, known=1)
    3
    """
    length = known
    while length < MATCH_CAP and end - length >= 0 and context[end - length] == context[last - length]:
        length += 1
    return length


def match_bucket(length: int) -> int:
    """1, 2, 3, 4, then powers of two: 5-7 -> 4, 8-15 -> 8, 16-31 -> 16, 32 -> 32.

    >>> [match_bucket(m) for m in (1, 3, 4, 7, 8, 20, 32)]
    [1, 3, 4, 4, 8, 16, 32]
    """
    return length if length <= 4 else 1 << (length.bit_length() - 1)


def _copy(context: Sequence[int], start: int, length: int) -> tuple[int, ...]:
    """``length`` tokens from ``context[start]`` on, continuing into the copy itself past the end."""
    out: list[int] = []
    for k in range(length):
        i = start + k
        out.append(context[i] if i < len(context) else out[i - len(context)])
    return tuple(out)


class RecycleSource:
    """Token Recycling: per token, the top-``k`` successors from the last logits computed at it.

    The table (a dict, only tokens seen so far) is refreshed from every row whose logits the step
    computed anyway. ``propose`` grows a tree from the last token: its ``k`` successors, each of
    those with its top ``k // 2``, then ``k // 4``, ... (at least 1), ``depth`` levels deep. Each
    node is tagged with its own estimate: the decile of the softmax probability the successor had
    at the row it came from (``recycle:p<d>``, d = 0..9; :func:`tag_guess` reads it), so a step can
    tell the confident successor from the three long shots beside it. The table outlasts the
    decode (Token Recycling keeps its matrix across queries): :meth:`carry`.
    """

    name = "recycle"            # what its table travels under in a prior (``DraftStats.carried``)

    def __init__(self, k: int, depth: int) -> None:
        self.topk, self.depth = k, depth
        self.successors: dict[int, list[tuple[int, int]]] = {}    # token -> [(successor, decile)]
        self.earlier: dict[int, list[tuple[int, int]]] = {}       # read only: earlier decodes' table

    @classmethod
    def from_config(cls, config: LookaheadConfig, size: int, context: Sequence[int]) -> RecycleSource:
        return cls(size, config.draft_depth)

    def carry(self, earlier: dict) -> dict:
        """Draft from ``earlier``, the table the decode's prior carries (read, never written: every
        decode from the same prior starts alike), where this decode has no row of its own; return
        this decode's table, which the next prior carries on top (``DraftStats.learnt``)."""
        self.earlier = earlier
        return self.successors

    def _next(self, token: int) -> list[tuple[int, int]]:
        found = self.successors.get(token)
        return found if found is not None else self.earlier.get(token, [])

    def propose(self, context: Sequence[int]) -> list[Draft]:
        drafts: list[Draft] = []

        def grow(token: int, tokens: tuple[int, ...], tags: tuple[str, ...], width: int) -> None:
            nexts = self._next(token)[:width] if len(tokens) < self.depth else []
            if not nexts and tokens:
                drafts.append(Draft(tokens, tags))
            for nxt, decile in nexts:
                grow(nxt, tokens + (nxt,), tags + (f"recycle:p{decile}",), max(1, width // 2))

        grow(int(context[-1]), (), (), self.topk)
        return drafts

    def update(self, outcome: StepOutcome) -> None:
        if outcome.row_topk is None:
            return
        probs = outcome.row_topk_probs
        deciles = (probs * 10).clamp(max=9).int().tolist() if probs is not None else None
        for r, (token, successors) in enumerate(zip(outcome.row_tokens, outcome.row_topk.tolist())):
            row_deciles = deciles[r] if deciles is not None else [5] * len(successors)
            self.successors[token] = list(zip(successors, row_deciles))


def tag_guess(tag: str) -> float | None:
    """The acceptance a tag's own estimate predicts before any is measured: ``...:p<d>`` (a
    probability decile) -> its midpoint; ``None`` for tags without one.

    >>> tag_guess("recycle:p7"), tag_guess("suffix:4")
    (0.75, None)
    """
    last = tag.rsplit(":", 1)[-1]
    return (int(last[1:]) + 0.5) / 10 if len(last) == 2 and last[0] == "p" and last[1].isdigit() else None


def best_size(scores: Sequence[float], step_costs: Sequence[float], rows: int, room: int) -> int:
    """How many of a tree's nodes to feed: the m in 0 .. ``room`` (best-scored first, as
    ``prune_tree`` keeps them) that maximises (1 + the sum of their scores) / ``step_costs[rows + m - 1]``,
    i.e. expected tokens committed per unit of step cost, where a node's score is its estimated
    probability of being accepted and ``rows`` the tokens fed besides the tree (input + window).

    >>> best_size([0.9, 0.8, 0.1], [1.0, 1.2, 1.3, 3.0], rows=1, room=3)   # 2 nodes: 2.7 / 1.3
    2
    >>> best_size([0.2], [1.0, 1.5], rows=1, room=1)                      # 1.2 / 1.5 < 1 / 1
    0
    """
    best, best_value, total = 0, 1.0 / step_costs[rows - 1], 1.0
    for m, score in enumerate(sorted(scores, reverse=True)[:max(room, 0)], start=1):
        total += score
        value = total / step_costs[rows + m - 1]
        if value > best_value:
            best, best_value = m, value
    return best


def base_source(tag: str) -> str:
    """``suffix:3`` -> ``suffix``."""
    return tag.split(":", 1)[0]


def node_class(tag: str, tags: Sequence[str]) -> str:
    """A node's class as one of its tags sees it: the tag, ``|``, the other sources that proposed
    the node (``alone`` if none).

    >>> node_class("pool:h1", ("pool:h1",)), node_class("pool:h1", ("suffix:4:c1", "pool:h1", "recycle:p3"))
    ('pool:h1|alone', 'pool:h1|recycle+suffix')
    """
    own = base_source(tag)
    return f"{tag}|{'+'.join(sorted({base_source(t) for t in tags} - {own})) or 'alone'}"


def tried_nodes(tree: DraftTree, path: Sequence[int]) -> list[tuple[tuple[str, ...], int, bool]]:
    """(tags, depth, accepted) of every node the walk looked at: its parent was accepted."""
    on_path = set(path)
    return [(tags, depth, node in on_path) for node, (tags, parent, depth)
            in enumerate(zip(tree.tags, tree.parents, tree.depths)) if parent < 0 or parent in on_path]


@dataclass
class Counts:
    """Counting: per (tag or node class, depth), the nodes fed, those tried (their parent was
    accepted, so the walk looked at them) and those accepted; saved and read back as a table."""

    fed: Counter = field(default_factory=Counter)
    tried: Counter = field(default_factory=Counter)
    accepted: Counter = field(default_factory=Counter)

    def add(self, tree: DraftTree, path: Sequence[int]) -> None:
        """Count a verified step: every node fed, per tag; those tried and accepted, per tag and per
        node class (:func:`node_class`)."""
        for tags, depth in zip(tree.tags, tree.depths):
            for tag in tags:
                self.fed[tag, depth] += 1
        for tags, depth, accepted in tried_nodes(tree, path):
            for key in {*tags, *(node_class(tag, tags) for tag in tags)}:
                self.tried[key, depth] += 1
                self.accepted[key, depth] += accepted

    def merge(self, other: Counts) -> None:
        self.fed.update(other.fed), self.tried.update(other.tried), self.accepted.update(other.accepted)

    def table(self, by_source: bool = True) -> list[dict]:
        """Rows (source, depth, fed, tried, accepted, acceptance = accepted / tried) per source, or
        per tag and node class (``by_source=False``, what ``from_table`` reads back)."""
        rows: dict[tuple[str, int], Counter] = {}
        for counter, name in ((self.fed, "fed"), (self.tried, "tried"), (self.accepted, "accepted")):
            for (tag, depth), n in counter.items():
                if by_source and "|" in tag:          # a node class: its nodes are its tag's too
                    continue
                key = (base_source(tag) if by_source else tag, depth)
                rows.setdefault(key, Counter())[name] += n
        return [{"source": s, "depth": d, "fed": c["fed"], "tried": c["tried"], "accepted": c["accepted"],
                 "acceptance": c["accepted"] / c["tried"] if c["tried"] else None}
                for (s, d), c in sorted(rows.items())]

    @classmethod
    def from_table(cls, rows: Sequence[dict]) -> Counts:
        """The counts of ``table(by_source=False)``'s rows, e.g. from a saved record."""
        counts = cls()
        for row in rows:
            key = (row["source"], int(row["depth"]))
            for name in ("fed", "tried", "accepted"):
                if row[name]:
                    getattr(counts, name)[key] = int(row[name])
        return counts


def _decile(estimate: float) -> int:
    return min(int(estimate * 10), 9)


class Bins(Counter):
    """Estimates against outcomes, per source and decile of the estimate: ``(source, decile, kind)``
    -> the nodes tried, those accepted and their estimates' sum (kind ``tried``, ``accepted``,
    ``predicted``). Recalibration scales an estimate by its bin's accepted / predicted; the rows
    are a reliability diagram's points."""

    def add(self, source: str, estimate: float, accepted: bool) -> None:
        bin_ = _decile(estimate)
        self[source, bin_, "tried"] += 1
        self[source, bin_, "accepted"] += bool(accepted)
        self[source, bin_, "predicted"] += estimate

    def rows(self) -> list[dict]:
        """Rows (source, bin, tried, predicted = mean estimate, observed = accepted / tried) per bin:
        well-calibrated estimates put every bin's observed rate near its mean prediction."""
        keys = sorted({(source, bin_) for source, bin_, _ in self})
        return [{"source": source, "bin": bin_, "tried": self[source, bin_, "tried"],
                 "predicted": self[source, bin_, "predicted"] / self[source, bin_, "tried"],
                 "observed": self[source, bin_, "accepted"] / self[source, bin_, "tried"]}
                for source, bin_ in keys if self[source, bin_, "tried"]]

    def to_list(self) -> list[list]:
        """The bins as JSON-able ``[source, bin, kind, value]`` rows, what ``from_list`` reads back."""
        return [[source, bin_, kind, value] for (source, bin_, kind), value in sorted(self.items())]

    @classmethod
    def from_list(cls, rows: Sequence[Sequence]) -> Bins:
        return cls({(source, int(bin_), kind): value for source, bin_, kind, value in rows})


def reliability_table(outcomes: Sequence[tuple[str, float, bool]]) -> list[dict]:
    """:meth:`Bins.rows` of (source, predicted acceptance, accepted) per tried node.

    >>> reliability_table([("recycle", 0.82, True), ("recycle", 0.88, False), ("suffix", 0.31, False)])
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'source': 'recycle', 'bin': 8, 'tried': 2, 'predicted': 0.85, 'observed': 0.5},
     {'source': 'suffix', 'bin': 3, 'tried': 1, 'predicted': 0.31, 'observed': 0.0}]
    """
    bins = Bins()
    for source, predicted, accepted in outcomes:
        bins.add(source, predicted, accepted)
    return bins.rows()


@dataclass
class DraftStats:
    """A decode's draft acceptance: what it measured (``counts``; the ``calibration`` and
    ``reliability`` bins), what its sources carry to later decodes (``carried``), on top of what
    earlier decodes measured (``prior``); and the estimate a node is cut by, made of three parts.

    1. **Its class's rate.** A node's class is a tag with the other sources that proposed the same
       node (:func:`node_class`: ``pool:h1|alone``, ``pool:h1|recycle+suffix``), because agreement
       is evidence: on SmolLM2 HumanEval a pool n-gram no other source proposes was accepted at
       0.06, one a suffix match or a recycled successor also proposes at 0.22 (docs/auto.md), and
       counting both under ``pool:h1`` prices the first at the second's rate. ``rate`` = accepted / tried,
       smoothed toward a prior worth ``PRIOR_TRIES`` tries: the ``prior``'s rate where it has tried
       the class, else the tag's (all nodes of the tag, whatever proposed them beside), whose own
       prior is the ``prior``'s, else the tag's own estimate (:func:`tag_guess`), else a coin flip
       at depth 1 and deeper the same tag's rate one level up.
    2. **The best of its tags**: the class rates of a node's tags differ (a suffix match's class
       knows the copy is running), and the node takes the highest, after 3.
    3. **Recalibration.** A per-class rate is a noisy estimate, and the cut feeds the nodes whose
       estimate is high: the fed ones are over-rated on average (the winner's curse; before this
       step pool n-grams were fed at 0.41 and accepted at 0.21). So every tried node's raw
       estimate is binned by decile against its outcome, per source (``calibration``), and the
       estimate the cut uses is the raw one times its bin's accepted / predicted ratio, toward 1
       with ``RECALIBRATION_TRIES`` pseudo-nodes (:meth:`corrected`; histogram binning, learnt as
       the decode goes, from earlier steps only). ``reliability`` bins the corrected estimates
       against the outcomes: the diagram a user checks (``reliability.rows()``).

    ``prior``: what other decodes measured (``decoding=auto``'s store, a conversation's earlier
    turns; ``DecodeState.drafts``). Without it a decode starts from the guesses, and a budget that
    feeds only the nodes that pay (``step_costs``) may never feed, so never measure, a node the
    guesses undervalue: on a device where a 4-token step costs 1.9 single steps, one suffix match
    scored 0.5, 0.25, 0.125 never pays, though copies are accepted at 0.8-1.0 given the parent
    beyond depth 1. The level-above guess is what lets an unseen depth-9 node score more than
    0.5 ** 9 (measured acceptance given the parent rises with depth: suffix drafts on CNN/DM 0.34,
    0.83, 0.90, 0.96, 0.99, so the level above is a cautious guess).

    ``carried``: per source name, the state a source keeps across decodes (``DraftSource.carry``;
    Token Recycling's successor table under ``recycle``), handed on by :meth:`learnt` as acceptance is."""

    counts: Counts = field(default_factory=Counts)
    calibration: Bins = field(default_factory=Bins, repr=False, compare=False)   # of the raw estimates
    reliability: Bins = field(default_factory=Bins, repr=False, compare=False)   # of the estimates used
    carried: defaultdict = field(default_factory=lambda: defaultdict(dict), repr=False, compare=False)
    prior: DraftStats | None = field(default=None, repr=False, compare=False)
    _rates: dict = field(default_factory=dict, repr=False, compare=False)

    def rate(self, tag: str, depth: int) -> float:
        """The smoothed acceptance of a tag or a node class (:func:`node_class`) at ``depth``,
        given the parent: part 1 above."""
        key = (tag, depth)
        if key not in self._rates:
            plain, _, _ = tag.partition("|")
            guess = _guess(plain, depth)
            if self.prior is not None and self.prior.counts.tried[key]:
                prior = self.prior.rate(tag, depth)
            elif plain != tag:                        # an unseen class: its tag's rate
                prior = self.rate(plain, depth)
            elif guess is not None:                   # the node's own estimate, or a coin flip, until measured
                prior = guess
            else:
                prior = self.rate(tag, depth - 1)
            self._rates[key] = (self.counts.accepted[key] + PRIOR_TRIES * prior) / (self.counts.tried[key] + PRIOR_TRIES)
        return self._rates[key]

    def corrected(self, source: str, raw: float) -> float:
        """``raw`` times the accepted / predicted ratio of its decile among the source's tried nodes
        (this decode's and the prior's), toward 1 with ``RECALIBRATION_TRIES`` pseudo-nodes: part 3."""
        bin_ = _decile(raw)
        accepted = predicted = 0.0
        for stats in (self, self.prior):
            if stats is not None:
                accepted += stats.calibration[source, bin_, "accepted"]
                predicted += stats.calibration[source, bin_, "predicted"]
        if not predicted:
            return raw
        return min(1.0, raw * (accepted + RECALIBRATION_TRIES) / (predicted + RECALIBRATION_TRIES))

    def estimate(self, tags: Sequence[str], depth: int) -> tuple[float, str]:
        """A node's estimated acceptance given its parent (the best of its tags' corrected class
        rates) and the tag it comes from: what ``Proposer.scores`` multiplies along the path."""
        return max((self.corrected(base_source(tag), self.rate(node_class(tag, tags), depth)), tag) for tag in tags)

    def record(self, tree: DraftTree, path: Sequence[int]) -> None:
        """Count a verified step (``counts``) and bin each tried node's raw and corrected estimate,
        as it was fed (before this step's counts), against its outcome."""
        outcomes = []                                 # every estimate first, then the bins and counts
        for tags, depth, accepted in tried_nodes(tree, path):
            used, tag = self.estimate(tags, depth)
            outcomes.append((base_source(tag), self.rate(node_class(tag, tags), depth), used, accepted))
        for source, raw, used, accepted in outcomes:
            self.calibration.add(source, raw, accepted)
            self.reliability.add(source, used, accepted)
        self.counts.add(tree, path)
        self._rates.clear()

    def merge(self, other: DraftStats) -> None:
        """Add ``other``'s counts and bins; its carried states update these, entry by entry."""
        self.counts.merge(other.counts)
        self.calibration.update(other.calibration), self.reliability.update(other.reliability)
        for name, state in other.carried.items():
            self.carried[name].update(state)
        self._rates.clear()

    def learnt(self) -> DraftStats:
        """The prior plus these, as one prior for the next decode (no prior of its own)."""
        out = DraftStats()
        if self.prior is not None:
            out.merge(self.prior)
        out.merge(self)
        return out


def _guess(tag: str, depth: int) -> float | None:
    """The acceptance a (tag, depth) is guessed at before it is measured: the tag's own estimate
    (:func:`tag_guess`), else a coin flip at depth 1; ``None`` deeper (the level above is used)."""
    guess = tag_guess(tag)
    return guess if guess is not None else (0.5 if depth <= 1 else None)


class Proposer:
    """Any subset of sources, merged into one tree and cut to the step's token budget.

    With ``step_costs`` (a cut that feeds only what pays on this device) a source that proposed drafts
    and had none of them fed for ``IDLE_STEPS`` of its proposing steps in a row naps: it is not asked
    to propose (nor are logits' top-k computed for it) for 1 step, then, each time it is asked and again feeds nothing,
    twice as many, up to ``MAX_NAP``; a step in which it feeds wakes it for good. So where no draft
    pays at the acceptance learnt, a step feeds the one token a greedy step feeds and the sources'
    host work fades with their drafts, while a source whose text starts to pay (a copy begins) is
    heard again within ``MAX_NAP`` steps. Sources that draft on the device (``launch``) never nap,
    and every source is still updated every step (its index or table stays current)."""

    IDLE_STEPS = 4
    MAX_NAP = 64

    def __init__(self, sources: Sequence[DraftSource], *, merge: bool, budget: int = 0,
                 window: JacobiWindow | None = None, stats: DraftStats | None = None,
                 recycle_window: bool = False, step_costs: Sequence[float] = ()) -> None:
        self.sources = list(sources)
        self.merge, self.budget, self.window = merge, budget, window
        self.step_costs = tuple(step_costs)           # relative cost of a k-token step, k = 1 .. budget
        self.recycle_window = recycle_window          # the step keeps every window row's logits
        self.stats = stats if stats is not None else DraftStats()
        self._step = 0
        self._quiet = [0] * len(self.sources)         # steps in a row the source fed nothing
        self._nap = [0] * len(self.sources)           # its last nap's length (0: never napped since it fed)
        self._wake = [0] * len(self.sources)          # the step from which it is asked again
        earlier = self.stats.prior.carried if self.stats.prior is not None else {}
        for source in self.sources:                   # sources that keep what they learn across decodes
            if hasattr(source, "carry"):
                self.stats.carried[source.name] = source.carry(earlier.get(source.name, {}))

    @classmethod
    def from_config(cls, config: LookaheadConfig, context: Sequence[int], pool: NGramPool,
                    prompt: Sequence[int], drafters: dict | None = None,
                    stats: DraftStats | None = None) -> Proposer:
        """The n-gram pool and its window (the paper's), and every registered source the config
        turns on (``lookahead_core/sources.py``), those marked ``before_pool`` first; ``drafters``:
        the trained models of sources that need one (``CausalLM.drafters``); ``stats``: the
        decode's acceptance counts, their ``prior`` what earlier decodes learnt."""
        window = JacobiWindow(config.window, config.ngram, prompt, config.seed) if config.uses_window else None
        registered = active(config)
        sources: list[DraftSource] = [kind.build(config, size, context, drafters)
                                      for kind, size in registered if kind.before_pool]
        if config.guess or window is not None:
            sources.append(NGramSource(pool, window, config.prompt_pool, context))
        sources += [kind.build(config, size, context, drafters) for kind, size in registered if not kind.before_pool]
        return cls(sources, merge=config.tree, budget=config.budget, window=window, stats=stats,
                   recycle_window=config.recycle_window, step_costs=config.step_costs)

    @property
    def topk(self) -> int:
        """Top-k successors per computed row the sources asked this step want (0: none)."""
        return max((s.topk for i, s in enumerate(self.sources) if self._awake(i)), default=0)

    def _awake(self, index: int) -> bool:
        return self._wake[index] <= self._step

    def propose(self, context: Sequence[int], window_rows: int) -> DraftTree:
        self._step += 1
        proposed = [(i, s.propose(context)) for i, s in enumerate(self.sources) if self._awake(i)]
        tree = build_tree([d for _, drafts in proposed for d in drafts], self.merge)
        room = self.budget - window_rows if self.budget else len(tree)
        if self.step_costs:
            scores = self.scores(tree)
            keep = best_size(scores, self.step_costs, window_rows, room)
            tree = prune_tree(tree, scores, keep)
            self._rest(proposed, {tag for tags in tree.tags for tag in tags})
            return tree
        if len(tree) > room:
            tree = prune_tree(tree, self.scores(tree), room)
        return tree

    def _rest(self, proposed: list[tuple[int, list[Draft]]], fed: set[str]) -> None:
        """After a cost-aware cut: wake the sources whose nodes were fed, nap those whose drafts the cut
        left out long enough. A source that proposed nothing this step (no copy found) neither counts
        as idle nor wakes: it spent no forward and may find one next step."""
        for i, drafts in proposed:
            if not drafts:
                continue
            if any(tag in fed for draft in drafts for tag in draft.tags):
                self._quiet[i] = self._nap[i] = 0
                continue
            self._quiet[i] += 1
            if not hasattr(self.sources[i], "launch") and (self._nap[i] or self._quiet[i] >= self.IDLE_STEPS):
                self._nap[i] = min(2 * self._nap[i] or 1, self.MAX_NAP)
                self._wake[i] = self._step + self._nap[i] + 1

    def scores(self, tree: DraftTree) -> list[float]:
        """Estimated probability that the walk accepts each node: its parent's times the best
        acceptance rate among the node's tags at its depth, the rates of siblings scaled down
        together where they sum past 1. The model's next token is one token, so at most one child
        of a node is accepted: children estimated apart (three unmeasured ones at a coin flip's 0.5
        each) would promise more tokens than a step can commit, and feed steps that do not pay."""
        rates = [self.stats.estimate(tags, depth)[0] for tags, depth in zip(tree.tags, tree.depths)]
        children: Counter[int] = Counter()
        for parent, rate in zip(tree.parents, rates):
            children[parent] += rate
        scores: list[float] = []
        for parent, rate in zip(tree.parents, rates):
            scores.append((scores[parent] if parent >= 0 else 1.0) * rate / max(1.0, children[parent]))
        return scores

    def update(self, outcome: StepOutcome, tree: DraftTree, path: Sequence[int]) -> None:
        self.stats.record(tree, path)
        for source in self.sources:
            source.update(outcome)

    def handover(self) -> dict[str, object]:
        """Per source name, what a source hands the conversation's next turn (``DecodeState.sources``)."""
        states = {s.name: s.handover() for s in self.sources if hasattr(s, "handover")}
        return {name: state for name, state in states.items() if state is not None}

    def resume(self, states: dict[str, object]) -> None:
        """Give each source what it handed over at the end of the conversation's last turn."""
        for source in self.sources:
            if hasattr(source, "resume") and source.name in states:
                source.resume(states[source.name])

    @property
    def draft_seconds(self) -> float:
        """Seconds the sources spent in forwards of their own (a drafter model's), ``seconds`` each."""
        return sum(getattr(source, "seconds", 0.0) for source in self.sources)

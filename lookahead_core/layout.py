"""Where each token of one fused lookahead step sits: rows, position offsets and the attention pattern.

A step feeds, in this order (docs/algorithm.md, "One step: layout, positions, mask"):

    [input token] [level 0: W-1 tokens] [level 1: W] ... [level L-1: W] [draft tree: n nodes]

The input token is column 0 of level 0. ``L`` is the number of filled window levels (N-1 once
warmed up, fewer during warm-up, 0 when there is no window). The draft tree holds every candidate
of the step merged into one prefix tree (:func:`build_tree`): each node is fed once, and node i's
parent is ``parents[i]`` (-1 = the input token), parents before children.

Rules, with p the position of the input token:
- level l, column i sits at p + l + i; a tree node of depth d (a child of the input token has
  d = 1) sits at p + d;
- level l, column i sees level-0 columns 0..i and its own column in levels 1..l;
- a tree node sees the input token, its ancestors and itself;
- the window and the tree never see each other; every row also sees the whole committed KV cache.

Example: W=3, L=2 (N=3) and the candidates (a, b), (a, c), (d,) merged into a tree
(a -> b, a -> c, d; 4 nodes instead of 5 tokens as linear branches):

    row  token  pos  sees (# = yes)
     0   x      p    #.........
     1   w01    p+1  ##........
     2   w02    p+2  ###.......
     3   w10    p+1  #..#......
     4   w11    p+2  ##..#.....
     5   w12    p+3  ###..#....
     6   a      p+1  #.....#...
     7   b      p+2  #.....##..
     8   c      p+2  #.....#.#.
     9   d      p+1  #........#

Linear branches (today's lookahead) are the tree built with ``merge=False``: every candidate is a
chain of its own, ``chains(c, N-1)``.

Everything here is a pure function of sizes and parent lists, so it is cached and tested cell by cell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache

import torch

from .config import window_rows


@dataclass(frozen=True)
class Draft:
    """One candidate continuation of the last committed token, with a tag per token naming the
    source (and variant) that proposed it, e.g. ``("suffix:3", "suffix:3")``."""

    tokens: tuple[int, ...]
    tags: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.tags):
            raise ValueError(f"a draft needs one tag per token, got {len(self.tokens)} tokens and {len(self.tags)} tags")


@dataclass(frozen=True)
class DraftTree:
    """Draft tokens as a tree hung under the step's input token.

    ``tokens[i]`` is node i's token, ``parents[i]`` its parent node (-1 = the input token), always
    an earlier node; ``tags[i]`` the tags of every draft that proposed node i.
    """

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    tags: tuple[tuple[str, ...], ...] = ()

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def depths(self) -> tuple[int, ...]:
        depth: list[int] = []
        for p in self.parents:
            depth.append(1 if p < 0 else depth[p] + 1)
        return tuple(depth)

    @cached_property
    def children(self) -> dict[int, tuple[int, ...]]:
        """Node (-1 = the input token) -> its children, in node order."""
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            kids.setdefault(p, []).append(i)
        return {k: tuple(v) for k, v in kids.items()}

    def path_to(self, node: int) -> list[int]:
        """The nodes from the input token's child down to ``node``."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]


EMPTY_TREE = DraftTree()


def build_tree(drafts: Sequence[Draft], merge: bool = True) -> DraftTree:
    """Merge ``drafts`` into one prefix tree (``merge=False``: one chain per draft, as linear branches).

    Nodes are numbered in insertion order (a parent always before its children); a node proposed by
    several drafts carries all their tags, first proposer first.
    """
    tokens: list[int] = []
    parents: list[int] = []
    tags: list[list[str]] = []
    index: dict[tuple[int, int], int] = {}           # (parent, token) -> node, when merging
    for draft in drafts:
        parent = -1
        for token, tag in zip(draft.tokens, draft.tags):
            key = (parent, int(token))
            node = index.get(key) if merge else None
            if node is None:
                node = len(tokens)
                tokens.append(int(token)), parents.append(parent), tags.append([tag])
                if merge:
                    index[key] = node
            elif tag not in tags[node]:
                tags[node].append(tag)
            parent = node
    return DraftTree(tuple(tokens), tuple(parents), tuple(tuple(t) for t in tags))


def prune_tree(tree: DraftTree, scores: Sequence[float], keep: int) -> DraftTree:
    """The ``keep`` best-scored nodes of ``tree``, renumbered in their original order.

    A node's score must not exceed its parent's (a path's estimated acceptance only falls with
    depth); ties go to the shallower, then earlier, node, so the kept set always contains every
    kept node's parent.
    """
    if keep >= len(tree):
        return tree
    order = sorted(range(len(tree)), key=lambda i: (-scores[i], tree.depths[i], i))
    kept = sorted(order[:max(keep, 0)])
    new_index = {old: new for new, old in enumerate(kept)}
    new_index[-1] = -1
    if any(tree.parents[i] not in new_index for i in kept):
        raise ValueError("scores must not increase from a node to its children")
    return DraftTree(tuple(tree.tokens[i] for i in kept), tuple(new_index[tree.parents[i]] for i in kept),
                     tuple(tree.tags[i] for i in kept))


def cut_tree(tree: DraftTree, max_depth: int | None) -> DraftTree:
    """``tree`` without its nodes deeper than ``max_depth`` (None: unchanged)."""
    if max_depth is None or all(d <= max_depth for d in tree.depths):
        return tree
    fits = [float(d <= max_depth) for d in tree.depths]     # never rises from a node to its children
    return prune_tree(tree, fits, int(sum(fits)))


def chains(candidates: int, length: int) -> tuple[int, ...]:
    """Parents of ``candidates`` separate chains of ``length`` tokens (linear branches)."""
    return tuple(-1 if k == 0 else j * length + k - 1 for j in range(candidates) for k in range(length))


@dataclass(frozen=True)
class StepLayout:
    """Index bookkeeping for one fused forward. Tensors live on the CPU and are never mutated."""

    window: int          # W (0 when there is no lookahead branch)
    levels: int          # filled window levels L
    parents: tuple[int, ...]       # the draft tree's parent list (-1 = the input token)
    offsets: torch.Tensor        # (q,) position of each row relative to the input token
    visible: torch.Tensor        # (q, q) bool, row may attend to column
    last_level_rows: torch.Tensor  # (W,) rows whose argmax extends the window ((0,) if none)
    tree_rows: torch.Tensor        # (n,) row of each tree node
    logit_rows: torch.Tensor       # (r,) sorted rows whose logits the step needs
    last_level_picks: torch.Tensor  # (W,) index into the step's logits (logit_rows' order) of each last-level row
    tree_picks: torch.Tensor       # (n+1,) index into the step's logits of the rows the verifier reads: those that
                                   # predict the children of the input token (first) and of each tree node
    causal: bool = False           # rows form a plain causal chain (greedy, one chain, no window)

    @property
    def size(self) -> int:
        return int(self.offsets.numel())

    @property
    def window_rows(self) -> int:
        """Rows of the input token plus the window (the tree starts here)."""
        return window_rows(self.window, self.levels)


def _row_coordinates(window: int, levels: int, nodes: int):
    """Per-row (level, column, node) coordinates; -1 where not applicable."""
    level, column, node = [0], [0], [-1]  # the input token: level 0, column 0
    for lvl in range(levels):
        for col in range(1 if lvl == 0 else 0, window):
            level.append(lvl), column.append(col), node.append(-1)
    for i in range(nodes):
        level.append(-1), column.append(-1), node.append(i)
    return torch.tensor(level), torch.tensor(column), torch.tensor(node)


def _ancestry(parents: tuple[int, ...]) -> torch.Tensor:
    """(n, n) bool: node i sees node j (j is i or one of its ancestors)."""
    n = len(parents)
    sees = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            sees[i] = sees[p]
        sees[i, i] = True
    return sees


@lru_cache(maxsize=1024)
def step_layout(window: int, levels: int, parents: tuple[int, ...] = (), all_logits: bool = False) -> StepLayout:
    """Build the layout of one step. ``window=0, levels=0`` gives the input token plus the tree.
    ``all_logits``: every row keeps its logits (``recycle_window``), not only those the step needs."""
    if levels and window < 1:
        raise ValueError(f"a window of {levels} levels needs window >= 1, got {window}")
    parents = tuple(int(p) for p in parents)
    for i, p in enumerate(parents):
        if not -1 <= p < i:
            raise ValueError(f"node {i}'s parent {p} must come before it (or be -1, the input token)")
    level, column, node = _row_coordinates(window, levels, len(parents))
    in_window = level >= 0
    base = window_rows(window, levels)
    depth = torch.tensor([0, *DraftTree(parents=parents, tokens=(0,) * len(parents)).depths], dtype=torch.long)

    offsets = torch.where(in_window, level + column, depth[node + 1])

    # Window rows: (l, i) sees level-0 columns <= i and column i of levels 1..l.
    lq, cq = level[:, None], column[:, None]
    lk, ck = level[None, :], column[None, :]
    sees_level0 = (lk == 0) & (ck <= cq)
    sees_own_column = (lk >= 1) & (ck == cq) & (lk <= lq)
    visible = in_window[:, None] & in_window[None, :] & (sees_level0 | sees_own_column)
    visible[0, 0] = True                   # with levels == 0 the input token is still row 0
    # Tree rows: the input token, the ancestors and the node itself.
    visible[base:, 0] = True
    visible[base:, base:] = _ancestry(parents)

    q = offsets.numel()
    if levels == 0:
        last_level_rows = torch.zeros(0, dtype=torch.long)
    else:
        last = levels - 1
        last_level_rows = torch.nonzero(level == last).flatten() if last > 0 else torch.arange(window)
    tree_rows = torch.arange(base, q)
    predicting_rows = torch.cat([torch.zeros(1, dtype=torch.long), tree_rows])
    logit_rows = torch.arange(q) if all_logits else torch.unique(torch.cat([predicting_rows, last_level_rows]))
    return StepLayout(
        window, levels, parents, offsets, visible, last_level_rows, tree_rows,
        logit_rows=logit_rows,
        last_level_picks=torch.searchsorted(logit_rows, last_level_rows),
        tree_picks=torch.searchsorted(logit_rows, predicting_rows),
        causal=bool(torch.equal(offsets, torch.arange(q)) and torch.equal(visible, visible.new_ones(q, q).tril())),
    )


def causal_layout(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets, visible) of a plain causal chain, as fed by a prefill."""
    return torch.arange(length), torch.ones(length, length, dtype=torch.bool).tril()


def allowed(
    b: torch.Tensor,
    q_idx: torch.Tensor,
    kv_idx: torch.Tensor,
    *,
    past: int | torch.Tensor,
    valid: torch.Tensor,
    position: torch.Tensor,
    offsets: torch.Tensor,
    visible: torch.Tensor,
    sliding_window: int | torch.Tensor | None,
    chain: bool | torch.Tensor = False,
) -> torch.Tensor:
    """May row ``q_idx`` of sequence ``b`` attend to cache slot ``kv_idx``? The one mask rule.

    Elementwise over broadcast index tensors: the dense mask evaluates it on index grids, the
    flex_attention path as its ``mask_mod`` on the scalar indices flex passes, so the two cannot
    drift. Cache slot j < ``past`` holds position j; sequence b's committed KV is its first
    ``valid[b]`` slots (later ones are hidden). Slot ``past + i`` holds row i of the step, at
    position ``position[b] + offsets[b, i]``; row r sees it where ``visible[b, r, i]``. ``chain``
    (a bool, or a 0-d bool tensor the compiled flex kernel reads at run time): the step is a causal
    chain instead (offsets 0, 1, 2, ...; the lower triangle), and ``offsets``/``visible`` are not
    read. A sliding-window layer also hides every key ``sliding_window`` or more positions behind
    the query, the rule transformers applies (``kv_idx > q_idx - sliding_window``).

    Indices past the end of ``offsets``/``visible`` are clamped (flex evaluates whole blocks, and a
    chain may be longer than the buffers; the cells that count are in range).
    """
    new = kv_idx - past
    in_past = new < 0
    last = visible.shape[-1] - 1
    row, col = q_idx.clamp(0, last), new.clamp(0, last)
    sees_new, query_off, key_off = visible[b, row, col], offsets[b, row], offsets[b, col]
    if chain is not False:
        sees_new = torch.where(chain, new <= q_idx, sees_new)
        query_off, key_off = torch.where(chain, q_idx, query_off), torch.where(chain, new, key_off)
    sees = torch.where(in_past, kv_idx < valid[b], sees_new)
    if sliding_window is None:
        return sees
    key_pos = torch.where(in_past, kv_idx, position[b] + key_off)
    return sees & (position[b] + query_off - key_pos < sliding_window)


def attention_mask(
    offsets: torch.Tensor,
    visible: torch.Tensor,
    past_len: int,
    position,
    *,
    sliding_window: int | None,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Float additive mask (B, 1, q, past_len + q) of :func:`allowed`: 0 where a row may attend,
    dtype-min elsewhere (eager and SDPA).

    One sequence: ``offsets`` (q,), ``visible`` (q, q), ``position`` an int, B = 1. A batch:
    ``offsets`` (B, q), ``visible`` (B, q, q), ``position`` (B,), one row per sequence. ``valid[b]``:
    sequence b's committed KV length (default: all ``past_len`` slots).

    Built on ``device``: only offsets, pattern and lengths are copied there, never the
    (q, past_len + q) mask, which grows with the context.
    """
    q = offsets.shape[-1]
    offsets = offsets.reshape(-1, q).to(device)
    batch = offsets.shape[0]
    position = torch.as_tensor(position, device=device).reshape(-1).expand(batch)
    valid = torch.full((batch,), past_len, device=device) if valid is None else valid.to(device)
    ok = allowed(
        torch.arange(batch, device=device)[:, None, None], torch.arange(q, device=device)[None, :, None],
        torch.arange(past_len + q, device=device)[None, None, :], past=past_len, valid=valid, position=position,
        offsets=offsets, visible=visible.reshape(-1, q, q).to(device), sliding_window=sliding_window,
    )
    mask = torch.zeros(ok.shape, dtype=dtype, device=device).masked_fill_(~ok, torch.finfo(dtype).min)
    return mask[:, None]

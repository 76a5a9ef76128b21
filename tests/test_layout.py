"""The fused step's mask and positions against a cell-by-cell reference of docs/algorithm.md's rules."""

import itertools

import pytest
import torch

import lookahead_core.layout as layout_module
from lookahead_core.layout import (Draft, attention_mask, build_tree, causal_layout, chains, prune_tree,
                                   step_layout, window_rows)


def reference_rows(window, levels, nodes):
    """Rows as docs/algorithm.md lists them: ('win', level, col) (the input token is ('win', 0, 0)), then ('node', i)."""
    rows = [("win", 0, 0)]
    rows += [("win", lvl, col) for lvl in range(levels) for col in range(window) if (lvl, col) != (0, 0)]
    rows += [("node", i, None) for i in range(nodes)]
    return rows


def ancestors_or_self(parents, i):
    out = set()
    while i >= 0:
        out.add(i)
        i = parents[i]
    return out


def reference_position(row, parents):
    kind, a, b = row
    return a + b if kind == "win" else len(ancestors_or_self(parents, a))


def reference_sees(q, k, parents):
    """docs/algorithm.md: level l col i sees level-0 cols 0..i and its own column in levels 1..l;
    a tree node sees the input token, its ancestors and itself; the window and the tree never meet."""
    if q[0] == "win" and k[0] == "win":
        _, lq, cq = q
        _, lk, ck = k
        return (lk == 0 and ck <= cq) or (1 <= lk <= lq and ck == cq)
    if q[0] == "node":
        if k == ("win", 0, 0):
            return True
        return k[0] == "node" and k[1] in ancestors_or_self(parents, q[1])
    return False


def random_parents(n, seed):
    gen = torch.Generator().manual_seed(seed)
    return tuple(int(torch.randint(-1, i, (1,), generator=gen)) for i in range(n))


TREES = ([chains(c, length) for c in (0, 1, 3) for length in (1, 2, 4)]
         + [random_parents(n, seed) for n, seed in ((1, 0), (5, 1), (9, 2), (16, 3))])
GRID = list(itertools.product([1, 2, 4, 7], [0, 1, 2, 4], TREES))


@pytest.mark.parametrize("window,levels,parents", GRID)
def test_layout_matches_cell_by_cell_reference(window, levels, parents):
    layout = step_layout(window, levels, parents)
    rows = reference_rows(window, levels, len(parents))
    assert layout.size == len(rows)
    assert layout.offsets.tolist() == [reference_position(r, parents) for r in rows]
    expected = torch.tensor([[reference_sees(q, k, parents) for k in rows] for q in rows])
    assert torch.equal(layout.visible, expected)
    # The step feeds 1 + (W-1) + (L-1)*W window tokens plus one row per tree node.
    assert layout.size == window_rows(window, levels) + len(parents)
    last = [i for i, r in enumerate(rows) if levels and r[0] == "win" and r[1] == levels - 1]
    assert layout.last_level_rows.tolist() == last
    assert layout.tree_rows.tolist() == [i for i, r in enumerate(rows) if r[0] == "node"]
    # Row 0 predicts the input token's children, node i's row the children of node i.
    assert layout.logit_rows[layout.tree_picks].tolist() == [0, *layout.tree_rows.tolist()]
    assert layout.logit_rows[layout.last_level_picks].tolist() == last
    # recycle_window: every row keeps its logits; the mask, positions and row roles do not change.
    every = step_layout(window, levels, parents, True)
    assert every.logit_rows.tolist() == list(range(layout.size))
    assert torch.equal(every.visible, layout.visible) and torch.equal(every.offsets, layout.offsets)
    assert every.logit_rows[every.tree_picks].tolist() == [0, *layout.tree_rows.tolist()]
    assert every.logit_rows[every.last_level_picks].tolist() == last


def test_reference_example_w4_n3_g2():
    """The 12x12 picture in docs/algorithm.md (W=4, N=3, G=2 linear branches), typed in by hand."""
    picture = """
    #...........
    ##..........
    ###.........
    ####........
    #...#.......
    ##...#......
    ###...#.....
    ####...#....
    #.......#...
    #.......##..
    #.........#.
    #.........##
    """
    expected = torch.tensor([[c == "#" for c in line.strip()] for line in picture.strip().splitlines()])
    layout = step_layout(4, 2, chains(2, 2))
    assert torch.equal(layout.visible, expected)
    assert layout.offsets.tolist() == [0, 1, 2, 3, 1, 2, 3, 4, 1, 2, 1, 2]


def test_docstring_tree_example():
    """The picture in layout.py's docstring: W=3, L=2 and the tree of (a, b), (a, c), (d,)."""
    a, b, c, d = 11, 12, 13, 14
    tree = build_tree([Draft((a, b), ("s", "s")), Draft((a, c), ("t", "t")), Draft((d,), ("s",))])
    assert tree.tokens == (a, b, c, d) and tree.parents == (-1, 0, 0, -1) and tree.tags[0] == ("s", "t")
    picture = layout_module.__doc__.split("sees (# = yes)")[1].split("Linear branches")[0]
    lines = [line.split() for line in picture.strip().splitlines()]
    layout = step_layout(3, 2, tree.parents)
    assert torch.equal(layout.visible, torch.tensor([[ch == "#" for ch in line[3]] for line in lines]))
    assert layout.offsets.tolist() == [0 if line[2] == "p" else int(line[2][2:]) for line in lines]


def trie_reference(paths):
    """Distinct prefixes of the paths, in first-seen order: the nodes a merged tree must have."""
    prefixes = []
    for path in paths:
        for k in range(1, len(path) + 1):
            if tuple(path[:k]) not in prefixes:
                prefixes.append(tuple(path[:k]))
    return prefixes


@pytest.mark.parametrize("seed", range(6))
def test_build_tree_feeds_each_prefix_once(seed):
    gen = torch.Generator().manual_seed(seed)
    paths = [tuple(torch.randint(0, 3, (int(torch.randint(1, 5, (1,), generator=gen)),), generator=gen).tolist())
             for _ in range(8)]
    drafts = [Draft(p, (f"src{j % 2}",) * len(p)) for j, p in enumerate(paths)]
    tree = build_tree(drafts)
    prefixes = [tuple(tree.tokens[n] for n in tree.path_to(i)) for i in range(len(tree))]
    assert prefixes == trie_reference(paths)                               # each prefix exactly once
    assert all(p < i for i, p in enumerate(tree.parents)) and tree.depths == tuple(map(len, prefixes))
    for i, prefix in enumerate(prefixes):                                   # tags: every proposer, in order
        proposers = [f"src{j % 2}" for j, p in enumerate(paths) if tuple(p[:len(prefix)]) == prefix]
        assert tree.tags[i] == tuple(dict.fromkeys(proposers))
    linear = build_tree(drafts, merge=False)
    assert linear.tokens == tuple(t for p in paths for t in p)
    assert linear.parents == tuple(-1 if k == 0 else sum(map(len, paths[:j])) + k - 1
                                   for j, p in enumerate(paths) for k in range(len(p)))


def test_chains_are_unmerged_drafts():
    drafts = [Draft((1, 2, 3), ("a",) * 3), Draft((1, 2, 4), ("a",) * 3)]
    assert build_tree(drafts, merge=False).parents == chains(2, 3)
    assert build_tree(drafts).parents == (-1, 0, 1, 1)


def test_prune_tree_keeps_the_best_nodes_and_their_ancestors():
    tree = build_tree([Draft((1, 2, 3), ("a",) * 3), Draft((1, 5), ("b",) * 2), Draft((7,), ("c",))])
    # nodes: 0:1  1:2  2:3  3:5  4:7
    scores = [0.9, 0.5, 0.4, 0.6, 0.3]
    kept = prune_tree(tree, scores, 3)
    assert kept.tokens == (1, 2, 5) and kept.parents == (-1, 0, 0)
    assert prune_tree(tree, scores, 10) is tree and len(prune_tree(tree, scores, 0)) == 0
    with pytest.raises(ValueError, match="must not increase"):
        prune_tree(tree, [0.1, 0.9, 0.9, 0.9, 0.0], 2)


def test_no_drafts_verifies_from_the_input_row():
    layout = step_layout(0, 0, ())
    assert layout.size == 1 and layout.logit_rows.tolist() == [0] and layout.tree_picks.tolist() == [0]


def test_a_parent_must_come_before_its_child():
    with pytest.raises(ValueError, match="before it"):
        step_layout(0, 0, (1, -1))


def test_attention_mask_cache_columns_and_sliding_window():
    layout = step_layout(3, 2, chains(1, 2))
    past, position = 10, 10
    full = attention_mask(layout.offsets, layout.visible, past, position, sliding_window=None, dtype=torch.float32)
    assert full.shape == (1, 1, layout.size, past + layout.size)
    assert (full[0, 0, :, :past] == 0).all()
    assert torch.equal(full[0, 0, :, past:] == 0, layout.visible)

    window = 4
    slid = attention_mask(layout.offsets, layout.visible, past, position, sliding_window=window, dtype=torch.float32)
    q_pos = position + layout.offsets
    k_pos = torch.cat([torch.arange(past), q_pos])
    allowed = slid[0, 0] == 0
    for i, j in itertools.product(range(layout.size), range(past + layout.size)):
        base = True if j < past else bool(layout.visible[i, j - past])
        assert allowed[i, j] == (base and int(q_pos[i] - k_pos[j]) < window)
    assert slid.min() == torch.finfo(torch.float32).min


def test_causal_layout_is_lower_triangular():
    offsets, visible = causal_layout(4)
    assert offsets.tolist() == [0, 1, 2, 3]
    assert visible.tolist() == [[j <= i for j in range(4)] for i in range(4)]


@pytest.mark.parametrize("window,levels,parents,causal", [
    (0, 0, (), True),              # greedy: the input token alone
    (0, 0, chains(1, 2), True),    # pool-only, one candidate: a chain
    (0, 0, chains(2, 2), False),   # two candidates branch
    (0, 0, (-1, 0, 0), False),     # a tree branches
    (4, 2, (), False),             # a window branches
    (4, 2, chains(1, 2), False),
])
def test_causal_flag_marks_plain_chains_only(window, levels, parents, causal):
    layout = step_layout(window, levels, parents)
    assert layout.causal is causal
    if causal:
        offsets, visible = causal_layout(layout.size)
        assert torch.equal(layout.offsets, offsets) and torch.equal(layout.visible, visible)

"""The tree walk on hand-made trees and logits: greedy follows the argmax, sampling keeps p."""

import torch

from lookahead_core.config import SamplingConfig
from lookahead_core.layout import EMPTY_TREE, Draft, build_tree
from lookahead_core.verify import make_verifier, verify_greedy, walk_tree

V = 10


def logits_with_argmax(argmax):
    """One row per tree row (input token first) whose argmax is the given token."""
    out = torch.zeros(len(argmax), V)
    for row, token in enumerate(argmax):
        out[row, token] = 5.0
    return out


def test_greedy_follows_the_argmax_down_the_tree():
    tree = build_tree([Draft((1, 2, 3), ("a",) * 3), Draft((1, 4), ("b",) * 2), Draft((5,), ("c",))])
    # nodes 0:1  1:2  2:3  3:4  4:5; the model wants 1, then 4, then 7 after 4
    logits = logits_with_argmax([1, 4, 9, 9, 7, 9])
    verdict = verify_greedy(tree, logits)
    assert verdict.tokens == [1, 4, 7] and verdict.path == [0, 3] and verdict.matched == 2
    # nothing matches: the model's own token only
    assert verify_greedy(tree, logits_with_argmax([6, 0, 0, 0, 0, 0])).tokens == [6]
    assert verify_greedy(EMPTY_TREE, logits_with_argmax([3])).tokens == [3]


def test_unmerged_duplicates_keep_the_longest_candidate():
    """Linear branches (1, 2) and (1, 2, 3): both alive after 1 2, the second one goes further."""
    tree = build_tree([Draft((1, 2, 8), ("a",) * 3), Draft((1, 2, 3), ("a",) * 3)], merge=False)
    # nodes 0:1 1:2 2:8 | 3:1 4:2 5:3; argmax after the input 1, after node 0 -> 2, node 1 -> 3,
    # node 4 -> 3 (the duplicate's row), node 5 -> 6
    logits = logits_with_argmax([1, 2, 3, 0, 2, 3, 6])
    verdict = verify_greedy(tree, logits)
    assert verdict.tokens == [1, 2, 3, 6] and verdict.path == [3, 4, 5]


def test_sampling_keeps_the_distribution_of_each_choice():
    """Point-mass drafts {0, 1} under p: the token taken is distributed as p and accepted when it is
    a draft (20k draws, each row drawn once: the walk reads the draws)."""
    p = torch.tensor([0.5, 0.2, 0.2, 0.1])
    verify = make_verifier(SamplingConfig(temperature=1.0, seed=0))
    tree = build_tree([Draft((1,), ("a",)), Draft((0,), ("b",))])
    logits = torch.log(p)[None].expand(20000, 4)
    counts = torch.zeros(4)
    accepted = 0
    for chosen in verify.choose(logits).tolist():
        verdict = verify(tree, logits[:1], chosen=[chosen, 9, 9])
        counts[verdict.tokens[0]] += 1
        accepted += verdict.matched
        assert verdict.matched == (chosen in (0, 1)) and verdict.tokens[0] == chosen
    assert torch.allclose(counts / counts.sum(), p, atol=0.012)
    assert abs(accepted / 20000 - 0.7) < 0.015          # p(1) + p(0)


def test_walk_tree_with_a_custom_pick_records_the_path():
    tree = build_tree([Draft((1, 2), ("a",) * 2), Draft((3,), ("b",))])
    seen = []

    def pick(row, options):
        seen.append((row, list(options)))
        return (options[0], True) if options else (9, False)

    verdict = walk_tree(tree, pick)
    assert verdict.tokens == [1, 2, 9] and verdict.path == [0, 1]
    assert seen == [(0, [1, 3]), (1, [2]), (2, [])]

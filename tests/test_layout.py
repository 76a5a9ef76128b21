"""The fused step's mask and positions against a cell-by-cell reference of REFERENCE.md's rules."""

import itertools

import pytest
import torch

from lookahead_core.layout import attention_mask, causal_layout, step_layout


def reference_rows(window, levels, candidates, cand_len):
    """Rows as REFERENCE.md lists them: ('in',), ('win', level, col), ('cand', j, k)."""
    rows = [("win", 0, 0)]
    rows += [("win", lvl, col) for lvl in range(levels) for col in range(window) if (lvl, col) != (0, 0)]
    rows += [("cand", j, k) for j in range(candidates) for k in range(cand_len)]
    return rows


def reference_position(row):
    kind, a, b = row
    return a + b if kind == "win" else 1 + b


def reference_sees(q, k):
    """REFERENCE.md: level l col i sees level-0 cols 0..i and its own column in levels 1..l;
    a candidate token sees the input token and its own earlier tokens; branches never meet."""
    if q[0] == "win" and k[0] == "win":
        _, lq, cq = q
        _, lk, ck = k
        return (lk == 0 and ck <= cq) or (1 <= lk <= lq and ck == cq)
    if q[0] == "cand":
        if k == ("win", 0, 0):
            return True
        return k[0] == "cand" and k[1] == q[1] and k[2] <= q[2]
    return False


GRID = list(itertools.product([1, 2, 4, 7], [0, 1, 2, 4], [0, 1, 3], [1, 2, 4]))


@pytest.mark.parametrize("window,levels,candidates,cand_len", GRID)
def test_layout_matches_cell_by_cell_reference(window, levels, candidates, cand_len):
    layout = step_layout(window, levels, candidates, cand_len)
    rows = reference_rows(window, levels, candidates, cand_len)
    assert layout.size == len(rows)
    assert layout.offsets.tolist() == [reference_position(r) for r in rows]
    expected = torch.tensor([[reference_sees(q, k) for k in rows] for q in rows])
    assert torch.equal(layout.visible, expected)
    # The step feeds 1 + (W-1) + (L-1)*W + c*(N-1) tokens, at most (N-1)*(W+G).
    expected_size = (1 + (window - 1) + (levels - 1) * window if levels else 1) + candidates * cand_len
    assert layout.size == expected_size
    last = [i for i, r in enumerate(rows) if levels and r[0] == "win" and r[1] == levels - 1]
    assert layout.last_level_rows.tolist() == last
    assert layout.candidate_rows.flatten().tolist() == [i for i, r in enumerate(rows) if r[0] == "cand"]


def test_reference_example_w4_n3_g2():
    """The 12x12 picture in REFERENCE.md (W=4, N=3, G=2), typed in by hand."""
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
    layout = step_layout(4, 2, 2, 2)
    assert torch.equal(layout.visible, expected)
    assert layout.offsets.tolist() == [0, 1, 2, 3, 1, 2, 3, 4, 1, 2, 1, 2]


def test_verify_logit_indices_point_at_predicting_rows():
    layout = step_layout(3, 2, 2, 2)
    rows = layout.logit_rows[layout.verify_logits]
    # Candidate token 0 is predicted by the input row; token k by the candidate's row k-1.
    assert rows.tolist() == [[0, *layout.candidate_rows[0].tolist()], [0, *layout.candidate_rows[1].tolist()]]
    assert layout.logit_rows[layout.last_level_logits].tolist() == layout.last_level_rows.tolist()


def test_no_candidates_verifies_from_the_input_row():
    layout = step_layout(0, 0, 0, 4)
    assert layout.size == 1 and layout.logit_rows.tolist() == [0] and layout.verify_logits.tolist() == [[0]]


def test_attention_mask_cache_columns_and_sliding_window():
    layout = step_layout(3, 2, 1, 2)
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


@pytest.mark.parametrize("window,levels,candidates,cand_len,causal", [
    (0, 0, 0, 0, True),     # greedy: the input token alone
    (0, 0, 1, 2, True),     # pool-only, one candidate: a chain
    (0, 0, 2, 2, False),    # two candidates branch
    (4, 2, 0, 0, False),    # a window branches
    (4, 2, 1, 2, False),
])
def test_causal_flag_marks_plain_chains_only(window, levels, candidates, cand_len, causal):
    layout = step_layout(window, levels, candidates, cand_len)
    assert layout.causal is causal
    if causal:
        offsets, visible = causal_layout(layout.size)
        assert torch.equal(layout.offsets, offsets) and torch.equal(layout.visible, visible)

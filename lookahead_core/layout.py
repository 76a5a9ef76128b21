"""Where each token of one fused lookahead step sits: rows, position offsets and the attention pattern.

A step feeds, in this order (REFERENCE.md, "One step"):

    [input token] [level 0: W-1 tokens] [level 1: W] ... [level L-1: W] [cand 0: N-1] ... [cand c-1: N-1]

The input token is column 0 of level 0. ``L`` is the number of filled window levels (N-1 once
warmed up, fewer during warm-up, 0 when there is no window), ``c`` the number of candidates.

Rules, with p the position of the input token:
- level l, column i sits at p + l + i; candidate token k sits at p + 1 + k;
- level l, column i sees level-0 columns 0..i and its own column in levels 1..l;
- candidate token k sees the input token and its own candidate's tokens 0..k;
- the branches never see each other; every row also sees the whole committed KV cache.

Everything here is a pure function of sizes, so it is cached and tested cell by cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class StepLayout:
    """Index bookkeeping for one fused forward. Tensors live on the CPU and are never mutated."""

    window: int          # W (0 when there is no lookahead branch)
    levels: int          # filled window levels L
    candidates: int      # c
    candidate_len: int   # N-1
    offsets: torch.Tensor        # (q,) position of each row relative to the input token
    visible: torch.Tensor        # (q, q) bool, row may attend to column
    last_level_rows: torch.Tensor  # (W,) rows whose argmax extends the window ((0,) if none)
    candidate_rows: torch.Tensor   # (c, N-1) row of each candidate token
    logit_rows: torch.Tensor       # (r,) sorted rows whose logits the step needs
    last_level_logits: torch.Tensor  # (W,) index into logit_rows of each last-level row
    verify_logits: torch.Tensor    # (max(c, 1), N) index into logit_rows of the logits that
                                   # predict candidate token k (k < N-1) and the bonus token (k = N-1);
                                   # with no candidates, (1, 1): the input token's row
    causal: bool = False           # rows form a plain causal chain (greedy, one candidate, no window)

    @property
    def size(self) -> int:
        return int(self.offsets.numel())

    @property
    def window_rows(self) -> int:
        """Rows of the input token plus the window (the candidates start here)."""
        return self.size - self.candidates * self.candidate_len


def _row_coordinates(window: int, levels: int, candidates: int, candidate_len: int):
    """Per-row (level, column, candidate, token) coordinates; -1 where not applicable."""
    level, column, cand, tok = [0], [0], [-1], [-1]  # the input token: level 0, column 0
    for lvl in range(levels):
        for col in range(1 if lvl == 0 else 0, window):
            level.append(lvl), column.append(col), cand.append(-1), tok.append(-1)
    for j in range(candidates):
        for k in range(candidate_len):
            level.append(-1), column.append(-1), cand.append(j), tok.append(k)
    return (torch.tensor(level), torch.tensor(column), torch.tensor(cand), torch.tensor(tok))


@lru_cache(maxsize=256)
def step_layout(window: int, levels: int, candidates: int, candidate_len: int) -> StepLayout:
    """Build the layout of one step. ``window=0, levels=0`` gives the input token plus candidates."""
    if levels and window < 1:
        raise ValueError(f"a window of {levels} levels needs window >= 1, got {window}")
    level, column, cand, tok = _row_coordinates(window, levels, candidates, candidate_len)
    in_window = level >= 0
    is_input = (level == 0) & (column == 0)

    offsets = torch.where(in_window, level + column, 1 + tok)

    # Window rows: (l, i) sees level-0 columns <= i and column i of levels 1..l.
    lq, cq = level[:, None], column[:, None]
    lk, ck = level[None, :], column[None, :]
    sees_level0 = (lk == 0) & (ck <= cq)
    sees_own_column = (lk >= 1) & (ck == cq) & (lk <= lq)
    window_visible = in_window[:, None] & in_window[None, :] & (sees_level0 | sees_own_column)

    # Candidate rows: (j, k) sees the input token and (j, k') for k' <= k.
    is_cand = cand >= 0
    own_prefix = (cand[:, None] == cand[None, :]) & (tok[None, :] <= tok[:, None])
    cand_visible = is_cand[:, None] & (is_input[None, :] | (is_cand[None, :] & own_prefix))

    visible = window_visible | cand_visible
    # With levels == 0 the input token is still row 0 and sees itself.
    visible[0, 0] = True

    q = offsets.numel()
    if levels == 0:
        last_level_rows = torch.zeros(0, dtype=torch.long)
    else:
        last = levels - 1
        last_level_rows = torch.nonzero(level == last).flatten() if last > 0 else torch.arange(window)
    candidate_rows = torch.arange(q - candidates * candidate_len, q).view(candidates, candidate_len)
    if candidates:
        predicting_rows = torch.cat([torch.zeros(candidates, 1, dtype=torch.long), candidate_rows], dim=1)
    else:
        predicting_rows = torch.zeros(1, 1, dtype=torch.long)
    logit_rows = torch.unique(torch.cat([predicting_rows.flatten(), last_level_rows]))  # sorted
    return StepLayout(
        window, levels, candidates, candidate_len, offsets, visible, last_level_rows, candidate_rows,
        logit_rows=logit_rows,
        last_level_logits=torch.searchsorted(logit_rows, last_level_rows),
        verify_logits=torch.searchsorted(logit_rows, predicting_rows),
        causal=bool(torch.equal(offsets, torch.arange(q)) and torch.equal(visible, visible.new_ones(q, q).tril())),
    )


def causal_layout(length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(offsets, visible) of a plain causal chain, as fed by a prefill."""
    return torch.arange(length), torch.ones(length, length, dtype=torch.bool).tril()


def attention_mask(
    offsets: torch.Tensor,
    visible: torch.Tensor,
    past_len: int,
    position: int,
    *,
    sliding_window: int | None,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """Float additive mask (1, 1, q, past_len + q): 0 where a row may attend, dtype-min elsewhere.

    The committed cache holds positions 0..past_len-1 (one KV row per position). A sliding-window
    layer additionally hides every key whose position is ``sliding_window`` or more behind the query,
    the same rule transformers applies (``kv_idx > q_idx - sliding_window``).

    Built on ``device``: only the (q,) offsets and the (q, q) pattern are copied there, never the
    (q, past_len + q) mask, which grows with the context.
    """
    q = offsets.numel()
    blocked = torch.finfo(dtype).min
    mask = torch.zeros(q, past_len + q, dtype=dtype, device=device)
    mask[:, past_len:].masked_fill_(~visible.to(device), blocked)
    if sliding_window is not None:
        query_pos = position + offsets.to(device)                                          # (q,)
        key_pos = torch.cat([torch.arange(past_len, device=device), query_pos])            # (past + q,)
        mask.masked_fill_((query_pos[:, None] - key_pos[None, :]) >= sliding_window, blocked)
    return mask[None, None]



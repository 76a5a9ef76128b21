"""flex_attention masks for a step: one ``BlockMask`` per attention type, from the step's index tensors.

A ``BlockMask`` tells flex_attention, per block of 128 query rows, which 128-slot key blocks are
fully visible (computed without a mask), partly visible (the ``mask_mod`` decides per cell) or
hidden (skipped). Both come from the layout: the tables from block bounds (:func:`block_tables`),
the ``mask_mod`` is :func:`lookahead_core.layout.allowed`, the rule the dense mask is built from,
so the two paths cannot drift. Nothing of size rows x context is built; the committed context is
whole blocks that need no mask.

The ``mask_mod`` reads everything that changes from step to step from tensors, so that one
compiled kernel serves every step: the offsets and pattern from buffers of a fixed capacity (rows
and sequences rounded up to a power of two, at least 256 rows), marked static for the compiler;
whether the step is a causal chain (the prefill, greedy steps), and the layer's sliding window
(full attention: a window longer than any context), from 0-d tensors. The compiled flex kernel on
the CPU (torch 2.13) fails to build (inductor ``CppCompileError``, "``cur_kvSplitSize0`` was not
declared") when a mask reads a captured tensor whose size is dynamic; transformers' own
sliding-window mask hits this in ``generate``. Fixed-size buffers keep every captured size
static while the query and key lengths stay dynamic. A run then compiles a handful of kernels
(one-token steps, wider steps, prefills of more than two query blocks; each once static and once
dynamic), not one per step size; a new capacity adds one.
"""

from __future__ import annotations

import torch
from torch.nn.attention.flex_attention import BlockMask

from .layout import allowed

BLOCK = 128


def block_tables(past: int, valid: torch.Tensor, query_pos: torch.Tensor, sliding_window: int | None,
                 block: int = BLOCK, min_query_blocks: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """(full, partial), each (B, query blocks, key blocks) bool, for a step of ``query_pos`` (B, q)
    rows after a cache of ``past`` slots whose first ``valid[b]`` hold sequence b's committed KV.

    Full: every row of the query block sees every slot of the key block (committed slots inside
    the sliding window of the block's latest row). Hidden: no row sees any slot (uncommitted
    slots, or committed ones behind the window of the block's earliest row). Partial: the rest,
    among them every block holding the step's own rows. ``min_query_blocks``: at least that many
    query blocks (those past the last row are never visited).
    """
    batch, q = query_pos.shape
    total = past + q
    query_blocks, key_blocks = max(-(-q // block), min_query_blocks), -(-total // block)
    pad = query_blocks * block - q
    padded = torch.cat([query_pos, query_pos[:, -1:].expand(batch, pad)], dim=1).view(batch, query_blocks, block)
    first, latest = padded.amin(-1)[..., None], padded.amax(-1)[..., None]          # (B, nq, 1)
    lo = torch.arange(key_blocks, device=query_pos.device) * block
    hi = (lo + block).clamp(max=total) - 1
    committed = valid.clamp(max=past)[:, None, None]
    full = hi < committed
    hidden = (lo >= committed) & (hi < past)
    if sliding_window is not None:
        full = full & (latest - lo < sliding_window)
        hidden = hidden | ((hi < past) & (first - hi >= sliding_window))
    shape = (batch, query_blocks, key_blocks)
    return full.expand(shape), (~(full | hidden)).expand(shape)


def _indices(selected: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block counts (B, 1, nq) and indices (B, 1, nq, nkv), selected blocks first, as BlockMask wants;
    their block dimensions marked dynamic up front (they change with every context length)."""
    count = selected.sum(-1, dtype=torch.int32)[:, None]
    order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True).to(torch.int32)[:, None]
    torch._dynamo.maybe_mark_dynamic(count, 2)
    torch._dynamo.maybe_mark_dynamic(order, 2)
    torch._dynamo.maybe_mark_dynamic(order, 3)
    return count, order


NO_WINDOW = 1 << 62      # full attention, as a window: longer than any context
FALLBACK_WARNING = "without torch.compile"   # what torch says once it runs flex uncompiled


def rearm_fallback_warning() -> None:
    """torch warns once per process when flex_attention runs uncompiled (past the recompile limit);
    re-arm that warning so that a benchmark or test can tell whether its own forwards fell back."""
    from torch.nn.attention import flex_attention as module

    getattr(module, "_WARNINGS_SHOWN", set()).discard("flex_attention_performance")


class FlexMasks:
    """Builds each step's block masks on ``device``; owns the tensors their ``mask_mod`` reads."""

    # The tensors are made outside inference mode (decode runs inside it), so that they can be
    # rewritten in place in either mode.

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.capacity = (0, 0)            # (sequences, rows)
        with torch.inference_mode(False):
            self._past = torch.zeros((), dtype=torch.long, device=device)
            self._chain = torch.zeros((), dtype=torch.bool, device=device)
        self._windows: dict[int | None, torch.Tensor] = {}

    def _buffers(self, batch: int, rows: int) -> None:
        cap_b = max(self.capacity[0], 1 << (batch - 1).bit_length())
        cap_q = max(self.capacity[1], 2 * BLOCK, 1 << (rows - 1).bit_length())
        if (cap_b, cap_q) == self.capacity:
            return
        self.capacity = (cap_b, cap_q)
        device = self.device
        with torch.inference_mode(False):
            self._position = torch.zeros(cap_b, dtype=torch.long, device=device)
            self._offsets = torch.zeros(cap_b, cap_q, dtype=torch.long, device=device)
            self._visible = torch.zeros(cap_b, cap_q, cap_q, dtype=torch.bool, device=device)
        for buffer in (self._position, self._offsets, self._visible):
            torch._dynamo.mark_static(buffer)

    def _window(self, window: int | None) -> torch.Tensor:
        if window not in self._windows:
            with torch.inference_mode(False):
                self._windows[window] = torch.tensor(NO_WINDOW if window is None else window, device=self.device)
        return self._windows[window]

    def masks(self, windows: dict[str, int | None], past: int, position: torch.Tensor,
              offsets: torch.Tensor | None, visible: torch.Tensor | None, rows: int) -> dict[str, BlockMask]:
        """Attention type -> ``BlockMask`` for ``rows`` rows per sequence after a cache of ``past`` slots.

        ``position`` (B,): each sequence's first position, which is also its committed KV length
        (its step starts right after its own KV); ``offsets`` (B, q) and ``visible`` (B, q, q) as
        for :func:`~lookahead_core.layout.allowed` (None: every sequence feeds a causal chain).
        """
        batch = len(position)
        chain = visible is None
        self._buffers(batch, 1 if chain else rows)
        device = self.device
        self._past.fill_(past)
        self._chain.fill_(chain)
        self._position[:batch].copy_(position)
        if chain:
            query_pos = position.to(device)[:, None] + torch.arange(rows, device=device)
        else:
            self._offsets[:batch, :rows].copy_(offsets)
            self._visible[:batch, :rows, :rows].copy_(visible)
            query_pos = position.to(device)[:, None] + offsets.to(device)
        committed = position.to(device)
        tables = {}
        for kind, window in windows.items():
            # Never one query block: a size-1 dimension would be specialised (one more compile).
            full, partial = block_tables(past, committed, query_pos, window, min_query_blocks=2)
            tables[kind] = self._block_mask(full, partial, self._window(window), rows, past + rows)
        return tables

    def _block_mask(self, full: torch.Tensor, partial: torch.Tensor, window: torch.Tensor, rows: int,
                    total: int) -> BlockMask:
        past, position, offsets, visible, chain = self._past, self._position, self._offsets, self._visible, self._chain

        def mask_mod(b, h, q_idx, kv_idx):
            return allowed(b, q_idx, kv_idx, past=past, valid=position, position=position, offsets=offsets,
                           visible=visible, sliding_window=window, chain=chain)

        partial_count, partial_index = _indices(partial)
        full_count, full_index = _indices(full)
        return BlockMask.from_kv_blocks(partial_count, partial_index, full_count, full_index, BLOCK_SIZE=BLOCK,
                                        mask_mod=mask_mod, seq_lengths=(rows, total), compute_q_blocks=False)

"""Position limits: a lookahead step never feeds a row past the model's last position.

A step's window and candidate rows sit ahead of its input token (layout.py): at p + N - 1 for
candidates, up to p + N + W - 3 for the window. Models with learned absolute positions (GPT-2,
OPT, ...) crash or read garbage there, so near the end of the context the window is left out of
the step and the draft tree is cut to the depth that fits; the input token itself is fed wherever ``generate``
would feed it, so the output equals ``generate``'s to the last token.
"""

from __future__ import annotations

from dataclasses import dataclass

# Config fields that hold the number of positions a model has, in the order they are looked up.
LIMIT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx",
                "max_seq_len")


def position_limit(config) -> int | None:
    """The number of positions the model has (positions 0..limit-1), or None if its config names none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in LIMIT_FIELDS:
        value = getattr(text, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class StepFit:
    """What of a step fits below the limit: whether the window goes in, and the deepest tree node
    (None: no cap)."""

    with_window: bool
    max_depth: int | None


def fit_step(limit: int | None, position: int, width: int, levels: int) -> StepFit:
    """Fit a step whose input token sits at ``position`` below ``limit``.

    The window (``levels`` filled levels of ``width`` columns; level l, column i at position + l + i)
    goes in only if its last row fits; a tree node of depth d sits at position + d, so the tree keeps
    the depths below the limit (position + d < limit), possibly none. With ``limit=None`` everything fits.
    """
    if limit is None:
        return StepFit(levels > 0, None)
    window_end = position + levels - 1 + width - 1 if levels else position
    return StepFit(levels > 0 and window_end < limit, max(0, limit - 1 - position))

"""What ``decode`` accepts as ``input_ids``: checked up front, so a bad input fails before any forward.

Accepted: a flat sequence of Python (or NumPy) ints, or an integer tensor / NumPy array of shape
(L,) or (1, L). Refused with a ``ValueError`` that names the problem: float and bool ids (which
``int()`` would silently truncate), nested or 3-D inputs, batches of more than one sequence, ids
outside ``[0, vocab_size)``, and empty inputs.
"""

from __future__ import annotations

import numbers

import numpy as np
import torch


def vocab_size(model: torch.nn.Module) -> int | None:
    """Rows of the input embedding (may exceed the tokenizer's vocabulary), else ``config.vocab_size``."""
    get = getattr(model, "get_input_embeddings", None)
    embeddings = get() if callable(get) else None
    rows = getattr(embeddings, "num_embeddings", None)
    if isinstance(rows, int):
        return rows
    config = getattr(model, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    size = getattr(text, "vocab_size", None)
    return size if isinstance(size, int) else None


def validate_input_ids(input_ids, vocab_size: int | None = None) -> list[int]:
    """``input_ids`` as a list of ints, or a ``ValueError`` naming what is wrong with it (ids are
    checked against ``vocab_size`` when it is given)."""
    if isinstance(input_ids, (torch.Tensor, np.ndarray)):
        tokens = _from_array(input_ids)
    elif isinstance(input_ids, (str, bytes)):
        raise ValueError("input_ids must be token ids, not text; encode it with the tokenizer first")
    else:
        try:
            values = list(input_ids)
        except TypeError:
            raise ValueError(f"input_ids must be a sequence of token ids, got {type(input_ids).__name__}") from None
        bad = next((v for v in values if not _is_integer(v)), None)
        if bad is not None:
            kind = "a nested sequence" if isinstance(bad, (list, tuple, torch.Tensor, np.ndarray)) else repr(bad)
            raise ValueError(f"input_ids must be a flat sequence of int token ids; found {kind} "
                             f"({type(bad).__name__}); pass one sequence, e.g. ids[0] of a batch of one")
        tokens = [int(v) for v in values]
    if not tokens:
        raise ValueError("input_ids is empty")
    check_vocabulary(tokens, vocab_size)
    return tokens


def check_vocabulary(tokens: list[int], vocab_size: int | None) -> None:
    """Every id in ``[0, vocab_size)`` (only >= 0 when the size is unknown), else a ``ValueError``."""
    low, high = min(tokens), max(tokens)
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        culprit = low if low < 0 else high
        raise ValueError(f"input_ids holds token id {culprit} at index {tokens.index(culprit)}, outside the "
                         f"model's vocabulary [0, {vocab_size})")


def _is_integer(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _from_array(array: torch.Tensor | np.ndarray) -> list[int]:
    if isinstance(array, torch.Tensor):
        integer = not array.dtype.is_floating_point and not array.dtype.is_complex and array.dtype != torch.bool
    else:
        integer = array.dtype.kind in "iu"
    if not integer:
        raise ValueError(f"input_ids must hold integer token ids, got dtype {array.dtype} "
                         "(float or bool ids would be silently truncated)")
    if array.ndim == 2:
        if array.shape[0] != 1:
            raise ValueError(f"batch size {array.shape[0]}: decode takes one sequence; use decode_batch for several")
        array = array[0]
    elif array.ndim != 1:
        raise ValueError(f"input_ids must have shape (L,) or (1, L), got {tuple(array.shape)}")
    return [int(t) for t in array.tolist()]

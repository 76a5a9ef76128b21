"""A stand-in tokenizer for the tiny random test models, which ship none.

It maps UTF-8 bytes to ids modulo the vocabulary, so that the whole harness (prompts, stop strings,
second turns, CSV text) runs end to end in tests without real weights. It has no chat template and
no special tokens: chat prompts fall back to the harness's plain-text rendering.
"""

from __future__ import annotations

_FIRST_PRINTABLE, _PRINTABLE = 32, 95   # ' ' .. '~': decoded text stays plain ASCII, CSV-safe


class ByteTokenizer:
    """Deterministic bytes -> ids (mod ``vocab_size``); decoding maps ids to printable ASCII."""

    chat_template = None
    eos_token_id = None

    def __init__(self, vocab_size: int) -> None:
        if vocab_size < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = vocab_size

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [byte % self.vocab_size for byte in text.encode("utf-8")]

    def decode(self, token_ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(_FIRST_PRINTABLE + token % _PRINTABLE) for token in token_ids)

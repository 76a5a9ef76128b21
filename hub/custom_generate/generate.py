"""Lookahead decoding for transformers' ``generate``: ``custom_generate=<this folder's parent>``.

transformers runs this file's ``generate`` in place of its own decoding loop. The decoder is the
``lookahead_core`` package (requirements.txt); :mod:`lookahead_core.generate` documents the options
and what is honoured and refused.
"""

from lookahead_core.generate import generate

__all__ = ["generate"]

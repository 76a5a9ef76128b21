"""Preset jobs built on the one harness: the token-tree benchmark, the batch benchmark, and the step profiler."""

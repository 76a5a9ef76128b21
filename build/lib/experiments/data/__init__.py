"""Benchmark data sets behind one adapter interface: items, prompts, category spreads, and the data root."""

"""Benchmark harness: dataset adapters, quality metrics and a sandbox for generated code."""

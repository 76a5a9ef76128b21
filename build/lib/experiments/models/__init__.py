"""Loading models for the harness: offline GGUF packages, Hugging Face checkpoints, tiny random models for tests."""

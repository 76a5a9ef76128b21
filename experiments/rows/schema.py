"""The row schema of every result file: one row per item, turn and decoder."""

from __future__ import annotations

# The row schema, in one place. A column added here is written by every job; fill it in
# ``make_row`` (what ran, how it went), ``compare_to_baseline`` or ``score`` (what came out).
# Files written with fewer columns are read back and rewritten with these (ResultStore).
COLUMN_GROUPS: dict[str, tuple[str, ...]] = {
    "what ran": (
        "experiment", "dataset", "item_id", "category", "turn", "model", "dtype", "device", "device_name",
        "attention", "linear", "decoder", "family", "baseline", "config", "settings", "W", "N", "G", "prompt_pool", "pool_only",
        "prompt_lookup", "assistant", "params", "temperature", "top_k", "top_p", "seed", "max_new_tokens",
        "threads", "repeats", "order", "batch_size", "batch", "batch_items", "lp_ranks", "load_avg", "torch", "transformers",
        "git_commit",
    ),
    "how it went": (
        "prompt_tokens", "prefill_tokens", "new_tokens", "batch_new_tokens", "forwards", "steps", "S", "accepted_hist",
        "step_tokens_mean", "step_tokens_hist", "step_log", "draft_acceptance", "draft_reliability",
        "warmup_s", "prefill_s", "decode_s", "wall_s", "tokens_per_s",
        "model_s", "overhead_frac", "comm_s", "draft_s",
    ),
    "what came out": ("matches_greedy", "first_diff", "diff_margin", "diff_verdict", "rouge1", "rouge2", "rougeL",
                      "passed", "sandbox", "text"),
}  # fmt: skip
COLUMNS: tuple[str, ...] = tuple(column for group in COLUMN_GROUPS.values() for column in group)

"""(a) Correctness: every decoder of ``CHECKS`` and ``BATCH_CHECKS`` against greedy on each family at
its real width, 2 layers, float32, under SDPA and flex_attention; a difference judged by
``lookahead_core.divergence``."""

from __future__ import annotations

import time
import warnings
from collections import Counter

import torch

from lookahead_core import CausalLM, DecodeLimits, decode, decode_batch, divergence, probe
from experiments.config.labels import config_label
from lookahead_core.flex import FALLBACK_WARNING, rearm_fallback_warning

from .record import Run
from .shapes import BATCH_CHECKS, CHECKS, DRAFTED, FAMILIES, Plan, admit, build, random_eagle, random_heads, random_prompts, to_flex, used_pool


def judge(lm: CausalLM, prompt: list[int], base: list[int], tokens: list[int]) -> tuple[str, float | None]:
    found = divergence(lm, prompt, base, tokens)
    return ("equal", None) if found is None else (found.verdict, found.margin)


def check_attention(run: Run, key: str, model, drafters: dict, plan: Plan, attention: str) -> None:
    """Every decoder of CHECKS and BATCH_CHECKS against greedy on ``model`` as it is loaded now
    (those of DRAFTED with ``drafters`` on it)."""
    started = time.perf_counter()
    lm = CausalLM(model)
    drafted = CausalLM(model, drafters=drafters)
    label = f"{key} {attention}"
    result = probe(lm)
    run.probes.append({"family": key, "attention": attention, "passed": result.passed, "max_diff": result.max_diff,
                       "tolerance": result.tolerance, "reasons": list(result.reasons)})
    if not result.passed:
        run.failures.append(f"{label}: the probe failed: {list(result.reasons)}")
    vocab = model.config.vocab_size
    prompts = random_prompts(vocab, plan.prompts, plan.prompt_length, seed=1)
    limits = DecodeLimits(max_new_tokens=plan.new_tokens)
    greedy = [decode(lm, p, None, limits) for p in prompts]
    base_steps = sum(g.stats.steps for g in greedy)
    rows = [{"family": key, "attention": attention, "decoder": "greedy", "config": "greedy", "sequences": len(prompts),
             "equal": None, "near_tie": None, "mismatch": None, "errors": 0, "steps": base_steps,
             "greedy_steps": base_steps, "max_margin": None}]

    def record(name: str, config, sequences: int, verdicts: Counter, margins: list, errors: list, steps: int,
               greedy_steps: int | None) -> None:
        rows.append({"family": key, "attention": attention, "decoder": name, "config": config_label(config),
                     "sequences": sequences, "equal": verdicts["equal"], "near_tie": verdicts["near_tie"],
                     "mismatch": verdicts["mismatch"], "errors": len(errors), "steps": steps,
                     "greedy_steps": greedy_steps, "max_margin": max(margins, default=None)})
        if errors:
            run.failures.append(f"{label} {name}: {errors[0]}")

    for name, config in CHECKS.items():
        verdicts, margins, steps, errors = Counter(), [], 0, []
        for prompt, base in zip(prompts, greedy):
            try:
                state = used_pool(config, prompt, base.tokens) if name == "pool_used" else None
                out = decode(drafted if name in DRAFTED else lm, prompt, config, limits, state=state)
                verdict, margin = judge(lm, prompt, base.tokens, out.tokens)
                steps += out.stats.steps
            except Exception as error:  # noqa: BLE001 - any failure is a finding, the run goes on
                verdict, margin = "error", None
                errors.append(f"{type(error).__name__}: {error}")
            verdicts[verdict] += 1
            if margin is not None:
                margins.append(margin)
        record(name, config, len(prompts), verdicts, margins, errors, steps, base_steps)
        if name == "pool_used" and not errors and steps >= base_steps:
            run.failures.append(f"{label} pool_used: {steps} steps, greedy {base_steps}: the pre-filled pool was not used")
    # decode_batch: ragged prompts, each sequence against its own greedy decode
    ragged = prompts + [prompts[0][: max(2, 2 * plan.prompt_length // 3)]]
    singles = [g.tokens for g in greedy] + [decode(lm, ragged[-1], None, limits).tokens]
    for name, config in BATCH_CHECKS.items():
        verdicts, margins, steps, errors = Counter(), [], 0, []
        try:
            outs = decode_batch(lm, ragged, config, limits)
            for prompt, base, out in zip(ragged, singles, outs):
                verdict, margin = judge(lm, prompt, base, out.tokens)
                verdicts[verdict] += 1
                steps = max(steps, out.stats.steps)
                if margin is not None:
                    margins.append(margin)
        except Exception as error:  # noqa: BLE001
            errors.append(f"{type(error).__name__}: {error}")
            verdicts["error"] += len(ragged)
        record(name, config, len(ragged), verdicts, margins, errors, steps, None)
    for row in rows:
        if row["mismatch"]:
            run.failures.append(f"{label} {row['decoder']}: {row['mismatch']} of {row['sequences']} outputs left "
                                f"greedy at a confident token (fp32 mismatch)")
        row["seconds"] = time.perf_counter() - started
    run.correctness += rows
    bad = [r["decoder"] for r in rows if r["mismatch"] or r["errors"]]
    pool = next(r for r in rows if r["decoder"] == "pool_used")
    run.say(f"(a) {label}: probe {'passed' if result.passed else 'FAILED'} (max diff {result.max_diff:.2g}); "
            + ("all equal or near-ties" if not bad else f"FAILED: {bad}")
            + f"; pool steps {pool['steps']} vs greedy {base_steps}; {time.perf_counter() - started:.1f} s")


def check_family(run: Run, key: str, attention: str, plan: Plan, device: torch.device, tiny: bool) -> None:
    """(a) for one family under one attention implementation: a model of its own, freed after."""
    model = build(FAMILIES[key], device, torch.float32, tiny=tiny, layers=plan.check_layers, window=plan.check_window)
    drafters = {"medusa": random_heads(model), "eagle": random_eagle(model)}
    if attention == "flex_attention":
        to_flex(model)
        admit(model)
    rearm_fallback_warning()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_attention(run, key, model, drafters, plan, attention)
    if any(FALLBACK_WARNING in str(w.message) for w in caught):
        run.notes.append(f"(a) {key} {attention}: flex_attention ran uncompiled (torch's fallback)")


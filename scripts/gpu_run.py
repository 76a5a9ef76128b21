"""The one GPU command: losslessness, step-time curves and host cost on random-weight models of the
mission's shapes, and a projection of the speedups, in at most 8 files.

    python3 scripts/gpu_run.py --out $OUT             # one GPU (H100 80 GB): at most --budget 450 s
    python3 scripts/gpu_run.py --tiny --out /tmp/gpu   # the same code on tiny shapes on the CPU (tests)

No weights travel: every model is built with random weights on the device, at the published shapes
of Llama-2-7B, Llama-3-8B (GQA, 8 KV heads, vocabulary 128256, rope theta 5e5), Mistral-7B (GQA,
sliding window 4096) and CodeLlama-7B (vocabulary 32016, rope theta 1e6). Imports: torch,
transformers, the standard library and ``lookahead_core`` only (not the harness: no hydra).

(a) correctness: each family at its real width, 2 layers, float32 (TF32 off), under SDPA and
    flex_attention: greedy, lookahead W5 N4 G5 with and without the prompt
    pool, pool-only N4 G4 with a pool the decoder keeps (capacity G, ``keep_pool``) pre-filled with
    the greedy text's n-grams (it must take fewer steps than greedy), token trees (pool-only, and
    lookahead with the pool), Medusa with random heads, an EAGLE-3 drafter with random weights
    (alone, and mixed with the suffix and recycle sources), and ``decode_batch`` of ragged prompts
    (greedy and lookahead): every output is compared with greedy and a difference judged by
    ``lookahead_core.divergence``. A mismatch (a departure at a confident token), a failed probe,
    an error, or a pool that does not cut steps fails the run (exit 1); near-ties are counted.
(b) timing: each mission model at full depth in float16: t(k) of ``CausalLM.forward`` for k = 1..256
    after KV 512 and 2048 (``cost.measure_latency``: wall clock, synchronized on the model's
    device) under SDPA and flex_attention (its compile in the first, untimed round); and the decode loop's cost per step outside the forward for greedy and for steps that
    accept drafts (pool pre-filled with the greedy continuation's n-grams): pool-only N4 G4, the
    paper's W15 N5 G15, auto's widest tree cut with this device's curve, and an EAGLE-3 drafter of the
    shape's width (random weights, every level grown: its forwards are host time here); with host<->device
    copies and synchronizations per step (the profiler's CUDA trace, and ``set_sync_debug_mode``).
(c) projection: the speedup each mission shape would get at the paper's config and at ``auto``,
    and at EAGLE's trees (alone, and mixed with the training-free sources), from S and tokens fed per
    step measured on the CPU with the real offline models and the drafters trained for them (the
    committed rows under results/) and this device's t(k) and host cost. A projection, labelled one.
(d) files, rewritten as each piece finishes (a kill keeps what was done): summary.md, run.json,
    log.txt, correctness.csv, latency.csv, host.csv, projection.csv. A hard budget (``--budget``,
    from the process start) skips what would not fit, with a note, and an alarm stops a piece that
    overruns. The order keeps what matters most: (a), then (b), under SDPA for every model; then
    flex_attention's (a) and (b) model by model, those whose kernels compile first (MHA, then GQA
    with a sliding window), those that reuse them last.
"""

from __future__ import annotations

import time

STARTED = time.monotonic()            # the budget counts from here, imports included

import argparse  # noqa: E402
import csv  # noqa: E402
import gc  # noqa: E402
import glob  # noqa: E402
import gzip  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, fields  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lookahead_core import (  # noqa: E402
    CausalLM, DecodeLimits, DecodeState, LookaheadConfig, NGramPool, decode, decode_batch, divergence, probe,
)
from lookahead_core import cost as cm  # noqa: E402
from lookahead_core.capability import UnsupportedAttentionError, attention_verdict  # noqa: E402
from experiments.config.labels import config_label  # noqa: E402
from lookahead_core.eagle import Eagle3Drafter, default_layer_ids, eagle3_config  # noqa: E402
from lookahead_core.flex import FALLBACK_WARNING, rearm_fallback_warning  # noqa: E402
from lookahead_core.medusa import for_model  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Shapes


@dataclass(frozen=True)
class Family:
    """A mission model's published shape (its Hugging Face config), and a tiny stand-in of the same
    structure (MHA or GQA, sliding window or not) for the CPU."""

    name: str
    config_class: str
    hidden_size: int
    intermediate_size: int
    heads: int
    kv_heads: int
    vocab_size: int
    rope_theta: float
    max_positions: int
    sliding_window: int | None = None
    layers: int = 32

    def config(self, *, tiny: bool, layers: int | None = None, window: int | None = None):
        dims = dict(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                    num_attention_heads=self.heads, num_key_value_heads=self.kv_heads, vocab_size=self.vocab_size)
        if tiny:
            dims = dict(hidden_size=64, intermediate_size=64 * self.intermediate_size // self.hidden_size,
                        num_attention_heads=4, num_key_value_heads=4 * self.kv_heads // self.heads,
                        vocab_size=96 + self.vocab_size // 1000 + self.vocab_size % 1000 // 16)
        extra = {}
        if self.sliding_window is not None:
            extra["sliding_window"] = window or self.sliding_window
        return getattr(transformers, self.config_class)(
            **dims, num_hidden_layers=layers or (2 if tiny else self.layers), max_position_embeddings=self.max_positions,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta}, rms_norm_eps=1e-5,
            bos_token_id=None, eos_token_id=None, pad_token_id=None, tie_word_embeddings=False, **extra)


FAMILIES: dict[str, Family] = {
    "llama2_7b": Family("Llama-2-7B", "LlamaConfig", 4096, 11008, 32, 32, 32000, 1e4, 4096),
    "llama3_8b": Family("Llama-3-8B", "LlamaConfig", 4096, 14336, 32, 8, 128256, 5e5, 8192),
    "mistral_7b": Family("Mistral-7B", "MistralConfig", 4096, 14336, 32, 8, 32000, 1e4, 32768, sliding_window=4096),
    "codellama_7b": Family("CodeLlama-7B", "LlamaConfig", 4096, 11008, 32, 32, 32016, 1e6, 16384),
}


@dataclass(frozen=True)
class Plan:
    """Sizes of one run: the GPU's, or the tiny CPU smoke test's."""

    check_layers: int           # (a) reduced depth
    check_window: int           # (a) a sliding window that binds within the prompt + new tokens
    prompts: int
    prompt_length: int
    new_tokens: int
    sizes: tuple[int, ...]      # (b) k of t(k)
    kv_lengths: tuple[int, ...]
    repeats: int
    extra_rounds: int
    host_tokens: int            # (b) tokens of each timed decode
    traffic_tokens: int         # (b) tokens of each decode whose copies and syncs are counted (profiled)
    # seconds a piece is expected to take, before one of its kind has run (then: the longest so far);
    # flex_attention's are "new" where its kernels compile (a dtype and attention structure not yet run)
    estimates: dict


GPU_PLAN = Plan(check_layers=2, check_window=64, prompts=2, prompt_length=128, new_tokens=48,
                sizes=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256),
                kv_lengths=(512, 2048), repeats=3, extra_rounds=2, host_tokens=48, traffic_tokens=16,
                estimates={"check_sdpa": 10, "check_flex_new": 60, "check_flex_reuse": 15, "time_sdpa": 35,
                           "time_flex_new": 60, "time_flex_reuse": 15})
TINY_PLAN = Plan(check_layers=2, check_window=16, prompts=2, prompt_length=24, new_tokens=16,
                 sizes=(1, 2, 4, 8, 16, 32, 64, 128), kv_lengths=(32, 128), repeats=1, extra_rounds=0, host_tokens=12,
                 traffic_tokens=8,
                 estimates={"check_sdpa": 2, "check_flex_new": 30, "check_flex_reuse": 2, "time_sdpa": 3,
                            "time_flex_new": 30, "time_flex_reuse": 2})

# (a): what is checked against greedy, per family and attention implementation.
LOOKAHEAD = LookaheadConfig(window=5, ngram=4, guess=5)
POOL = LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True)         # keep_pool: the state's pool is used
CHECKS: dict[str, LookaheadConfig] = {
    "lookahead": LOOKAHEAD,
    "lookahead_pool": LookaheadConfig(window=5, ngram=4, guess=5, prompt_pool=True),
    "pool_used": POOL,
    "tree": cm.tree_config(16),
    "lookahead_tree": LookaheadConfig(window=5, ngram=4, guess=5, prompt_pool=True, tree=True,
                                      sources={"suffix": 4, "recycle": 4}, depth=6,
                                      budget=LOOKAHEAD.max_tokens_per_step),
    "medusa": LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, depth=4, sources={"medusa": 15}),
    "eagle": LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, depth=6, sources={"eagle": 10}),
    "eagle_tree": LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True, prompt_pool=True, tree=True, depth=6,
                                  budget=12, sources={"suffix": 4, "recycle": 4, "eagle": 10}),
}
DRAFTED = ("medusa", "eagle", "eagle_tree")      # the checks whose model carries the random drafters
BATCH_CHECKS: dict[str, LookaheadConfig | None] = {"batch_greedy": None, "batch_lookahead_pool": CHECKS["lookahead_pool"]}
MEDUSA_HEADS = 4
EAGLE_DRAFT_VOCAB = 32000       # EAGLE-3's published drafters for Llama-3.1-8B draft over 32k tokens

# (b): the decode loop's host cost, on steps that accept drafts.
PAPER = LookaheadConfig(window=15, ngram=5, guess=15)
# flex_attention's pieces: MHA first, then GQA with a sliding window; the other two reuse their kernels.
FLEX_ORDER = ("llama2_7b", "mistral_7b", "llama3_8b", "codellama_7b")

# (c): where S comes from: (what, glob under the repository, which rows), rows of real models on the
# CPU. Which rows: decoder names; a draft source's name as a string (the core rows whose config drafts
# from it); None, every core decoder's rows (``--project GLOB`` adds ("rows", GLOB, None)).
SOURCES: tuple[tuple[str, str, tuple[str, ...] | str | None], ...] = (
    ("paper", "results/scaling/*/*/w16_n5+*.csv.gz", ("w16_n5", "w16_n5_pool")),
    ("auto", "results/auto_stream/*/*/*.csv.gz", ("auto",)),
    ("eagle", "results/eagle/*/*/*/*.csv.gz", "eagle"),
)

OUT_FILES = ("summary.md", "run.json", "log.txt", "correctness.csv", "latency.csv", "host.csv", "projection.csv")


class OutOfTime(BaseException):
    """The budget's alarm: not an ``Exception``, so that no ``except Exception`` swallows it."""


# ---------------------------------------------------------------------------------------------
# Small helpers


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s work, named: without a device torch.cuda.synchronize waits on the current one."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                             timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def markdown(rows: list[dict], columns: Sequence[str]) -> str:
    def cell(v):
        if v is None:
            return "-"
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def csv_text(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()} for r in rows)
    return buffer.getvalue()


def random_prompts(vocab: int, count: int, length: int, seed: int = 0) -> list[list[int]]:
    """Random prompts with a repeated motif, so that the prompt pool has something to find."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        motif = torch.randint(0, vocab, (8,), generator=gen).tolist()
        noise = torch.randint(0, vocab, (length,), generator=gen).tolist()
        out.append((motif + noise[: length // 2] + motif + noise[length // 2:])[:length])
    return out


def used_pool(config: LookaheadConfig, prompt: list[int], greedy: Sequence[int]) -> DecodeState:
    """A state whose pool the decoder keeps (capacity = G, the config's ``keep_pool``), holding every
    n-gram of the greedy continuation: steps accept up to N-1 drafts and commit several KV rows."""
    if not config.keep_pool:
        raise ValueError("the decoder keeps a state's pool only with keep_pool")
    pool = NGramPool(config.ngram, config.guess)
    pool.add_from_sequence(prompt[-1:] + list(greedy))
    return DecodeState.with_pool(pool)


# ---------------------------------------------------------------------------------------------
# The run's record: every file rewritten as pieces finish


class Run:
    def __init__(self, out: Path, budget: float | None) -> None:
        self.out = out
        self.budget = budget
        self.meta: dict = {}
        self.notes: list[str] = []          # skipped pieces and why
        self.failures: list[str] = []
        self.refusals: list[str] = []       # pieces whose attention backend is wrong on this host, with the cause
        self.correctness: list[dict] = []
        self.probes: list[dict] = []
        self.curves: list[dict] = []        # per curve: model, attention, kv, seconds, warnings
        self.latency: list[dict] = []       # per (curve, k)
        self.host: list[dict] = []
        self.projection: list[dict] = []
        self.sources: list[dict] = []
        self.pieces: list[dict] = []        # (section, model, attention) in run order, with status and seconds
        self.durations: dict[str, list[float]] = {}
        self.compiled: set[tuple] = set()   # flex_attention kernels compiled: (dtype, MHA or GQA)
        self.log_handle = open(out / "log.txt", "a", buffering=1)

    def sections(self) -> dict[str, str]:
        """Per section run: "done", or how many of its pieces were done."""
        out = {}
        for section, name in (("a", "correctness"), ("b", "timing")):
            mine = [p for p in self.pieces if p["section"] == section]
            done = sum(p["status"] == "done" for p in mine)
            refused = sum(p["status"] == "refused" for p in mine)
            if mine:
                out[name] = "done" if done == len(mine) else f"{done} of {len(mine)} pieces done" + \
                    (f", {refused} refused on this host" if refused else "")
        return out

    def elapsed(self) -> float:
        return time.monotonic() - STARTED

    def left(self) -> float:
        return float("inf") if self.budget is None else self.budget - self.elapsed()

    def estimate(self, kind: str, plan: Plan) -> float:
        """The last such piece's duration (the first of a kind carries one-time costs), else the plan's."""
        return (self.durations.get(kind) or [plan.estimates[kind]])[-1]

    def fits(self, kind: str, plan: Plan) -> bool:
        return self.left() >= self.estimate(kind, plan)

    def took(self, kind: str, seconds: float) -> None:
        self.durations.setdefault(kind, []).append(seconds)

    def say(self, message: str) -> None:
        line = f"[{time.strftime('%H:%M:%S')} +{self.elapsed():5.0f}s] {message}"
        print(line, flush=True)
        self.log_handle.write(line + "\n")

    def skip(self, what: str, why: str) -> None:
        self.notes.append(f"{what}: skipped ({why})")
        self.say(f"SKIPPED {what}: {why}")

    def save(self) -> None:
        out = self.out
        write_atomic(out / "run.json", json.dumps({
            "meta": self.meta, "elapsed_s": self.elapsed(), "sections": self.sections(), "pieces": self.pieces,
            "notes": self.notes, "refusals": self.refusals,
            "failures": self.failures, "probes": self.probes, "correctness": self.correctness,
            "curves": self.curves, "host": self.host, "sources": self.sources, "durations_s": self.durations,
        }, indent=1, default=str) + "\n")
        for name, rows in (("correctness.csv", self.correctness), ("latency.csv", self.latency),
                           ("host.csv", self.host), ("projection.csv", self.projection)):
            if rows:
                write_atomic(out / name, csv_text(rows))
        try:
            text = summary(self)
        except Exception as error:  # noqa: BLE001 - the tables are in the other files; never lose the run to them
            text = f"# GPU run\n\nsummary.md could not be written ({type(error).__name__}: {error}); see run.json.\n"
        write_atomic(out / "summary.md", text)


# ---------------------------------------------------------------------------------------------
# Models


def build(family: Family, device: torch.device, dtype: torch.dtype, *, tiny: bool, layers: int | None = None,
          window: int | None = None, seed: int = 0) -> torch.nn.Module:
    """Random weights of ``family``'s shape, allocated and initialised on ``device``."""
    config = family.config(tiny=tiny, layers=layers, window=window)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    model = model.eval()
    if next(model.parameters()).device != device:      # a transformers that ignored the device context
        model = model.to(device)
    return model


def flex_kernels(family: Family, dtype: torch.dtype) -> tuple:
    """What flex_attention compiles its kernels for (the sliding window is a tensor: no new kernel)."""
    return str(dtype), family.kv_heads == family.heads


def admit(model: torch.nn.Module) -> None:
    """Raise the core's :class:`UnsupportedAttentionError` where the model's attention backend computes
    wrong logits on this device (torch's compiled CPU flex on AVX2): a refusal, not a failure."""
    verdict = attention_verdict(model)
    if not verdict.passed:
        raise verdict.error()


def to_flex(model: torch.nn.Module) -> None:
    """The same weights under flex_attention (the core then builds block masks)."""
    model.set_attn_implementation("flex_attention")


def random_heads(model: torch.nn.Module, seed: int = 0):
    """Medusa heads for ``model`` with random residual blocks (sharing the base's LM head)."""
    heads = for_model(model, MEDUSA_HEADS)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for head in heads.heads:
            for block in head:
                if hasattr(block, "linear"):
                    weight = torch.randn(block.linear.weight.shape, generator=gen) * 0.02
                    block.linear.weight.copy_(weight.to(block.linear.weight))
    return heads


def random_eagle(model: torch.nn.Module, seed: int = 0) -> Eagle3Drafter:
    """An EAGLE-3 drafter for ``model`` (its width, its default fused layers, a draft vocabulary of
    at most ``EAGLE_DRAFT_VOCAB`` tokens), random weights, on the model's device and dtype."""
    vocab = model.config.vocab_size
    draft = list(range(EAGLE_DRAFT_VOCAB)) if vocab > EAGLE_DRAFT_VOCAB else None
    torch.manual_seed(seed)
    with torch.device(model.device):
        drafter = Eagle3Drafter(model, eagle3_config(model, None if draft is None else len(draft)),
                                default_layer_ids(model), vocab=draft)
    return drafter.to(model.dtype)


# ---------------------------------------------------------------------------------------------
# (a) correctness


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


# ---------------------------------------------------------------------------------------------
# (b) timing


class ForwardTimer:
    """Wall time inside ``lm.forward_batch``, the model's device synchronized before and after: the
    loop's time per step minus this is its host work (drafts, masks, verification, KV commit)."""

    def __init__(self, lm: CausalLM) -> None:
        self.calls: list[float] = []
        forward, device = lm.forward_batch, lm.device

        def timed(*args, **kwargs):
            synchronize(device)
            start = time.perf_counter()
            out = forward(*args, **kwargs)
            synchronize(device)
            self.calls.append(time.perf_counter() - start)
            return out

        lm.forward_batch = timed


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def traffic(names) -> Counter:
    """Host<->device copies and host synchronizations among profiler event names."""
    counts = Counter()
    for name in names:
        if name.startswith("Memcpy HtoD"):
            counts["h2d"] += 1
        elif name.startswith("Memcpy DtoH"):
            counts["d2h"] += 1
        elif name in SYNC_CALLS:
            counts["syncs"] += 1
    return counts


def profiled_traffic(run_once: Callable[[], object], device: torch.device) -> Counter:
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_once()
    return traffic(event.name for event in prof.events())


def sync_warnings(run_once: Callable[[], object]) -> int:
    """Synchronizing CUDA calls of ``run_once()`` as ``torch.cuda.set_sync_debug_mode`` reports them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run_once()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def traffic_per_step(decode_with: Callable[[DecodeLimits], object], tokens: int, device: torch.device) -> dict:
    """Copies and syncs per decoding step: a ``tokens``-token decode's minus a prefill-only decode's,
    over its steps (CUDA only; the profiler and the sync debug mode each count them their way)."""
    row = {"h2d_per_step": None, "d2h_per_step": None, "syncs_per_step": None, "sync_warnings_per_step": None}
    if device.type != "cuda":
        return row
    limits, prefill = DecodeLimits(max_new_tokens=tokens), DecodeLimits(max_new_tokens=1)
    outputs = []
    try:
        full = profiled_traffic(lambda: outputs.append(decode_with(limits)), device)
        base = profiled_traffic(lambda: decode_with(prefill), device)
        steps = max(outputs[0].stats.steps, 1)
        for kind in ("h2d", "d2h", "syncs"):
            row[f"{kind}_per_step"] = (full[kind] - base[kind]) / steps
    except Exception as error:  # noqa: BLE001 - a profiler that does not run leaves the columns empty
        row["traffic_error"] = f"profiler: {type(error).__name__}: {error}"
    try:
        outputs.clear()
        full = sync_warnings(lambda: outputs.append(decode_with(limits)))
        row["sync_warnings_per_step"] = (full - sync_warnings(lambda: decode_with(prefill))) / max(
            outputs[0].stats.steps, 1)
    except Exception as error:  # noqa: BLE001
        row["traffic_error"] = f"sync debug mode: {type(error).__name__}: {error}"
    return row


def host_costs(run: Run, key: str, model, curve: cm.CostModel, plan: Plan, kv_length: int, traffic: bool) -> None:
    """ms per step outside the forward, for greedy and for configs whose steps accept drafts, and for
    an EAGLE-3 drafter's tree (random weights: every level grown, its forwards counted apart too);
    with ``traffic``, their copies and syncs per step too (the same for every model of these 32 layers)."""
    device = model.device
    drafters = {"eagle": random_eagle(model)}                 # used only by the config that drafts with it
    plain, timed = CausalLM(model, drafters=drafters), CausalLM(model, drafters=drafters)
    timer = ForwardTimer(timed)
    prompt = torch.randint(0, model.config.vocab_size, (kv_length,), generator=torch.Generator().manual_seed(2)).tolist()
    limits = DecodeLimits(max_new_tokens=plan.host_tokens)
    greedy = decode(plain, prompt, None, limits).tokens
    auto = cm.widest_tree(curve)
    configs = {"greedy": None, "pool_N4G4 (prefilled)": POOL, "paper la_N5W15G15 (prefilled)": PAPER,
               f"auto {config_label(auto)} (prefilled, this device's cut)": auto,
               "eagle EAGLE-3 drafter, 10 nodes, 6 levels (random weights)": CHECKS["eagle"]}
    for name, config in configs.items():
        started = time.perf_counter()

        def decode_with(lim: DecodeLimits, lm: CausalLM = plain, config=config):
            state = used_pool(config, prompt, greedy) if config is not None and config.guess else None
            return decode(lm, prompt, config, lim, state=state)

        try:
            decode_with(DecodeLimits(max_new_tokens=4), timed)            # warm-up: the probe, the kernels
            timer.calls.clear()
            out = decode_with(limits, timed)
            stats = out.stats
            forward = sum(timer.calls[-stats.steps:]) if stats.steps else 0.0
            row = {"model": key, "attention": "sdpa", "kv_length": kv_length, "decoder": name,
                   "config": config_label(config), "steps": stats.steps,
                   "fed_per_step": statistics.fmean(stats.step_tokens) if stats.step_tokens else 0.0,
                   "accepted_per_step": stats.compression,
                   "ms_per_step": 1e3 * stats.decode_seconds / max(stats.steps, 1),
                   "forward_ms_per_step": 1e3 * forward / max(stats.steps, 1),
                   "host_ms_per_step": 1e3 * (stats.decode_seconds - forward) / max(stats.steps, 1),
                   "draft_ms_per_step": 1e3 * stats.draft_seconds / max(stats.steps, 1),
                   "matches_greedy": out.tokens == greedy[: len(out.tokens)]}
            if traffic and device.type == "cuda":
                row.update(traffic_per_step(decode_with, plan.traffic_tokens, device), traffic=True)
        except Exception as error:  # noqa: BLE001
            row = {"model": key, "attention": "sdpa", "kv_length": kv_length, "decoder": name,
                   "config": config_label(config), "error": f"{type(error).__name__}: {error}"}
        row["seconds"] = time.perf_counter() - started
        run.host.append(row)
        run.say(f"(b) {key} host: {name}: " + (row["error"] if "error" in row else
                f"{row['accepted_per_step']:.2f} accepted / {row['fed_per_step']:.1f} fed a step, "
                f"{row['host_ms_per_step']:.2f} ms host (of it {row['draft_ms_per_step']:.2f} ms drafter) + "
                f"{row['forward_ms_per_step']:.2f} ms forward"
                + (f", {row['syncs_per_step']:.1f} syncs, {row['h2d_per_step']:.1f} H2D a step"
                   if row.get("syncs_per_step") is not None else "")))
        run.save()


def curve_note(message: str) -> str:
    if FALLBACK_WARNING in message:
        return "flex_attention ran uncompiled (torch's fallback)"
    bent = re.search(r"for k = (\[[^\]]*\])", message)
    return f"bent at k = {bent.group(1)}" if bent else message.split("\n")[0][:100]


def curve(run: Run, key: str, lm: CausalLM, plan: Plan, kv_length: int) -> cm.CostModel:
    started = time.perf_counter()
    rearm_fallback_warning()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cost = cm.measure_latency(lm, plan.sizes, kv_length=kv_length, repeats=plan.repeats,
                                  extra_rounds=plan.extra_rounds)
    seconds = time.perf_counter() - started
    notes = sorted({curve_note(str(w.message)) for w in caught
                    if FALLBACK_WARNING in str(w.message) or "still bent" in str(w.message)})
    run.curves.append({"model": key, "attention": lm.attention, "kv_length": kv_length, "dtype": str(lm.dtype),
                       "seconds_to_measure": seconds, "warnings": notes,
                       "t1_ms": 1e3 * cost.latency(1), "t256_over_t1": cost.latency(plan.sizes[-1]) / cost.latency(1)})
    for row in cost.to_rows():
        run.latency.append({"model": key, "device": run.meta.get("device"), "dtype": str(lm.dtype).removeprefix("torch."),
                            **{k: v for k, v in row.items() if k not in ("host_seconds", "device")}})
    run.say(f"(b) {key} {lm.attention} KV {kv_length}: t(1) {1e3 * cost.latency(1):.2f} ms, "
            + ", ".join(f"t({k})/t(1) {cost.latency(k) / cost.latency(1):.2f}" for k in plan.sizes[1::4])
            + f" ({seconds:.0f} s{'; ' + '; '.join(notes) if notes else ''})")
    return cost


def time_sdpa(run: Run, key: str, plan: Plan, device: torch.device, tiny: bool, curves: dict, traffic: bool) -> None:
    """(b) for one model under SDPA: its curves at each KV length and the host cost of its steps."""
    started = time.perf_counter()
    model = build(FAMILIES[key], device, gpu_dtype(device), tiny=tiny)
    run.say(f"(b) {key}: built {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, "
            f"{str(model.dtype).removeprefix('torch.')}, in {time.perf_counter() - started:.0f} s")
    lm = CausalLM(model)
    for kv in plan.kv_lengths:
        curves[(key, "sdpa", kv)] = curve(run, key, lm, plan, kv)
        run.save()
    host_costs(run, key, model, curves[(key, "sdpa", plan.kv_lengths[0])], plan, plan.kv_lengths[0], traffic)


def time_flex(run: Run, key: str, plan: Plan, device: torch.device, tiny: bool, curves: dict) -> None:
    """(b) for one model under flex_attention: its curves (the kernels compile in the untimed first round)."""
    model = build(FAMILIES[key], device, gpu_dtype(device), tiny=tiny)
    to_flex(model)
    admit(model)
    lm = CausalLM(model)
    for kv in plan.kv_lengths:
        curves[(key, "flex_attention", kv)] = curve(run, key, lm, plan, kv)
        run.save()


def gpu_dtype(device: torch.device) -> torch.dtype:
    return torch.float32 if device.type == "cpu" else torch.float16


def pieces(keys: list[str], flex: list[str], sections: list[str]) -> list[tuple[str, str, str]]:
    """(section, model, attention) in the order they run: what matters most first. (a) and (b) under
    SDPA for every model; then flex_attention, alternating (a) and (b), models whose kernels are new
    (MHA, then GQA with a sliding window) before those that reuse them."""
    out = [("a", k, "sdpa") for k in keys if "correctness" in sections]
    out += [("b", k, "sdpa") for k in keys if "timing" in sections]
    order = sorted(flex, key=lambda k: (FLEX_ORDER.index(k) if k in FLEX_ORDER else len(FLEX_ORDER)))
    for key in order:
        out += [(section, key, "flex_attention") for section, name in (("a", "correctness"), ("b", "timing"))
                if name in sections]
    return out


def run_pieces(run: Run, plan: Plan, device: torch.device, tiny: bool, todo: list[tuple[str, str, str]],
               curves: dict) -> None:
    """Each piece if its estimate fits in what is left of the budget, else a note; a piece's error is
    a failure for (a) and a note for (b), and the run goes on."""
    for section, key, attention in todo:
        what = f"({section}) {key} {attention}"
        if attention == "sdpa":
            kind = "check_sdpa" if section == "a" else "time_sdpa"
        else:
            kernels = flex_kernels(FAMILIES[key], torch.float32 if section == "a" else gpu_dtype(device))
            kind = ("check_flex_" if section == "a" else "time_flex_") + ("reuse" if kernels in run.compiled else "new")
        if not run.fits(kind, plan):
            run.skip(what, f"{run.left():.0f} s left, it needs about {run.estimate(kind, plan):.0f} s")
            run.pieces.append({"piece": what, "section": section, "status": "skipped by the budget"})
            continue
        started = time.perf_counter()
        run.pieces.append({"piece": what, "section": section, "status": "running"})
        try:
            if section == "a":
                check_family(run, key, attention, plan, device, tiny)
            elif attention == "sdpa":
                time_sdpa(run, key, plan, device, tiny, curves, traffic=not any(r.get("traffic") for r in run.host))
            else:
                time_flex(run, key, plan, device, tiny, curves)
            if attention != "sdpa":
                run.compiled.add(kernels)
            run.pieces[-1]["status"] = "done"
        except UnsupportedAttentionError as error:     # the backend is wrong on this host: said, not failed
            run.pieces[-1]["status"] = "refused"
            run.refusals.append(f"{what}: {error}")
            run.say(f"REFUSED {what}: {error}")
        except Exception as error:  # noqa: BLE001 - one piece's failure leaves the others their time
            message = f"{what}: {type(error).__name__}: {error}"
            run.pieces[-1]["status"] = "error"
            (run.failures if section == "a" else run.notes).append(message)
            run.say(f"ERROR {message}")
        run.took(kind, time.perf_counter() - started)
        run.pieces[-1]["seconds"] = time.perf_counter() - started
        free(device)                     # the piece's model went with its frame
        if section == "b":
            project(run, curves, tiny)
        run.save()


# ---------------------------------------------------------------------------------------------
# (c) projection


def _config(row: dict) -> LookaheadConfig | None:
    params = row.get("params") or row.get("lookahead") or ""
    if not params or params == "null":
        return None
    known = {f.name for f in fields(LookaheadConfig)}
    try:
        return LookaheadConfig(**{k: v for k, v in json.loads(params).items() if k in known})
    except (ValueError, TypeError):
        return None


def read_sources(root: Path = ROOT, sources=SOURCES) -> list[dict]:
    """Per (what, file, decoder): S and the tokens fed per step of the committed CPU rows of real
    models (each row's per-step record, else its histogram of tokens fed)."""
    groups: dict[tuple, dict] = {}
    for what, pattern, decoders in sources:
        for path in sorted(glob.glob(str(root / pattern))):
            opened = gzip.open(path, "rt", newline="") if path.endswith(".gz") else open(path, newline="")
            with opened as handle:
                for row in csv.DictReader(handle):
                    config = _config(row)
                    if isinstance(decoders, tuple):
                        wanted = row.get("decoder") in decoders
                    else:                                                     # core rows (no greedy baseline)
                        wanted = row.get("family") == "core" and config is not None and \
                            (decoders is None or decoders in dict(config.sources))
                    if not wanted or not row.get("steps"):
                        continue
                    key = (what, path, row["decoder"])
                    if key not in groups:
                        groups[key] = {
                            "what": what, "file": os.path.relpath(path, root), "model": row.get("model", ""),
                            "dataset": row.get("dataset", ""), "decoder": row["decoder"], "dtype": row.get("dtype", ""),
                            "config": config, "rows": 0, "committed": 0, "steps": 0, "fed": Counter(),
                            "commits": set(), "equal": 0}
                    g = groups[key]
                    g["rows"] += 1
                    g["steps"] += int(row["steps"])
                    g["commits"].add(row.get("git_commit") or "unknown")
                    g["equal"] += row.get("matches_greedy") == "True"
                    log = json.loads(row["step_log"]) if row.get("step_log") else None
                    if log and "fed" in log:
                        g["fed"].update(log["fed"])
                        g["committed"] += sum(log.get("accepted") or []) or int(row["new_tokens"]) - 1
                    else:
                        hist = json.loads(row.get("step_tokens_hist") or "{}")
                        g["fed"].update({int(k): int(v) for k, v in hist.items()})
                        g["committed"] += int(row["new_tokens"]) - 1
    out = []
    for g in groups.values():
        g["S"] = g["committed"] / g["steps"] if g["steps"] else 1.0
        g["fed_per_step"] = sum(k * v for k, v in g["fed"].items()) / max(sum(g["fed"].values()), 1)
        g["commits"] = " ".join(sorted(g["commits"]))
        out.append(g)
    return out


def projected(source: dict, cost: cm.CostModel, host: float | None, host_greedy: float | None) -> float:
    """Summed time: committed tokens x a greedy step over the source's steps priced on ``cost``
    (each step's tokens fed, its logit rows), with the host time per step when given."""
    config = source["config"]
    h, h0 = (host or 0.0), (host_greedy or 0.0)
    steps = sum(count * (cost.latency(k, cm.logit_rows_for(config, k) if config else None) + h)
                for k, count in source["fed"].items())
    return source["committed"] * (cost.latency(1) + h0) / steps if steps else 1.0


def project(run: Run, curves: dict, tiny: bool) -> None:
    if not run.sources:
        return
    hosts = {}
    for row in run.host:
        if "error" not in row:
            kind = "greedy" if row["decoder"] == "greedy" else "paper" if "paper" in row["decoder"] else \
                "auto" if row["decoder"].startswith("auto") else "eagle" if row["decoder"].startswith("eagle") else None
            if kind:
                hosts[(row["model"], kind)] = row["host_ms_per_step"] / 1e3
    rows = []
    for source in run.sources:
        for (key, attention, kv), cost in curves.items():
            host, host0 = hosts.get((key, source["what"])), hosts.get((key, "greedy"))
            rows.append({
                "shape": f"{FAMILIES[key].name} shape" + (" (tiny)" if tiny else ""), "model_key": key,
                "attention": attention, "kv_length": kv, "config_from": source["what"], "decoder": source["decoder"],
                "S_from": f"{source['model']} {source['dataset']}", "S_file": source["file"],
                "S_commits": source["commits"], "S_rows": source["rows"], "S": source["S"],
                "fed_per_step": source["fed_per_step"], "fed_max": max(source["fed"], default=1),
                "extrapolated": max(source["fed"], default=1) > cost.tokens[-1],
                "projected_forward_only": projected(source, cost, None, None),
                "projected_with_host": projected(source, cost, host, host0) if host is not None and host0 is not None
                else None,
            })
    run.projection = rows


# ---------------------------------------------------------------------------------------------
# summary.md


PROJECTION_HEADING = "## (c) Projection, not a measurement"


def summary(run: Run) -> str:
    meta = run.meta
    tiny = meta.get("tiny")
    lines = [f"# GPU run: {meta.get('device')} ({'tiny shapes, a CPU smoke test' if tiny else 'random weights'})", "",
             f"torch {meta.get('torch')}, transformers {meta.get('transformers')}, commit {meta.get('commit')}, "
             f"started {meta.get('started')}; {run.elapsed():.0f} s so far"
             + (f" of a {run.budget:.0f} s budget" if run.budget else "") + ".", ""]
    planned = meta.get("checks_planned") or []
    ran = {f"{p['family']} {p['attention']}" for p in run.probes}
    refused = {p["piece"].removeprefix("(a) ") for p in run.pieces if p["status"] == "refused" and p["section"] == "a"}
    missing = sorted(set(planned) - ran - refused)
    verdict = "FAILED: " + "; ".join(run.failures) if run.failures else "no failure"
    lines += [f"**Correctness verdict: {verdict} ({len(ran & set(planned))} of {len(planned)} family x attention "
              f"checks ran{'; refused on this host: ' + ', '.join(sorted(refused)) if refused else ''}"
              f"{'; not run: ' + ', '.join(missing) if missing else ''}).**", ""]
    if run.refusals:
        lines += ["Refused on this host (the core refuses these before they decode; not failures):", ""] + \
            [f"- {n}" for n in run.refusals] + [""]
    if run.notes:
        lines += ["Skipped or degraded:", ""] + [f"- {n}" for n in run.notes] + [""]
    if run.pieces:
        lines += ["Pieces, in the order they ran (each section's under SDPA first, then flex_attention's):", "",
                  markdown(run.pieces, ["piece", "status", "seconds"]), ""]
    lines += ["## (a) Lossless in float32 (TF32 off), " + ("tiny shapes" if tiny else "2 layers, real widths"), "",
              "Every decoder's output against greedy on the same model and attention implementation: `equal` "
              "token-identical; `near_tie` left greedy where its top two logits were within float32's tolerance; "
              "`mismatch` left it at a confident token (a bug). `pool_used` decodes with a pool the decoder keeps "
              "(capacity G, keep_pool) holding the greedy text's n-grams: it must take fewer steps than greedy.", ""]
    if run.probes:
        lines += [markdown(run.probes, ["family", "attention", "passed", "max_diff", "tolerance"]), ""]
    if run.correctness:
        lines += [markdown(run.correctness, ["family", "attention", "decoder", "config", "sequences", "equal",
                                             "near_tie", "mismatch", "errors", "steps", "greedy_steps"]), ""]
    lines += ["## (b) Step time t(k), " + ("tiny shapes, float32" if tiny else "full depth, float16"), "",
              "`CausalLM.forward` of a causal chain of k tokens after a KV cache of `kv` tokens, wall clock with the "
              "model's device synchronized, fastest of the rounds (`cost.measure_latency`); every logit row kept.", ""]
    if run.curves:
        ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if any(r["tokens"] == k for r in run.latency)]
        table = []
        for c in run.curves:
            points = {r["tokens"]: r["seconds"] for r in run.latency
                      if (r["model"], r["attention"], r["kv_length"]) == (c["model"], c["attention"], c["kv_length"])}
            t1 = points.get(1)
            table.append({"model": c["model"], "attention": c["attention"], "kv": c["kv_length"],
                          "t(1) ms": 1e3 * t1 if t1 else None,
                          **{f"k={k}": points[k] / t1 for k in ks[1:] if k in points and t1},
                          "measured in s": c["seconds_to_measure"], "notes": "; ".join(c["warnings"]) or ""})
        lines += ["t(k)/t(1):", "", markdown(table, ["model", "attention", "kv", "t(1) ms", *[f"k={k}" for k in ks[1:]],
                                                     "measured in s", "notes"]), ""]
    if run.host:
        lines += ["Host cost per step (the loop's wall time minus `CausalLM.forward_batch`'s, synchronized), "
                  "SDPA, pools pre-filled with the greedy continuation's n-grams so that steps accept drafts; "
                  "copies and syncs per step from the profiler's CUDA trace (a decode's minus its prefill's) and "
                  "`torch.cuda.set_sync_debug_mode` warnings (empty on the CPU):", "",
                  markdown(run.host, ["model", "decoder", "fed_per_step", "accepted_per_step", "ms_per_step",
                                      "forward_ms_per_step", "host_ms_per_step", "draft_ms_per_step", "h2d_per_step", "d2h_per_step",
                                      "syncs_per_step", "sync_warnings_per_step", "matches_greedy"]), ""]
    lines += [PROJECTION_HEADING, ""]
    lines += [
        "Not a measurement: no mission model was run, and random weights accept nothing of their own. Speedup "
        "over greedy = committed tokens x (t(1) + greedy's host time) / the sum over the CPU run's steps of "
        "(t(tokens fed) + the config's host time), summed over the items as the harness sums decode time. "
        "Assumptions:", "",
        "- S and the tokens fed per step come from the CPU rows named in each row (SmolLM2-135M in float32, "
        "Qwen2.5-Coder-0.5B in bfloat16 (scaling) or float32 (auto_stream); file, commits, rows). A 7B model's S "
        "differs from a 135M model's: results/scaling/README.md quotes S = 1.96 for LLaMA-2-7B-chat on MT-Bench "
        "at W15 N5 G15 where SmolLM2 commits less per step. The paper's 7B config is W15 N5 G15; the scaling grid's "
        "nearest point is W16 N5 G16.",
        "- `auto`'s steps were cut against the CPU's curve (a few tokens a step); on this device auto would price "
        "its tree with the flatter curve above, feed more and commit at least as much a step. The projection keeps "
        "the CPU's steps, so it understates auto's S here.",
        "- `eagle`: S and tokens fed per step of the EAGLE-3 drafters trained here for the offline models "
        "(results/eagle: alone, and with the training-free tree); a 7B model's own EAGLE drafter accepts more "
        "(EAGLE-2 commits 4.34 tokens a step on Spec-Bench with Vicuna-7B). Their host time is the (b) row of a "
        "random drafter at the shape's width, which grows every level (trained ones stop early): an upper bound.",
        "- t(k): random-weight models of each mission model's shape at full depth in float16 on this device, batch "
        "1, the curve at the KV length in the column; host time: the (b) measurement for the nearest config "
        "(the paper's W15 N5 G15, auto's tree, the EAGLE tree) on that shape, greedy's for the baseline. Prefill "
        "excluded.", ""]
    if run.projection:
        sdpa = [r for r in run.projection if r["attention"] == "sdpa" and r["kv_length"] == min(
            x["kv_length"] for x in run.projection)]
        shapes = list(dict.fromkeys(r["shape"] for r in sdpa))
        table = {}
        for r in sdpa:
            t = table.setdefault((r["config_from"], r["decoder"], r["S_from"]), {
                "config": r["config_from"], "decoder": r["decoder"], "S from (CPU)": r["S_from"], "S": r["S"],
                "fed/step": r["fed_per_step"]})
            value = r["projected_with_host"] if r["projected_with_host"] is not None else r["projected_forward_only"]
            t[f"{r['shape']}, projected"] = value
        lines += [f"SDPA, KV {sdpa[0]['kv_length'] if sdpa else '-'}, with host time where measured (projection.csv "
                  "has every curve, forward-only and with host):", "",
                  markdown(list(table.values()), ["config", "decoder", "S from (CPU)", "S", "fed/step",
                                                   *[f"{s}, projected" for s in shapes]]), ""]
    else:
        lines += ["(no curve measured yet)", ""]
    lines += ["## What this run does not show", "",
              "- Any mission model's acceptance: the weights are random; S is the CPU's small models'.",
              "- Quality or the real models' numerics: float16 near-ties of a 7B model are not exercised.",
              "- Lookahead parallelism over several GPUs, batch sizes above 3, prefill time, and sampling.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the (at most 8) result files")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU: the smoke test")
    parser.add_argument("--device", default=None, help="default: cuda if available (cuda:N names one GPU)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds from the process start (default 450; tiny: none)")
    parser.add_argument("--models", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--project", nargs="*", default=[], metavar="GLOB",
                        help="more CPU rows to project (results CSVs, relative to the repository): every core "
                        "decoder in them, forward time only (no host time is measured for their configs)")
    parser.add_argument("--sections", nargs="*", default=["correctness", "timing"], choices=["correctness", "timing"])
    parser.add_argument("--flex-models", nargs="*", default=None, choices=list(FAMILIES),
                        help="the models checked and timed again under flex_attention (default: all of --models; "
                        "none: SDPA only)")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda" and not args.tiny:
        parser.error("no GPU here: pass --tiny for the CPU smoke test")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    plan = TINY_PLAN if args.tiny else GPU_PLAN
    flex_models = args.models if args.flex_models is None else [m for m in args.models if m in args.flex_models]
    budget = args.budget if args.budget is not None else (None if args.tiny else 450.0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        torch.set_num_threads(1)
    # float32 means float32: no TF32 in matmuls, convolutions or flex's Triton kernels
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    for name in ("recompile_limit", "cache_size_limit"):     # four shapes x two dtypes of flex kernels
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))

    run = Run(out, budget)
    run.meta = {"device": device_name(device), "device_index": str(device), "tiny": args.tiny,
                "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
                "python": platform.python_version(), "commit": git_commit(), "budget_s": budget,
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), "plan": {f.name: getattr(plan, f.name) for f in fields(plan)},
                "argv": list(argv) if argv is not None else sys.argv[1:],
                "checks_planned": [f"{k} sdpa" for k in args.models] + [f"{k} flex_attention" for k in flex_models]
                if "correctness" in args.sections else []}
    run.say(f"{run.meta['device']} ({device}), torch {torch.__version__}, transformers {transformers.__version__}, "
            f"budget {budget or 'none'} s, models {args.models}")
    run.sources = read_sources(ROOT, SOURCES + tuple(("rows", pattern, None) for pattern in args.project))
    run.say(f"(c) {len(run.sources)} groups of CPU rows to project from: "
            + ", ".join(sorted({f"{s['what']}:{s['decoder']}" for s in run.sources})))
    run.save()

    def alarm(signum, frame):
        raise OutOfTime()

    previous = None
    if budget is not None and hasattr(signal, "setitimer"):
        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, max(budget - run.elapsed(), 1.0))
    curves: dict = {}
    try:
        run_pieces(run, plan, device, args.tiny, pieces(args.models, flex_models, args.sections), curves)
    except OutOfTime:
        current = run.pieces[-1] if run.pieces and run.pieces[-1]["status"] == "running" else None
        if current is not None:
            current["status"] = "stopped by the budget"
        run.notes.append(f"the budget ({budget:.0f} s) ran out "
                         + (f"during {current['piece']}" if current else "between pieces") + ": what finished is kept")
    finally:
        if previous is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    project(run, curves, args.tiny)
    for leftover in out.glob("*.tmp"):          # a write the alarm interrupted
        leftover.unlink()
    run.meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    run.save()
    files = sorted(p.name for p in out.iterdir())
    run.say(f"done in {run.elapsed():.0f} s; {len(files)} files in {out}: {files}; "
            + ("FAILED: " + "; ".join(run.failures) if run.failures else "no failure"))
    run.save()
    run.log_handle.close()
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())

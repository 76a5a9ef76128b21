"""The capability probe: does this model compute a branching lookahead step right?

A lookahead step that branches (window rows, several candidates) relies on two things the model
must honour: the ``position_ids`` it is given (rows of different branches share positions), and
the custom 4-D mask (branches never see each other). Models that build ALiBi from key indices
(MPT) ignore the first; some (Bloom, Falcon with ``alibi=True``) crash on the second. Rather than
keep a list of model names, the first lookahead decode on a model runs one small branching step
(a window of 3 columns and 2 levels, and two candidates sharing their first token) and compares
every row's logits with plain sequential forwards of the same tokens (the path ``generate``
takes). Beyond the threshold, or on a crash inside the model, lookahead is refused with :class:`UnsupportedModelError`, which names the model type and
the reason, found by two further cases: a positions-only case (a gap in ``position_ids`` with the
model's own causal mask: the logits must change) and a mask case (an explicit causal mask must
give the model's own logits, and hiding one key must change the rows after it).

The threshold is the dtype's tolerance (``numerics.LOGIT_TOLERANCE``) or twice the noise the probe
measures on the model itself (the step's tokens as one causal chain of as many rows, and as 1-row
steps), whichever is larger: in fp32 the noise is ~1e-6 and the tolerance (1e-3) rules, which catches MPT's 0.1 error; in
bf16 a 135M model's own noise is ~0.7 already, so there the probe can only see errors above the
model's numerical noise (probe in fp32 for the strict check).

Configs whose every step is a causal chain pass no custom mask and no shared positions
(``layout.StepLayout.causal``): greedy, pool-only with one candidate, no candidates with a
one-column window or N=2. They never need the probe and are never refused. The result is cached
per model object (and dtype, device, attention implementation).

The attention backend is admitted too (:func:`attention_verdict`): a backend that runs compiled code
(flex_attention: torch compiles its kernel for the device at hand) must give, on the real model,
the logits SDPA (eager where the model has no SDPA path) gives on the steps a decode takes (a prefill, 1-row steps, branching steps, each
kernel's static and dynamic compile). torch's compiled CPU flex kernel returns NaN or wrong values
on some shapes on AVX2 CPUs (torch 2.13); such a backend is refused before anything decodes
(:class:`UnsupportedAttentionError`), naming the device, the cause and what does run right there.
"""

from __future__ import annotations

import math
import os
import platform
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import LookaheadConfig
from .numerics import logit_tolerance
from .layout import causal_layout, chains, step_layout
from .model_io import CausalLM, truncate_kv

# The probe step: W=3 columns, 2 filled levels (N=3), and a draft tree a -> (b, c) beside a linear
# branch a -> c (two candidates sharing their first token, merged and not).
_WINDOW, _LEVELS, _CONTEXT = 3, 2, 6
_TREE = (-1, 0, 0, -1, 3)
STILL_RUNS = ("the greedy or sampling baseline (lookahead=None) and lookahead configs whose every step is a "
              "causal chain (pool_only=True with a single draft per step: guess=1, sources={'suffix': 1} or "
              "sources={'recycle': 1} alone; or no drafts with window=1 or ngram=2)")


class UnsupportedModelError(ValueError):
    """Lookahead's branching steps would give this model wrong tokens; the message says why and what runs."""

    def __init__(self, model_type: str, reasons: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.model_type = model_type
        self.reasons = reasons


class UnsupportedAttentionError(UnsupportedModelError):
    """The model's attention backend computes wrong logits on this device (any decoder, greedy too);
    the message names the backend, the device, the cause and the backends that run right here."""


@dataclass(frozen=True)
class ProbeResult:
    """The probe's verdict on one model.

    max_diff: largest |logit| difference between the branching step and the plain forwards (inf
    when the model crashed); tolerance: the dtype's (``logit_tolerance``); noise: the largest |logit|
    difference between a k-row chain and the same tokens as 1-row steps; reasons: why it failed
    (empty when it passed).
    """

    model_type: str
    dtype: str
    max_diff: float
    tolerance: float
    noise: float = 0.0
    reasons: tuple[str, ...] = ()
    attention: AttentionVerdict | None = None      # set where the attention backend failed on this device

    @property
    def threshold(self) -> float:
        return threshold(self.tolerance, self.noise)

    @property
    def passed(self) -> bool:
        return not self.reasons

    def error(self) -> UnsupportedModelError:
        if self.attention is not None:
            return self.attention.error()
        message = (f"lookahead cannot run on this {self.model_type} model ({self.dtype}): "
                   f"{'; '.join(self.reasons)}. Its branching steps (a window, or several candidates) would "
                   f"give other tokens than greedy decoding. What still runs: {STILL_RUNS}.")
        return UnsupportedModelError(self.model_type, self.reasons, message)


def branching(lookahead: LookaheadConfig | None) -> bool:
    """Whether some step of this config may branch (needs the custom mask and shared positions).

    Judged on the widest step the config can feed: its full window beside one chain per draft it
    can propose (pool candidates, suffix matches, a recycled chain; a recycle source of 2 or more
    branches by itself).
    """
    if lookahead is None:
        return False
    window, levels = (0, 0) if lookahead.pool_only else (lookahead.window, lookahead.ngram - 1)
    recycle = lookahead.size("recycle")
    drafts = lookahead.guess + lookahead.size("suffix") + (1 if recycle else 0) + (recycle > 1)
    return not step_layout(window, levels, chains(drafts, 2)).causal


def require_support(lm: CausalLM, lookahead: LookaheadConfig | None) -> None:
    """Raise :class:`UnsupportedAttentionError` if the model's attention backend is wrong on this
    device (whatever the config), and :class:`UnsupportedModelError` if ``lookahead`` branches and
    the model fails the probe."""
    verdict = attention_verdict(lm)
    if not verdict.passed:
        raise verdict.error()
    if branching(lookahead):
        result = probe(lm)
        if not result.passed:
            raise result.error()


_RESULTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _own(model: torch.nn.Module | CausalLM) -> CausalLM:
    return model if isinstance(model, CausalLM) and not model.sharded else \
        CausalLM(model.model if isinstance(model, CausalLM) else model)     # the model, in this process alone


def _cached(lm: CausalLM, what: str, run, *more):
    key = (what, lm.dtype, str(lm.device), lm.attention, *more)
    results = _RESULTS.setdefault(lm.model, {})
    if key not in results:
        results[key] = run(lm)
    return results[key]


def probe(model: torch.nn.Module | CausalLM) -> ProbeResult:
    """The probe's result for ``model``, run once per model, dtype, device and attention implementation.
    A backend that :func:`attention_verdict` refuses fails the probe with that reason."""
    lm = _own(model)
    verdict = attention_verdict(lm)
    if not verdict.passed:
        return ProbeResult(_model_type(lm), str(lm.dtype), verdict.max_diff, verdict.threshold,
                           reasons=(verdict.cause,), attention=verdict)
    return _cached(lm, "probe", run_probe)


def _model_type(lm: CausalLM) -> str:
    return str(getattr(lm.model.config, "model_type", type(lm.model).__name__))


# ---------------------------------------------------------------------------------------------
# The attention backend on this device

COMPILED_ATTENTION = ("flex_attention",)     # backends that run code compiled for the device at hand
REFERENCE_ATTENTION = ("sdpa", "eager")      # the first the model supports (Gemma 2 has no SDPA path)


@dataclass(frozen=True)
class AttentionVerdict:
    """Whether ``attention`` gives the reference's logits on this device.

    max_diff: the largest |logit| difference from SDPA over the checked forwards (nan where the
    backend gave NaN); threshold: what passes (the dtype's tolerance, or twice SDPA's own chain-vs-steps
    noise); cause: what went wrong, on which forward (None when it passed); alternatives: what runs
    right on this device instead, each checked here.
    """

    attention: str
    device: str
    max_diff: float = 0.0
    threshold: float = 0.0
    cause: str | None = None
    alternatives: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.cause is None

    def error(self) -> UnsupportedAttentionError:
        ways = " or ".join(self.alternatives) if self.alternatives else "no other backend was found right here"
        message = (f"attention {self.attention!r} computes wrong logits on this device ({self.device}): "
                   f"{self.cause}. Use {ways}.")
        return UnsupportedAttentionError(self.attention, (self.cause,), message)


def device_name(device: str | torch.device) -> str:
    """What chip ``device`` is: the GPU's name (``torch.cuda.get_device_name``), else the CPU's model
    name (/proc/cpuinfo's "model name", else ``platform.processor()``). The one reader of it: the
    attention verdict, the harness's rows and results files (runs on an A100 and on an H100 never
    share one), auto's latency curves and the GPU command all name the chip with it."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    return name if device.type == "cpu" else f"{device.type} ({name})"


def attention_verdict(model: torch.nn.Module | CausalLM) -> AttentionVerdict:
    """The attention backend's verdict on this device, once per model, dtype, device and backend.
    Backends that compile nothing for the device (eager, SDPA) pass unchecked."""
    lm = _own(model)
    if lm.attention not in COMPILED_ATTENTION:
        return AttentionVerdict(lm.attention, str(lm.device))
    return _cached(lm, "attention", check_attention, compiling())


@torch.inference_mode()
def check_attention(lm: CausalLM) -> AttentionVerdict:
    """The decode's kinds of forward under ``lm``'s backend against the same forwards under SDPA on
    the same weights (uncached). On a failure, the backend run uncompiled is checked too, so that
    the refusal can say whether it is a way out here."""
    ids = _probe_tokens(lm, _ATTENTION_CONTEXT + _ATTENTION_STEPS + 16)
    with _attention(lm.model, REFERENCE_ATTENTION) as reference:
        expected = _attention_forwards(reference, ids)
        noise = _noise(reference, reference.new_cache(), 0, ids[:_CONTEXT + 16])
        name = reference.attention
    limit = threshold(logit_tolerance(lm.dtype), noise)
    max_diff, cause = _compare(lm, ids, expected, limit, name)
    # the device with what decides its compiled kernels: the chip and, on a CPU, its vector capability
    isa = f", {torch.backends.cpu.get_cpu_capability()}" if lm.device.type == "cpu" else ""
    where = f"{lm.device}, {device_name(lm.device)}{isa}, torch {torch.__version__}"
    if cause is None:
        return AttentionVerdict(lm.attention, where, max_diff, limit)
    alternatives = [f"attn_implementation={name!r} (the reference here)"]
    with uncompiled():
        if _compare(lm, ids, expected, limit, name)[1] is None:
            cause += "; run uncompiled it is right, so the kernel torch compiles for this device is at fault"
            alternatives.append(f"{lm.attention} uncompiled (TORCHDYNAMO_DISABLE=1 in the environment: right here, slow)")
    return AttentionVerdict(lm.attention, where, max_diff, limit, cause, tuple(alternatives))


def uncompiled():
    """Within it, torch.compile'd functions (transformers' flex_attention among them) run eagerly."""
    return torch.compiler.set_stance("force_eager") if hasattr(torch.compiler, "set_stance") else nullcontext()


def compiling() -> bool:
    """Whether torch.compile'd functions compile here: not under ``TORCHDYNAMO_DISABLE=1`` (torch.compile
    then returns the function as it is; ``TORCH_COMPILE_DISABLE=1`` breaks flex_attention, which
    compiles its own parts with ``fullgraph=True``) nor inside :func:`uncompiled`."""
    from torch._dynamo import eval_frame

    stance = getattr(getattr(eval_frame, "_stance", None), "stance", "default")
    return not (torch._dynamo.config.disable or os.environ.get("TORCHDYNAMO_DISABLE") == "1"
                or stance == "force_eager")


@contextmanager
def _attention(model: torch.nn.Module, choices: tuple[str, ...]):
    """``model`` under the first attention implementation of ``choices`` it supports (a ``CausalLM``
    of it), restored after."""
    before = model.config._attn_implementation
    for attention in choices:
        try:
            model.set_attn_implementation(attention)
            break
        except ValueError:               # transformers: this architecture has no such path
            if attention == choices[-1]:
                raise
    try:
        yield CausalLM(model)
    finally:
        model.set_attn_implementation(before)


# The checked decode: a prefill, then 1-row steps over a whole period of 16 key lengths (a
# compiled kernel's vector lanes: torch's CPU flex reads past the keys at some lengths, e.g. multiples
# of 8 on AVX2, and what it reads there changes from call to call), then branching steps.
# Three rounds of it: what such a kernel returns at a bad length changes from call to call.
_ATTENTION_CONTEXT, _ATTENTION_STEPS, _ATTENTION_ROUNDS = 24, 17, 3


def _attention_forwards(lm: CausalLM, ids: list[int]) -> list[tuple[str, torch.Tensor]]:
    """(what, logits) of the forwards a decode runs, each kind at two sizes at least (a compiled
    backend compiles a static kernel, then a dynamic one): a prefill, 1-row steps, branching steps."""
    context = ids[:_ATTENTION_CONTEXT]
    cache = lm.new_cache()
    out = []
    offsets, _ = causal_layout(len(context))
    out.append((f"a prefill of {len(context)} tokens",
                lm.forward(cache, context, offsets, None, 0, torch.arange(len(context)))))
    past = len(context)
    for token in ids[past:past + _ATTENTION_STEPS]:
        out.append((f"a 1-row step after {past} cached tokens",
                    lm.forward(cache, [token], torch.arange(1), None, past, torch.zeros(1, dtype=torch.long))))
        past += 1
    rest = ids[past:]
    for layout in (step_layout(_WINDOW, _LEVELS, _TREE), step_layout(0, 0, _TREE)):
        out.append((f"a branching step of {layout.size} rows after {past} cached tokens",
                    lm.forward(cache, rest[:layout.size], layout.offsets, layout.visible, past,
                               torch.arange(layout.size))))
        truncate_kv(cache, past)
    return out


def _compare(lm: CausalLM, ids: list[int], expected: list[tuple[str, torch.Tensor]],
             limit: float, reference: str) -> tuple[float, str | None]:
    """The largest difference from ``expected``, and the first forward that departs (None: none does)."""
    try:                          # rounds: a kernel that reads past its keys is wrong by chance
        got = [pair for _ in range(_ATTENTION_ROUNDS) for pair in _attention_forwards(lm, ids)]
    except (MemoryError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as error:  # noqa: BLE001 - a crash of the backend is a refusal
        return math.inf, f"it crashed ({_describe(error)})"
    worst, cause = 0.0, None
    for (what, want), (_, have) in zip(expected * _ATTENTION_ROUNDS, got):
        have, want = have.float(), want.float()
        if bool(have.isnan().any()) and not bool(want.isnan().any()):
            return math.nan, f"{what} gave NaN logits where {reference} does not"
        diff = float((have - want).abs().max())
        worst = max(worst, diff)
        if diff > limit and cause is None:
            cause = f"{what} gave logits {diff:.3g} away from {reference}'s (threshold {limit:.3g})"
    return worst, cause


@torch.inference_mode()
def run_probe(lm: CausalLM) -> ProbeResult:
    """Run the probe (uncached): the branching step, and on failure the cases that tell why."""
    tolerance = logit_tolerance(lm.dtype)
    ids = _probe_tokens(lm)
    model_type = _model_type(lm)
    crash, noise = None, 0.0
    try:
        max_diff, noise = _branching_diff(lm, ids)
    except (MemoryError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as error:  # noqa: BLE001 - any failure inside the model is a refusal
        max_diff, crash = math.inf, _describe(error)
    limit = threshold(tolerance, noise)
    if max_diff <= limit:
        return ProbeResult(model_type, str(lm.dtype), max_diff, tolerance, noise)
    reasons = [*_positions_reasons(lm, ids, tolerance), *_mask_reasons(lm, ids, tolerance)]
    if crash is not None:
        reasons.append(f"the model crashed on a branching step ({crash})")
    elif not reasons:
        reasons.append(f"its branching step's logits differ from plain forwards of the same tokens by "
                       f"{max_diff:.3g} (threshold {limit:.3g})")
    else:
        reasons.append(f"the branching step's logits differ from plain forwards by {max_diff:.3g} "
                       f"(threshold {limit:.3g})")
    return ProbeResult(model_type, str(lm.dtype), max_diff, tolerance, noise, tuple(reasons))


def threshold(tolerance: float, noise: float) -> float:
    """The largest branching-step difference that passes: the dtype's tolerance or twice the model's noise."""
    return max(tolerance, 2 * noise)


def _probe_tokens(lm: CausalLM, count: int = _CONTEXT + 16) -> list[int]:
    vocab = lm.vocab_size or int(lm.model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab, (count,), generator=generator).tolist()


def _describe(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200]}" if text else type(error).__name__


def _branching_diff(lm: CausalLM, ids: list[int]) -> tuple[float, float]:
    """Max |logit| difference between one fused branching step and plain forwards of each branch,
    and the model's own noise at that row count (``_noise``)."""
    context, rest = ids[:_CONTEXT], ids[_CONTEXT:]
    layout = step_layout(_WINDOW, _LEVELS, _TREE)
    window_len = layout.window_rows - 1
    a, b, c = rest[window_len + 1: window_len + 4]
    fed = rest[: window_len + 1] + [a, b, c, a, c]                  # input token, window, draft tree
    cache = lm.new_cache()
    offsets, _ = causal_layout(len(context))
    lm.forward(cache, context, offsets, None, 0, torch.tensor([len(context) - 1]))
    rows = torch.arange(layout.size)
    fused = lm.forward(cache, fed, layout.offsets, layout.visible, len(context), rows).float()
    truncate_kv(cache, len(context))

    # Each row sees a causal chain (its visible rows, in position order): feed the longest chains
    # plainly and read every row's logits off its chain's prefix.
    chains = []
    for row in range(layout.size):
        seen = layout.visible[row].nonzero().flatten()
        seen = seen[layout.offsets[seen].argsort()]
        assert torch.equal(layout.offsets[seen], torch.arange(len(seen))), "a probe row's view is not a chain"
        chains.append(tuple(fed[i] for i in seen.tolist()))
    reference: dict[tuple[int, ...], torch.Tensor] = {}
    for chain in sorted(set(chains), key=len, reverse=True):
        if chain in reference:
            continue
        offsets, _ = causal_layout(len(chain))
        logits = lm.forward(cache, list(chain), offsets, None, len(context), torch.arange(len(chain))).float()
        truncate_kv(cache, len(context))
        for k in range(len(chain)):
            reference.setdefault(chain[: k + 1], logits[k])
    expected = torch.stack([reference[chain] for chain in chains])
    return float((fused - expected).abs().max()), _noise(lm, cache, len(context), fed)


def _noise(lm: CausalLM, cache, past: int, tokens: list[int]) -> float:
    """Max |logit| difference between ``tokens`` fed as one causal chain (as many rows as the
    branching step, so the same kernels) and fed as 1-row steps."""
    offsets, _ = causal_layout(len(tokens))
    chain = lm.forward(cache, tokens, offsets, None, past, torch.arange(len(tokens))).float()
    truncate_kv(cache, past)
    steps = [lm.forward(cache, [token], torch.arange(1), None, past + k, torch.zeros(1, dtype=torch.long))
             for k, token in enumerate(tokens)]
    truncate_kv(cache, past)
    return float((chain - torch.cat(steps).float()).abs().max())


def _positions_reasons(lm: CausalLM, ids: list[int], tolerance: float) -> list[str]:
    """Positions-only case: the model's own causal mask, a gap of 3 before the last position."""
    chain = ids[:_CONTEXT]
    last = torch.tensor([len(chain) - 1])
    try:
        plain = lm.forward(lm.new_cache(), chain, torch.arange(len(chain)), None, 0, last).float()
        gapped = torch.arange(len(chain))
        gapped[-1] += 3
        moved = lm.forward(lm.new_cache(), chain, gapped, None, 0, last).float()
    except (MemoryError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as error:  # noqa: BLE001
        return [f"position_ids are not accepted ({_describe(error)})"]
    if float((plain - moved).abs().max()) <= tolerance:
        return ["positions are not taken from position_ids (moving a token's position id changes nothing; "
                "e.g. ALiBi built from key indices)"]
    return []


def _mask_reasons(lm: CausalLM, ids: list[int], tolerance: float) -> list[str]:
    """Mask case, positions = row indices: an explicit causal mask must give the model's own logits,
    and hiding one key from the rows after it must change them."""
    context, chunk = ids[:4], ids[4:8]
    cache = lm.new_cache()
    offsets, visible = causal_layout(len(chunk))
    rows = torch.arange(len(chunk))
    hidden = visible.clone()
    hidden[2:, 1] = False
    try:
        lm.forward(cache, context, torch.arange(len(context)), None, 0, torch.tensor([len(context) - 1]))
        outs = []
        for view in (None, visible, hidden):
            outs.append(lm.forward(cache, chunk, offsets, view, len(context), rows).float())
            truncate_kv(cache, len(context))
    except (MemoryError, torch.cuda.OutOfMemoryError):
        raise
    except Exception as error:  # noqa: BLE001
        return [f"a custom 4-D attention mask is not accepted ({_describe(error)})"]
    own, explicit, masked = outs
    reasons = []
    if float((own - explicit).abs().max()) > tolerance:
        reasons.append(f"a custom mask is not honoured (an explicit causal mask changes the logits by "
                       f"{float((own - explicit).abs().max()):.3g})")
    if float((masked[2:] - explicit[2:]).abs().max()) <= tolerance:
        reasons.append("a custom mask is not honoured (hiding a key from the rows after it changes nothing)")
    return reasons

"""The one harness: a model, a dataset subset, a baseline and any number of decoders, one CSV.

For every item (and every turn of multi-turn items) every decoder runs back to back, in an order
rotated by one per item so that none always sees the warmer caches, after an untimed warm-up of
each. Every call is timed the same way, whatever the decoder (this project's loop or transformers'
``generate``): forward hooks on the model count its forwards and time each one, so ``prefill_s`` is
the first forward, ``decode_s`` = wall clock - prefill, ``steps`` = forwards - 1 and
``overhead_frac`` = share of ``decode_s`` outside the model. Each conversation keeps its own
state, so turn 2 follows that decoder's own first answer (core decoders also reuse its KV cache).
With ``batch_size`` B > 1 the items go in batches of B consecutive items of the subset: each
decoder decodes a batch's prompts in one call (one forward per step for all), turn by turn, each
turn prefilled afresh; every row of a batch has the call's timings and records the batch's index,
items and size. One CSV row per item, turn and decoder is appended as soon as its batch finishes;
a rerun of the same command skips finished items (an unfinished batch is redone whole, writing the
rows it lacks). Aggregates are :mod:`experiments.reporting.report`'s, never computed here.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import transformers
from jinja2 import TemplateError
from omegaconf import DictConfig
from tqdm import tqdm

from lookahead_core import CausalLM, DecodeLimits, DecodeState, SamplingConfig, divergence
from lookahead_core import kernels
from lookahead_core.capability import attention_verdict, branching, device_name, probe
from lookahead_core.decoder import ForwardClock
from experiments.models import loader as model_loader

from experiments.reporting import report
from experiments.data.datasets import DatasetAdapter, Item, repo_root
from experiments.decoders.registry import Decoder, Generation
from experiments.grading.grade import score
from experiments.rows.store import ResultStore, sidecar
from experiments.data.datasets import PromptFormat
from experiments.data.templates import get_prompt_template
from experiments.config.schema import DEVICE_MAPS, LinearKernel
from experiments.config.settings import RunSettings, load_items, plan
from experiments.models.tiny_tokenizer import ByteTokenizer
from experiments.rows.provenance import git_commit

WARMUP_TOKENS = 16


def run(cfg: DictConfig, on_start: Callable[[Job], None] | None = None) -> Path:
    """Run the composed config; returns the CSV path. Fails on a bad config before loading anything."""
    settings, adapter, items = plan(cfg)
    return run_job(settings, adapter, items, on_start)


def run_job(settings: RunSettings, adapter: DatasetAdapter, items: list[Item],
            on_start: Callable[[Job], None] | None = None, config: Callable[[Path], str] | None = None) -> Path:
    """Decode and score what ``items`` still lack in the results file. ``on_start(job)`` is called
    once the model is loaded, before the warm-up, if anything is left to decode (a tool measures
    with the job's model there instead of loading its own). ``config(results path)`` gives the text
    of the config file kept beside the results (``<name>.yaml``, run.py's), written before decoding."""
    settings = placed(settings)
    lead = _join(settings)
    plan_keys = {item.item_id: expected_keys(adapter, item, settings) for item in items}
    store = ResultStore(settings.results_path(), plan_keys) if lead else None   # rank 0 alone writes rows
    if lead and config is not None:
        sidecar(store.path, ".yaml").write_text(config(store.path), encoding="utf-8")
    finished = store.finished if lead else set()
    # Batches are cut from the whole subset and their index (not the position in the to-do list)
    # sets the decoder order, so a resumed run measures each batch exactly as an uninterrupted one would.
    size = settings.batch_size
    batches = [items[start:start + size] for start in range(0, len(items), size)]
    todo = [index for index, batch in enumerate(batches) if any(item.item_id not in finished for item in batch)]
    todo = _agree(settings, todo, "the batches left to decode")
    label = f"{settings.experiment}/{settings.model.name}/{settings.config_tag}"
    if lead:
        print(f"{label}: {len(finished)} of {len(items)} items already in {store.path}"
              + (f" (batches of {size})" if size > 1 else "")
              + (f" (lookahead parallelism over {settings.ranks} ranks, {settings.backend})" if settings.ranks > 1 else ""))
    if todo:
        started = time.perf_counter()
        job = Job.start(settings, adapter, items)
        for decoder in settings.decoders:
            with job.kernel(decoder):
                decoder.prepare(job)
        if on_start is not None:
            on_start(job)
        job.warm_up(batches[todo[0]])
        progress = Progress(len(items) - len(finished), label, settings.baseline.name, disable=not lead)
        longest = 0.0
        try:
            for index in todo:
                over = bool(settings.time_budget) and time.perf_counter() - started + longest > settings.time_budget
                if _agree(settings, [int(over)], "the time budget's verdict")[0]:
                    if lead:
                        print(f"time budget of {settings.time_budget:g} s reached: rerun the command to resume")
                    break
                batch_start = time.perf_counter()
                rows = [row for row in run_batch(job, batches[index], index) if row["item_id"] not in finished]
                if lead:       # a batch's rows, whole, once every rank has finished it
                    store.append(rows)
                progress.update(rows)
                longest = max(longest, time.perf_counter() - batch_start)
        finally:
            progress.close()
            job.meter.close()
    if not lead:
        return settings.results_path()
    rows = report.load_results([store.path])
    print(report.job_summary(store.path, rows))
    check_lossless(rows, store.path)
    return store.path


def placed(settings: RunSettings) -> RunSettings:
    """The settings on their device (``auto`` refused or warned about when it falls back to the CPU,
    before the model loads; a bare ``cuda`` gets its index) and the chip it is, which names the
    results file."""
    mapped = settings.model.device_map          # a device_map naming one device is where the model is
    requested = mapped if mapped not in (None, *DEVICE_MAPS) else settings.device
    device = model_loader.job_device(requested, dtype=settings.model.dtype.value, spec=settings.model.spec)
    return replace(settings, device=str(device), device_name=device_name(device))


def _join(settings: RunSettings) -> bool:
    """Join the process group of a parallel job (torchrun's); whether this process writes the rows
    (rank 0, or the only process)."""
    if settings.ranks == 1:
        return True
    from lookahead_core import parallel

    parallel.init(settings.backend, settings.parallel_timeout_s)
    return parallel.rank() == 0


def _agree(settings: RunSettings, values: list[int], what: str) -> list[int]:
    """Rank 0's ``values`` on every rank of a parallel job (the same list otherwise), through the
    rendezvous store: the other ranks wait for rank 0 (its scoring and writing of the last batch's
    rows) up to ``parallel.WAIT_S``, not the collective timeout."""
    if settings.ranks == 1:
        return values
    from lookahead_core import parallel

    return parallel.agree(values, what)


class LosslessnessError(RuntimeError):
    """A fp32 greedy run departed from its baseline where the baseline was confident (a bug)."""


def check_lossless(rows, path: Path) -> None:
    """Raise :class:`LosslessnessError` naming the items whose fp32 rows have ``diff_verdict=mismatch``
    (called after every row is written, so the run exits non-zero with its results kept)."""
    bad = rows[(rows["dtype"] == "float32") & (rows["diff_verdict"] == "mismatch")]
    if len(bad):
        where = ", ".join(f"{r.item_id} turn {r.turn} ({r.decoder}, token {int(r.first_diff)}, margin "
                          f"{r.diff_margin:.3g})" for r in bad.itertuples())
        raise LosslessnessError(f"{len(bad)} fp32 rows of {path} depart from greedy at a confident token: {where}")


def expected_keys(adapter: DatasetAdapter, item: Item, settings: RunSettings) -> frozenset[tuple[str, str]]:
    """The (turn, decoder) rows that make an item complete; an item is redone as a unit."""
    return frozenset((str(turn), decoder.name) for turn in range(1, num_turns(adapter, item, settings) + 1)
                     for decoder in settings.decoders)


def num_turns(adapter: DatasetAdapter, item: Item, settings: RunSettings) -> int:
    if settings.prompt_format is PromptFormat.raw:
        return 1
    return min(adapter.num_turns(item), settings.dataset.turns or adapter.num_turns(item))


def calibration_items(adapter: DatasetAdapter, settings: RunSettings, items: Sequence[Item], want: int,
                      offset: int | None = None) -> list[Item]:
    """``want`` items not in ``items`` (for ``auto``): from ``offset`` if given, else the ones right
    after the evaluated range, else before it; only when the job covers the whole dataset its
    first items (in-sample), which it says."""
    if offset is not None:
        return load_items(settings, adapter, want, offset)
    dataset = settings.dataset
    after = load_items(settings, adapter, want, dataset.offset + len(items))
    before = load_items(settings, adapter, min(want, dataset.offset), max(0, dataset.offset - want)) \
        if dataset.offset else []
    chosen = (list(after) + list(before))[:want]
    if not chosen:
        print(f"auto: every item of {dataset.name} is evaluated; calibrating on the first {want} of them (in-sample)")
        chosen = list(items[:want])
    return chosen


# ---------------------------------------------------------------------------------------------
# Timing: forward hooks, the same for every decoder


class ForwardMeter:
    """Forward hooks on the model: how many forwards a call made and how long each took.

    Forwards that run fewer layers than the model has (transformers' early-exit drafts run the
    same module) are drafts, not verification steps: they are not counted as forwards.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.spans: list[list] = []
        self._clock = ForwardClock(model.device)     # CUDA events on a GPU: no synchronize per forward
        self._open: list | None = None
        self._config = model.config
        self._layers = getattr(model.config, "num_hidden_layers", None)
        self._handles = [model.register_forward_pre_hook(self._before), model.register_forward_hook(self._after)]

    def _before(self, module, args) -> None:
        self._open = self._clock.start()

    def _after(self, module, args, output) -> None:
        self._clock.stop(self._open)
        if getattr(self._config, "num_hidden_layers", None) == self._layers:
            self.spans.append(self._open)

    @property
    def durations(self) -> list[float]:
        """Seconds of each counted forward (read after the call is done: on a GPU, device time)."""
        return [self._clock.seconds([span]) for span in self.spans]

    def reset(self) -> None:
        self.spans = []

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class Timed:
    """One decoder's result on one prompt: the first repeat's output, each time the median over repeats."""

    output: Generation
    prompt_tokens: int
    wall_s: float
    prefill_s: float
    model_s: float              # the model's forwards after the prefill
    forwards: int
    steps: int | None = None    # this sequence's own steps when a batch shared the forwards
    batch_new_tokens: int | None = None   # every sequence's new tokens, when a batch shared the call

    @property
    def decode_s(self) -> float:
        return self.wall_s - self.prefill_s


# ---------------------------------------------------------------------------------------------
# The job: a loaded model, prompts, timed calls


@dataclass
class Job:
    """A loaded model with what every row repeats (versions, commit); decoders reach it in prepare/generate."""

    settings: RunSettings
    adapter: DatasetAdapter
    items: list[Item]
    model: Any
    tokenizer: Any
    lm: CausalLM
    meter: ForwardMeter
    pad_token_id: int
    constants: dict[str, Any]
    limits: DecodeLimits                  # the settings' limits with the tokenizer's EOS ids
    assistants: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    sharded: CausalLM | None = None       # lookahead parallelism: the model over the ranks (parallel.ShardedLM)

    def lm_for(self, decoder: Decoder) -> CausalLM:
        """The model a core decoder decodes with: split over the ranks when the job is parallel
        and the decoder has steps to split, else this process's own."""
        return self.sharded if self.sharded is not None and self.settings.shares(decoder) else self.lm

    @classmethod
    def start(cls, settings: RunSettings, adapter: DatasetAdapter, items: list[Item]) -> Job:
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)
        model, tokenizer = cls._load(settings, settings.model.spec)
        limits = replace(settings.limits, eos_token_ids=eos_token_ids(model, tokenizer, settings.model.extra_eos_token_ids))
        pad = pad_token_id(model, limits.eos_token_ids)
        spec = settings.model
        constants = {
            "experiment": settings.experiment, "dataset": settings.dataset.name, "model": spec.name,
            "dtype": spec.dtype.value, "device": settings.device, "device_name": settings.device_name,
            "attention": spec.attn_implementation.value,
            "linear": kernels.linear_kernel(model),
            "config": settings.config_tag,
            "settings": settings.fingerprint(), "top_k": settings.sampling.top_k, "top_p": settings.sampling.top_p,
            "seed": settings.seed, "max_new_tokens": settings.limits.max_new_tokens,
            "threads": torch.get_num_threads(), "repeats": settings.repeats, "torch": torch.__version__,
            "transformers": transformers.__version__, "git_commit": git_commit(repo_root()),
        }
        lm = CausalLM(model)
        verdict = attention_verdict(lm)     # the attention backend on this device, for every decoder
        if not verdict.passed:
            raise verdict.error()
        if any(d.kind == "auto" or branching(d.lookahead) for d in settings.decoders):
            probe(lm)      # the capability probe's forwards, once per model, before any call is timed
        sharded = None
        if settings.ranks > 1:
            from lookahead_core.parallel import ShardedLM

            sharded = ShardedLM(model)
            sharded.drafters = lm.drafters      # one dict: drafters a decoder's prepare() loads serve both
        return cls(settings, adapter, items, model, tokenizer, lm, ForwardMeter(model), pad, constants, limits, sharded=sharded)

    @staticmethod
    def _load(settings: RunSettings, spec: str) -> tuple[Any, Any]:
        model_config = settings.model
        model, tokenizer = model_loader.load_model(
            spec, dtype=model_config.dtype.value, device=settings.device,
            attn_implementation=model_config.attn_implementation.value, cache_dir=model_config.cache_dir,
            linear="stream" if model_config.linear is LinearKernel.both else model_config.linear.value,
            device_map=model_config.device_map if spec == model_config.spec else None,   # not a draft model's
        )
        if tokenizer is None:  # tiny random test models ship none
            tokenizer = ByteTokenizer(model.config.vocab_size)
        return model, tokenizer

    def load_assistant(self, spec: str) -> tuple[Any, Any]:
        """A draft model (and its tokenizer, None for tiny models), loaded once per job."""
        if spec not in self.assistants:
            model, tokenizer = self._load(self.settings, spec)
            self.assistants[spec] = (model, None if isinstance(tokenizer, ByteTokenizer) else tokenizer)
        return self.assistants[spec]

    def kernel(self, decoder: Decoder) -> AbstractContextManager[None]:
        """The linear layers of the model and its draft models on ``decoder``'s kernel
        (``model.linear=both``), else as loaded."""
        stack = ExitStack()
        if decoder.linear:
            for model in (self.model, *(model for model, _ in self.assistants.values())):
                stack.enter_context(kernels.running(model, decoder.linear))
        return stack

    def calibration_items(self, want: int, offset: int | None = None) -> list[Item]:
        return calibration_items(self.adapter, self.settings, self.items, want, offset)

    def auto_record_path(self, name: str = "auto") -> Path:
        return sidecar(self.settings.results_path(), f".{name}.json")

    def prompt_ids(self, item: Item, turn_index: int, answers: Sequence[str]) -> list[int]:
        return prompt_ids(self.adapter, self.tokenizer, self.settings.prompt_format, item, turn_index, answers,
                          template=self.settings.model.prompt_template)

    def sampling(self, item: Item) -> SamplingConfig:
        """The job's sampling settings, at the item's own temperature with ``item_temperature``."""
        sampling = self.settings.sampling
        if self.settings.item_temperature and "temperature" in item.extra:
            sampling = replace(sampling, temperature=float(item.extra["temperature"]))
        return sampling

    def timed(self, decoder: Decoder, prompts: list[list[int]], states: list[Any] | None = None,
              limits: DecodeLimits | None = None, sampling: SamplingConfig | None = None) -> list[Timed]:
        """One call of ``decoder`` on the prompts, timed by the forward hooks: ``generate`` for a job
        of batch size 1 (continuing ``states``), else ``generate_batch``, whose call time and
        forwards every sequence's :class:`Timed` shares."""
        limits, sampling = limits or self.limits, sampling or self.settings.sampling
        with self.kernel(decoder):        # the swap itself is not timed
            self.meter.reset()
            _sync(self.model)
            start = time.perf_counter()
            if self.settings.batch_size == 1:
                outputs = [decoder.generate(self, prompts[0], (states or [None])[0], limits, sampling)]
            else:
                outputs = decoder.generate_batch(self, prompts, limits, sampling)
            _sync(self.model)
            wall = time.perf_counter() - start
        durations = self.meter.durations
        shared = (wall, durations[0] if durations else 0.0, sum(durations[1:]), len(durations))
        if self.settings.batch_size == 1:
            return [Timed(outputs[0], len(prompts[0]), *shared)]
        total = sum(len(output.tokens) for output in outputs)
        # A sequence's steps: the core counts its own; generate commits one token per forward.
        return [Timed(output, len(ids), *shared,
                      steps=output.stats.steps if output.stats is not None else max(len(output.tokens) - 1, 0),
                      batch_new_tokens=total) for output, ids in zip(outputs, prompts, strict=True)]

    def warm_up(self, batch: Sequence[Item]) -> None:
        """Untimed short decodes of each decoder on the first turns of a batch (batch size 1: one
        item), so the first timed batch pays no one-off costs. Under flex_attention at least one
        pass runs, since it compiles the kernels; its time is reported once (``warmup_s`` on every
        row of this job), never in an item's timing."""
        prompts = [self.prompt_ids(item, 0, ()) for item in batch]
        limits = replace(self.limits, max_new_tokens=min(WARMUP_TOKENS, self.limits.max_new_tokens), stop_strings=())
        flex = self.lm.attention == "flex_attention"
        started = time.perf_counter()
        for _ in range(max(self.settings.warmup, int(flex))):
            for decoder in self.settings.decoders:
                self.timed(decoder, prompts, None, limits, self.sampling(batch[0]))
        self.constants["warmup_s"] = round(time.perf_counter() - started, 3)
        if flex:
            print(f"warm-up {self.constants['warmup_s']:.1f} s, flex_attention's compile included (once per process)")

    def text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


def prompt_ids(adapter: DatasetAdapter, tokenizer: Any, prompt_format: PromptFormat, item: Item, turn_index: int,
               answers: Sequence[str], *, template: str | None = None) -> list[int]:
    """The whole conversation up to turn ``turn_index``'s generation prompt, as token ids: the
    named conversation ``template`` (the model's ``prompt_template``, e.g. FastChat's vicuna_v1.1)
    where one is set, else the model's chat template (a plain transcript without one), or the raw
    prompt verbatim."""
    if prompt_format is PromptFormat.raw:
        return list(tokenizer.encode(adapter.raw_prompt(item)))
    prefix = item.extra.get("assistant_prefix", "")
    if template is not None:   # FastChat's text, tokenized as FastChat does (tokenizer([prompt]): BOS added)
        messages = adapter.build_messages(item, turn_index, answers)
        return list(tokenizer.encode(get_prompt_template(template).render(messages) + prefix))
    if getattr(tokenizer, "chat_template", None):
        def render(system_role: bool) -> str:
            messages = adapter.build_messages(item, turn_index, answers, system_role=system_role)
            return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

        try:
            text = render(system_role=True)
        except TemplateError:  # templates such as Gemma's reject a system message
            text = render(system_role=False)
        return list(tokenizer.encode(text + prefix, add_special_tokens=False))  # the template has BOS
    messages = adapter.build_messages(item, turn_index, answers)
    return list(tokenizer.encode(plain_transcript(messages) + prefix))


def _sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def rotated(decoders: Sequence[Decoder], index: int) -> list[Decoder]:
    shift = index % len(decoders)
    return list(decoders[shift:]) + list(decoders[:shift])


def run_batch(job: Job, batch: Sequence[Item], index: int) -> list[dict[str, Any]]:
    """Every turn of a batch of items (batch size 1: one item) with each decoder, the decoders in
    an order rotated by ``index``; returns the rows, per turn and item the baseline's first.
    Turn t decodes the items that have a turn t, each continuing its own conversation with that
    decoder; the sampling settings are the first item's (a batch shares one temperature)."""
    settings = job.settings
    decoders = settings.decoders
    sampling = job.sampling(batch[0])
    order = rotated(decoders, index)
    turns = {item.item_id: num_turns(job.adapter, item, settings) for item in batch}
    states: dict[tuple[str, str], Any] = {}
    answers: dict[tuple[str, str], list[str]] = {(i.item_id, d.name): [] for i in batch for d in decoders}
    batch_columns = {"batch_size": settings.batch_size, "batch": index,
                     "batch_items": " ".join(item.item_id for item in batch)}
    rows, scored = [], []
    for turn_index in range(max(turns.values())):
        live = [item for item in batch if turns[item.item_id] > turn_index]
        prompts = {key: job.prompt_ids(item, turn_index, answers[key])
                   for item in live for key in ((item.item_id, d.name) for d in decoders)}
        runs: dict[str, list[list[Timed]]] = {d.name: [] for d in decoders}
        for _ in range(settings.repeats):
            for decoder in order:
                keys = [(item.item_id, decoder.name) for item in live]
                # Each repeat must start from the same conversation: decode() extends the cache.
                run_states = [states.get(key) for key in keys]
                if settings.repeats > 1:
                    run_states = [s.copy() if isinstance(s, DecodeState) else s for s in run_states]
                runs[decoder.name].append(job.timed(decoder, [prompts[key] for key in keys], run_states,
                                                    sampling=sampling))
        for position, item in enumerate(live):
            results = {name: _median([timed[position] for timed in repeats]) for name, repeats in runs.items()}
            for decoder in decoders:
                key = (item.item_id, decoder.name)
                decoder.learn(results[decoder.name].output)      # after every repeat: each started alike
                states[key] = results[decoder.name].output.state
                answers[key].append(job.text(results[decoder.name].output.tokens))
            item_prompts = {d.name: prompts[item.item_id, d.name] for d in decoders}
            item_answers = {d.name: answers[item.item_id, d.name] for d in decoders}
            for row in _turn_rows(job, item, turn_index + 1, results, item_answers, sampling, order, item_prompts):
                rows.append({**row, **batch_columns})
                scored.append((item, tuple(results[row["decoder"]].output.tokens)))
    # Scored once every turn is decoded: under lookahead parallelism the other ranks then wait in
    # the store (``parallel.agree``, no collective timeout), not in a collective, while rank 0 runs
    # generated code.
    if settings.score and (job.sharded is None or job.sharded.rank == 0):     # rank 0 writes the rows
        scores: dict[tuple[str, tuple[int, ...]], dict[str, Any]] = {}
        for row, (item, tokens) in zip(rows, scored):
            if (item.item_id, tokens) not in scores:       # same tokens, same score: run the sandbox once
                scores[item.item_id, tokens] = score(job.adapter, item, row["text"], settings.prompt_format,
                                                     settings.sandbox)
            row.update(scores[item.item_id, tokens])
    return rows


def _median(runs: list[Timed]) -> Timed:
    """The first repeat's output (every repeat yields the same tokens: seeded) with median times."""
    first = runs[0]
    return replace(first, wall_s=statistics.median(t.wall_s for t in runs),
                   prefill_s=statistics.median(t.prefill_s for t in runs),
                   model_s=statistics.median(t.model_s for t in runs))


def _turn_rows(job: Job, item: Item, turn: int, results: dict[str, Timed], answers: dict[str, list[str]],
               sampling: SamplingConfig, order: list[Decoder], prompts: dict[str, list[int]]) -> list[dict[str, Any]]:
    settings = job.settings
    rows = []
    for decoder in settings.decoders:
        timed = results[decoder.name]
        tokens = timed.output.tokens
        row = make_row(job, item, turn, decoder, timed, sampling.temperature, order.index(decoder))
        reference = settings.reference(decoder)
        row.update(compare_to_baseline(job.lm, prompts, reference.name, decoder.name,
                                       results[reference.name].output.tokens, tokens,
                                       decoder is settings.baseline, sampling, judged_on=lambda: job.kernel(reference)))
        row["text"] = answers[decoder.name][turn - 1]
        rows.append(row)
    return rows


def make_row(job: Job, item: Item, turn: int, decoder: Decoder, timed: Timed, temperature: float,
             order: int) -> dict[str, Any]:
    """What ran and how it went: every decoder's row is assembled here, the same way."""
    stats = timed.output.stats
    new = len(timed.output.tokens)
    steps = timed.steps if timed.steps is not None else max(timed.forwards - 1, 0)
    decode_s = timed.decode_s
    row = {
        **job.constants,
        "linear": decoder.linear or job.constants["linear"],     # model.linear=both: the twin's kernel
        "item_id": item.item_id,
        "category": item.extra.get("category"),
        "turn": turn,
        "decoder": decoder.name,
        "family": decoder.family,
        "baseline": decoder is job.settings.baseline,
        "temperature": temperature,                   # the item's own with item_temperature
        "order": order,
        "lp_ranks": job.settings.ranks if job.settings.shares(decoder) else 1,
        "load_avg": round(os.getloadavg()[0], 2),
        **decoder.columns(),
        "prompt_tokens": timed.prompt_tokens,
        "prefill_tokens": stats.prefill_tokens if stats is not None else timed.prompt_tokens,
        "new_tokens": new,
        "batch_new_tokens": timed.batch_new_tokens if timed.batch_new_tokens is not None else new,
        "forwards": timed.forwards,                   # the call's (a batch's forwards are shared)
        "steps": steps,
        "S": (new - 1) / steps if steps else 1.0,   # tokens per verification forward after the first
        "prefill_s": timed.prefill_s,
        "decode_s": decode_s,
        "wall_s": timed.wall_s,
        "tokens_per_s": new / decode_s if decode_s > 0 else None,
        "model_s": timed.model_s,
        "overhead_frac": 1.0 - timed.model_s / decode_s if decode_s > 0 else None,
        # in the collectives of lookahead parallelism (part of decode_s, not of model_s)
        "comm_s": stats.comm_seconds if stats is not None and job.settings.shares(decoder) else None,
        # in a trained drafter's own forwards (EAGLE: part of decode_s, not of model_s)
        "draft_s": stats.draft_seconds if stats is not None else None,
    }
    if stats is not None:   # the core's own record of each step
        row.update(
            accepted_hist=json.dumps(stats.accepted_histogram),
            step_tokens_mean=statistics.fmean(stats.step_tokens) if stats.step_tokens else None,
            step_tokens_hist=json.dumps(dict(sorted(Counter(stats.step_tokens).items()))),
            # every step in order, what the cost model replays (cost_model.predict_batch)
            step_log=json.dumps({"fed": stats.step_tokens, "accepted": stats.accepted}),
            # per draft source and depth: fed, tried, accepted
            draft_acceptance=json.dumps(stats.drafts.counts.table()),
            # per source and decile of the estimate each tried node was fed under: predicted vs observed
            draft_reliability=json.dumps(stats.drafts.reliability.rows()),
        )
    return row


def compare_to_baseline(model: Any, prompts: dict[str, list[int]], baseline_name: str, name: str,
                        baseline: list[int], tokens: list[int], is_baseline: bool,
                        sampling: SamplingConfig,
                        judged_on: Callable[[], AbstractContextManager[None]] = ExitStack) -> dict[str, Any]:
    """Columns comparing a decoder's output with the baseline's on the same prompt: ``matches_greedy``
    and, where a greedy output differs, ``first_diff``, ``diff_margin`` and ``diff_verdict``, the
    baseline's logits computed inside ``judged_on()`` (``model.linear=both``: the baseline's kernel).

    When the two conversations already differed in an earlier turn, this turn's prompts differ
    too: the verdict is ``earlier_turn`` (the earlier turn's row has the real one), with no margin.
    """
    if is_baseline or not sampling.greedy:   # sampled outputs differ by design
        return {"matches_greedy": None}
    if tokens == baseline:
        return {"matches_greedy": True}
    if prompts[name] != prompts[baseline_name]:
        first = next((i for i, (a, b) in enumerate(zip(baseline, tokens)) if a != b), min(len(baseline), len(tokens)))
        return {"matches_greedy": False, "first_diff": first, "diff_margin": None, "diff_verdict": "earlier_turn"}
    with judged_on():
        found = divergence(model, prompts[baseline_name], baseline, tokens)
    return {"matches_greedy": False, "first_diff": found.position, "diff_margin": found.margin,
            "diff_verdict": found.verdict}


def plain_transcript(messages: Sequence[dict[str, str]]) -> str:
    """Chat messages as plain text, for models without a chat template (base and tiny models)."""
    lines = [f"{message['role'].capitalize()}: {message['content']}" for message in messages]
    return "\n\n".join(lines) + "\n\nAssistant:"


def pad_token_id(model: Any, eos: Sequence[int]) -> int:
    """The generation config's pad id, else the first EOS id, else 0 (what batched ``generate`` pads with)."""
    pad = model.generation_config.pad_token_id
    return pad if pad is not None else (eos[0] if eos else 0)


def eos_token_ids(model: Any, tokenizer: Any, extra: Iterable[int]) -> tuple[int, ...]:
    """EOS ids of the tokenizer, the generation config, the model config and the model's yaml."""
    sources = (
        getattr(tokenizer, "eos_token_id", None),
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        getattr(model.config, "eos_token_id", None),
        list(extra),
    )
    ids: list[int] = []
    for source in sources:
        ids += [source] if isinstance(source, int) else list(source or [])
    return tuple(dict.fromkeys(ids))


# ---------------------------------------------------------------------------------------------
# The progress bar


class Progress:
    """A tqdm bar over items showing each decoder's running speedup over the baseline (display only)."""

    def __init__(self, total: int, description: str, baseline: str, disable: bool = False) -> None:
        self.bar = tqdm(total=total, desc=description, unit="item", disable=disable)
        self.baseline = baseline
        self.seconds: dict[str, float] = {}

    def update(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.seconds[row["decoder"]] = self.seconds.get(row["decoder"], 0.0) + row["decode_s"]
        base = self.seconds.get(self.baseline, 0.0)
        self.bar.set_postfix_str(", ".join(f"{name} {base / seconds:.2f}x" for name, seconds in self.seconds.items()
                                           if name != self.baseline and seconds > 0))
        self.bar.update(len({row["item_id"] for row in rows}))   # items (a batch's rows hold several)

    def close(self) -> None:
        self.bar.close()

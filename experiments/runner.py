"""The benchmark runner: one model, one dataset subset, the baseline and one decoder, one CSV.

For every item (and every turn of multi-turn items) the baseline and the decoder under test run
back to back, in an order that alternates per item so that neither always sees the warmer caches.
Each conversation keeps its own :class:`DecodeState`, so turn 2 follows that decoder's own first
answer and reuses its KV cache. One CSV row per item, turn and decoder is appended as soon as the
item finishes; a rerun of the same command skips finished items. Aggregates are computed by
:mod:`experiments.report`, never here: the summary printed at the end is the report's.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import os
import re
import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import transformers
from jinja2 import TemplateError
from omegaconf import DictConfig
from tqdm import tqdm

from lookahead_core import DecodeLimits, DecodeOutput, DecodeState, SamplingConfig, decode, divergence
from lookahead_core import models as model_loader

from . import autotune, report, sandbox
from .datasets import DatasetAdapter, Item, get_dataset, repo_root
from .metrics import extract_code, rouge_scores, truncate_at_stop
from .sandbox import check_classeval, check_humaneval, check_mbpp
from .schema import ConfigError, Decoder, PromptFormat, RunSettings, to_settings, with_eos
from .tiny_tokenizer import ByteTokenizer

COLUMNS: tuple[str, ...] = (
    # what ran
    "experiment", "dataset", "item_id", "turn", "model", "dtype", "device",
    "decoder", "baseline", "config", "settings", "W", "N", "G", "prompt_pool", "pool_only",
    "temperature", "top_k", "top_p", "seed", "max_new_tokens", "torch", "transformers", "git_commit",
    # how it went
    "prompt_tokens", "prefill_tokens", "new_tokens", "steps", "S", "accepted_hist", "step_tokens_mean",
    "prefill_s", "decode_s", "wall_s", "tokens_per_s", "overhead_frac",
    # what came out
    "matches_greedy", "first_diff", "diff_margin", "diff_verdict", "rouge1", "rouge2", "rougeL", "passed",
    "sandbox", "text",
)  # fmt: skip
CODE_DATASETS = ("humaneval", "mbpp", "classeval")

SUMMARISATION = ("cnndm", "xsum")
WARMUP_TOKENS = 16


def run(cfg: DictConfig) -> Path:
    """Run the composed config; returns the CSV path. Fails on a bad config before loading anything."""
    settings = to_settings(cfg, device=resolve_device(cfg.device))
    adapter = get_dataset(settings.dataset.name, **settings.dataset.options)
    items = adapter.load(settings.data_root, settings.dataset.limit, settings.dataset.offset,
                         settings.dataset.source.value)
    _check_prompt_format(items, settings.prompt_format)
    if settings.item_temperature and not any("temperature" in item.extra for item in items):
        raise ConfigError(f"decoding.item_temperature: {settings.dataset.name} items carry no temperature "
                          "(only mtbench does)")
    if settings.score and settings.dataset.name in CODE_DATASETS:
        sandbox.require(settings.sandbox)  # before any model loads: fails saying what to install
    plan = {item.item_id: expected_keys(adapter, item, settings) for item in items}
    store = ResultStore(settings.results_path(), plan)
    # The index in the subset (not in the to-do list) sets the decoder order, so a resumed run
    # measures each item exactly as an uninterrupted one would.
    todo = [(index, item) for index, item in enumerate(items) if item.item_id not in store.finished]
    print(f"{settings.experiment} / {settings.model.name} / {settings.config_tag}: "
          f"{len(items) - len(todo)} of {len(items)} items already in {store.path}")
    if todo:
        session = Session.start(settings, adapter)
        if settings.auto is not None:
            session.settings = choose_auto(session, items, store.path.with_suffix(".auto.json"))
        session.warm_up(todo[0][1])
        progress = Progress(len(todo), f"{settings.experiment}/{settings.model.name}/{settings.config_tag}")
        for index, item in todo:
            rows = run_item(session, item, index)
            store.append(rows)
            progress.update(rows)
        progress.close()
    rows = report.load_results([store.path])
    print(report.to_markdown(report.summarize(rows), report.SUMMARY_COLUMNS))
    check_lossless(rows, store.path)
    return store.path


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


def divergence_columns(model: Any, prompts: dict[str, list[int]], baseline: str, decoder: str,
                       baseline_tokens: list[int], tokens: list[int]) -> dict[str, Any]:
    """``first_diff``, ``diff_margin``, ``diff_verdict`` of a greedy row that differs from its baseline.

    When the two conversations already differed in an earlier turn, this turn's prompts differ
    too: the verdict is ``earlier_turn`` (the earlier turn's row has the real one), with no margin.
    """
    if prompts[decoder] != prompts[baseline]:
        first = next((i for i, (a, b) in enumerate(zip(baseline_tokens, tokens)) if a != b),
                     min(len(baseline_tokens), len(tokens)))
        return {"first_diff": first, "diff_margin": None, "diff_verdict": "earlier_turn"}
    found = divergence(model, prompts[baseline], baseline_tokens, tokens)
    return {"first_diff": found.position, "diff_margin": found.margin, "diff_verdict": found.verdict}


def choose_auto(session: Session, items: Sequence[Item], record_path: Path) -> RunSettings:
    """``decoding=auto``: the settings with the candidate decoder replaced by the cost model's pick.

    Calibration uses first turns of items outside the evaluated range (right after it, else right
    before it); only when the run covers the whole dataset does it fall back to its first items,
    and says so. The record is saved at ``record_path`` and reloaded by a rerun.
    """
    settings = session.settings
    assert settings.auto is not None
    calibration = calibration_items(session.adapter, settings, items)
    prompts = [session.prompt_ids(item, 0, ()) for item in calibration]
    limits = replace(settings.limits, max_new_tokens=settings.auto.calibration_tokens)
    sampling = None if settings.sampling.greedy else settings.sampling
    record = autotune.calibrate(session.model, prompts, limits, record_path, sampling=sampling)
    chosen = autotune.chosen_config(record, seed=settings.seed)
    print(f"decoding=auto chose {record['chosen']} (calibration record: {record_path})")
    return replace(settings, candidate=Decoder("auto", chosen))


def calibration_items(adapter: DatasetAdapter, settings: RunSettings, items: Sequence[Item]) -> list[Item]:
    """``calibration_items`` items not in ``items``: the ones after the range, else before it."""
    assert settings.auto is not None
    want, dataset = settings.auto.calibration_items, settings.dataset
    root, source = settings.data_root, dataset.source.value
    after = adapter.load(root, want, dataset.offset + len(items), source)
    before = adapter.load(root, min(want, dataset.offset), max(0, dataset.offset - want), source) \
        if dataset.offset else []
    chosen = (list(after) + list(before))[:want]
    if not chosen:
        print(f"decoding=auto: every item of {dataset.name} is evaluated; calibrating on the first "
              f"{want} of them (in-sample)")
        chosen = list(items[:want])
    return chosen


def resolve_device(device: str) -> str:
    """``auto`` -> the best available device; anything else unchanged (validated by the schema)."""
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


def expected_keys(adapter: DatasetAdapter, item: Item, settings: RunSettings) -> frozenset[tuple[str, str]]:
    """The (turn, decoder) rows that make an item complete; an item is redone as a unit."""
    return frozenset((str(turn), decoder.name) for turn in range(1, num_turns(adapter, item, settings) + 1)
                     for decoder in settings.decoders)


def num_turns(adapter: DatasetAdapter, item: Item, settings: RunSettings) -> int:
    if settings.prompt_format is PromptFormat.raw:
        return 1
    return min(adapter.num_turns(item), settings.dataset.turns or adapter.num_turns(item))


def _check_prompt_format(items: Sequence[Item], prompt_format: PromptFormat) -> None:
    field = "turns" if prompt_format is PromptFormat.chat else "prompt"
    lacking = [item.item_id for item in items if getattr(item, field) is None]
    if lacking:
        raise ConfigError(f"dataset.prompt_format: {prompt_format.value} needs items with {field}; "
                          f"{items[0].dataset} item {lacking[0]} has none")


# ---------------------------------------------------------------------------------------------
# The model session: prompts, timed decodes, rows


@dataclass
class Session:
    """A loaded model with what every row repeats (versions, commit)."""

    settings: RunSettings
    adapter: DatasetAdapter
    model: Any
    tokenizer: Any
    constants: dict[str, Any]

    @classmethod
    def start(cls, settings: RunSettings, adapter: DatasetAdapter) -> Session:
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)
        spec = settings.model
        model, tokenizer = model_loader.load_model(
            spec.spec, dtype=spec.dtype.value, device=settings.device,
            attn_implementation=spec.attn_implementation.value, cache_dir=spec.cache_dir,
        )
        if tokenizer is None:  # tiny random test models ship none
            tokenizer = ByteTokenizer(model.config.vocab_size)
        settings = with_eos(settings, eos_token_ids(model, tokenizer, spec.extra_eos_token_ids))
        constants = {
            "experiment": settings.experiment, "dataset": settings.dataset.name, "model": spec.name,
            "dtype": spec.dtype.value, "device": settings.device, "config": settings.config_tag,
            "settings": settings.fingerprint(),
            "top_k": settings.sampling.top_k, "top_p": settings.sampling.top_p, "seed": settings.seed,
            "max_new_tokens": settings.limits.max_new_tokens, "torch": torch.__version__,
            "transformers": transformers.__version__, "git_commit": git_commit(repo_root()),
        }
        return cls(settings, adapter, model, tokenizer, constants)

    def prompt_ids(self, item: Item, turn_index: int, answers: Sequence[str]) -> list[int]:
        """The whole conversation up to turn ``turn_index``'s generation prompt, as token ids."""
        if self.settings.prompt_format is PromptFormat.raw:
            return list(self.tokenizer.encode(self.adapter.raw_prompt(item)))
        prefix = item.extra.get("assistant_prefix", "")
        if getattr(self.tokenizer, "chat_template", None):
            text = self._apply_chat_template(item, turn_index, answers) + prefix
            return list(self.tokenizer.encode(text, add_special_tokens=False))  # the template has BOS
        messages = self.adapter.build_messages(item, turn_index, answers)
        return list(self.tokenizer.encode(plain_transcript(messages) + prefix))

    def _apply_chat_template(self, item: Item, turn_index: int, answers: Sequence[str]) -> str:
        def render(system_role: bool) -> str:
            messages = self.adapter.build_messages(item, turn_index, answers, system_role=system_role)
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

        try:
            return render(system_role=True)
        except TemplateError:  # templates such as Gemma's reject a system message
            return render(system_role=False)

    def sampling(self, item: Item) -> SamplingConfig:
        """The run's sampling settings, at the item's own temperature with ``item_temperature``."""
        sampling = self.settings.sampling
        if self.settings.item_temperature and "temperature" in item.extra:
            sampling = replace(sampling, temperature=float(item.extra["temperature"]))
        return sampling

    def decode_once(self, ids: list[int], decoder: Decoder, state: DecodeState | None,
                    limits: DecodeLimits | None = None,
                    sampling: SamplingConfig | None = None) -> tuple[DecodeOutput, float]:
        start = time.perf_counter()
        out = decode(self.model, ids, decoder.lookahead, limits or self.settings.limits,
                     sampling or self.settings.sampling, state=state, tokenizer=self.tokenizer)
        return out, time.perf_counter() - start

    def warm_up(self, item: Item) -> None:
        """Untimed short decodes of each decoder, so the first timed item pays no one-off costs."""
        ids = self.prompt_ids(item, 0, ())
        limits = DecodeLimits(min(WARMUP_TOKENS, self.settings.limits.max_new_tokens),
                              self.settings.limits.eos_token_ids)
        for _ in range(self.settings.warmup):
            for decoder in self.settings.decoders:
                self.decode_once(ids, decoder, None, limits, self.sampling(item))

    def text(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)


@dataclass
class Timed:
    """One decoder's result on one prompt: the first repeat's output, each time the median over repeats."""

    output: DecodeOutput
    prompt_tokens: int
    prefill_s: float
    decode_s: float
    wall_s: float


def run_item(session: Session, item: Item, index: int) -> list[dict[str, Any]]:
    """Every turn of one item with each decoder; returns its rows (baseline rows first)."""
    settings = session.settings
    decoders = settings.decoders
    sampling = session.sampling(item)
    order = decoders if index % 2 == 0 else decoders[::-1]
    states: dict[str, DecodeState | None] = {d.name: None for d in decoders}
    answers: dict[str, list[str]] = {d.name: [] for d in decoders}
    rows = []
    for turn_index in range(num_turns(session.adapter, item, settings)):
        prompts = {d.name: session.prompt_ids(item, turn_index, answers[d.name]) for d in decoders}
        outputs: dict[str, DecodeOutput] = {}
        seconds: dict[str, list[tuple[float, float, float]]] = {d.name: [] for d in decoders}
        for _ in range(settings.repeats):
            for decoder in order:
                state = states[decoder.name]
                # Each repeat must start from the same conversation: decode() extends the cache.
                state = copy.deepcopy(state) if state is not None and settings.repeats > 1 else state
                out, wall = session.decode_once(prompts[decoder.name], decoder, state, sampling=sampling)
                outputs.setdefault(decoder.name, out)   # every repeat yields the same tokens (seeded)
                seconds[decoder.name].append((out.stats.prefill_seconds, out.stats.decode_seconds, wall))
        results = {name: Timed(outputs[name], len(prompts[name]), *map(statistics.median, zip(*seconds[name])))
                   for name in outputs}
        for decoder in decoders:
            states[decoder.name] = results[decoder.name].output.state
            answers[decoder.name].append(session.text(results[decoder.name].output.tokens))
        rows += _turn_rows(session, item, turn_index + 1, results, answers, sampling, prompts)
    return rows


def _turn_rows(session: Session, item: Item, turn: int, results: dict[str, Timed],
               answers: dict[str, list[str]], sampling: SamplingConfig,
               prompts: dict[str, list[int]]) -> list[dict[str, Any]]:
    settings = session.settings
    baseline = results[settings.baseline.name].output.tokens
    scores: dict[tuple[int, ...], dict[str, Any]] = {}
    rows = []
    for decoder in settings.decoders:
        timed = results[decoder.name]
        tokens = timed.output.tokens
        text = answers[decoder.name][turn - 1]
        if settings.score and tuple(tokens) not in scores:  # same tokens, same score: run the sandbox once
            scores[tuple(tokens)] = score(session.adapter, item, text, settings.prompt_format, settings.sandbox)
        matches = None
        if not decoder.is_baseline and sampling.greedy:  # sampled outputs differ by design
            matches = tokens == baseline
        diff = {} if matches is not False else divergence_columns(
            session.model, prompts, settings.baseline.name, decoder.name, baseline, tokens)
        rows.append({**_row(session, item, turn, decoder, timed, text, matches, scores.get(tuple(tokens), {}),
                            sampling.temperature), **diff})
    return rows


def _row(session: Session, item: Item, turn: int, decoder: Decoder, timed: Timed, text: str,
         matches: bool | None, scores: dict[str, Any], temperature: float) -> dict[str, Any]:
    stats = timed.output.stats
    lookahead = decoder.lookahead
    return {
        **session.constants,
        "item_id": item.item_id,
        "turn": turn,
        "decoder": decoder.name,
        "baseline": decoder.is_baseline,
        "temperature": temperature,                   # the item's own with item_temperature
        "W": None if lookahead is None or lookahead.pool_only else lookahead.window,
        "N": None if lookahead is None else lookahead.ngram,
        "G": None if lookahead is None else lookahead.guess,
        "prompt_pool": None if lookahead is None else lookahead.prompt_pool,
        "pool_only": None if lookahead is None else lookahead.pool_only,
        "prompt_tokens": timed.prompt_tokens,
        "prefill_tokens": stats.prefill_tokens,
        "new_tokens": stats.new_tokens,
        "steps": stats.steps,
        "S": stats.compression,
        "accepted_hist": json.dumps(stats.accepted_histogram),
        "step_tokens_mean": statistics.fmean(stats.step_tokens) if stats.step_tokens else None,
        "prefill_s": timed.prefill_s,
        "decode_s": timed.decode_s,
        "wall_s": timed.wall_s,
        "tokens_per_s": stats.new_tokens / timed.decode_s if timed.decode_s else None,
        "overhead_frac": stats.overhead_fraction,
        "matches_greedy": matches,
        **scores,
        "text": text,
    }


def score(adapter: DatasetAdapter, item: Item, text: str, prompt_format: PromptFormat,
          mode: str = "bwrap") -> dict[str, Any]:
    """Quality columns of one output: ROUGE F-measures for summaries, ``passed`` (and the
    ``sandbox`` mode that ran it) for code."""
    name = adapter.name
    if name in SUMMARISATION:
        return {kind: values["mean"] for kind, values in rouge_scores([text], [item.reference or ""]).items()}
    if name == "humaneval":
        return {"passed": check_humaneval(item.extra, truncate_at_stop(text), mode=mode).passed, "sandbox": mode}
    if name == "mbpp":
        return {"passed": check_mbpp(item.extra, extract_code(text), mode=mode).passed, "sandbox": mode}
    if name == "classeval":
        code = extract_code(text) if prompt_format is PromptFormat.chat else adapter.raw_prompt(item) + text
        return {"passed": check_classeval(item.extra, code, mode=mode).passed, "sandbox": mode}
    return {}


def plain_transcript(messages: Sequence[dict[str, str]]) -> str:
    """Chat messages as plain text, for models without a chat template (base and tiny models)."""
    lines = [f"{message['role'].capitalize()}: {message['content']}" for message in messages]
    return "\n\n".join(lines) + "\n\nAssistant:"


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


def git_commit(root: Path) -> str:
    """Short hash of the checkout's HEAD, read from ``.git`` (no git process); "unknown" elsewhere."""
    git = root / ".git"
    try:
        if git.is_file():  # a worktree: ".git" names the real git directory
            git = (root / git.read_text().split(":", 1)[1].strip()).resolve()
        common = (git / (git / "commondir").read_text().strip()).resolve() if (git / "commondir").is_file() else git
        head = (git / "HEAD").read_text().strip()
        if head.startswith("ref: "):
            ref = head[len("ref: "):]
            loose = common / ref
            packed = (common / "packed-refs").read_text() if (common / "packed-refs").is_file() else ""
            matches = [line.split()[0] for line in packed.splitlines() if line.endswith(" " + ref)]
            head = loose.read_text().strip() if loose.is_file() else (matches[0] if matches else "")
    except OSError:
        return "unknown"
    return head[:7] if re.fullmatch(r"[0-9a-f]{40}", head) else "unknown"


# ---------------------------------------------------------------------------------------------
# The results file and the progress bar


class ResultStore:
    """The run's CSV: finished items are read back, rows of unfinished items are dropped.

    ``plan`` maps each item id of this run to its expected (turn, decoder) keys. Rows of items
    outside the plan (another subset of the same settings) are kept as they are. Each item's rows
    are appended in one write and flushed, so a crash loses at most the item in progress; a row
    torn by a crash mid-write is detected (no final newline) and dropped with its item.
    """

    def __init__(self, path: Path, plan: dict[str, frozenset[tuple[str, str]]]) -> None:
        self.path = path
        self._torn = self._stale_header = False
        rows = self._read() if path.exists() else []
        keys: dict[str, set[tuple[str, str]]] = {}
        for row in rows:
            keys.setdefault(row["item_id"], set()).add((row["turn"], row["decoder"]))
        self.finished = {item for item, expected in plan.items() if expected <= keys.get(item, set())}
        kept = [row for row in rows if row["item_id"] not in plan or row["item_id"] in self.finished]
        if not path.exists() or len(kept) != len(rows) or self._torn or self._stale_header:
            self._rewrite(kept)

    def _read(self) -> list[dict[str, str]]:
        text = self.path.read_text(encoding="utf-8")
        self._torn = bool(text) and not text.endswith("\n")
        records = list(csv.reader(io.StringIO(text)))
        if not records:
            return []
        header, body = tuple(records[0]), records[1:]
        if header not in (COLUMNS, _COLUMNS_BEFORE_SANDBOX):
            raise RuntimeError(f"{self.path} was written with other columns; move it away to start afresh")
        self._stale_header = header != COLUMNS   # rewritten with the current one (old rows: no sandbox)
        if self._torn:
            body = body[:-1]
        return [dict(zip(header, record)) for record in body]

    def _rewrite(self, rows: list[dict[str, str]]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".csv.partial")
        partial.write_text(_render(rows, header=True), encoding="utf-8")
        os.replace(partial, self.path)

    def append(self, rows: list[dict[str, Any]]) -> None:
        with open(self.path, "a", encoding="utf-8", newline="") as handle:
            handle.write(_render(rows))
            handle.flush()
            os.fsync(handle.fileno())


_COLUMNS_BEFORE_SANDBOX = tuple(column for column in COLUMNS if column != "sandbox")


def _render(rows: list[dict[str, Any]], header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


class Progress:
    """A tqdm bar over items showing the running step compression S and speedup (display only)."""

    def __init__(self, total: int, description: str) -> None:
        self.bar = tqdm(total=total, desc=description, unit="item")
        self.accepted = self.steps = 0
        self.seconds = {True: 0.0, False: 0.0}   # decode seconds of baseline / candidate rows

    def update(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self.seconds[row["baseline"]] += row["decode_s"]
            if not row["baseline"]:
                self.accepted += row["S"] * row["steps"]
                self.steps += row["steps"]
        postfix = {}
        if self.steps:
            postfix["S"] = f"{self.accepted / self.steps:.2f}"
        if self.seconds[False]:
            postfix["speedup"] = f"{self.seconds[True] / self.seconds[False]:.2f}x"
        self.bar.set_postfix(postfix)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()

"""The typed schema of a run, and its conversion into the decoder core's dataclasses.

Hydra composes ``conf/`` on top of :class:`RunConfig` (stored in the ConfigStore as ``run_schema``,
the first entry of ``conf/config.yaml``'s defaults), so every group node - ``model``, ``experiment``,
``dataset``, ``decoding`` - is typed: a wrong type or an unknown key (``decoding.window=abc``,
``model.foo=1``) fails at compose time with the full key in the message. Values that are well typed
but impossible (``decoding.window=0``) fail in :func:`to_settings`, which builds the core's
self-validating dataclasses; it runs before any model or dataset is loaded.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from lookahead_core import DecodeLimits, LookaheadConfig, SamplingConfig

from .datasets import DATASETS, get_dataset, repo_root
from .sandbox import MODES as SANDBOX_MODES


class ConfigError(ValueError):
    """A composed configuration that cannot run; the message names the offending key."""


class DType(str, Enum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Attention(str, Enum):
    """Only these take the custom 4-D masks the core feeds (lookahead_core/model_io.py)."""

    sdpa = "sdpa"
    eager = "eager"


class PromptFormat(str, Enum):
    chat = "chat"   # the model's chat template over the item's user turns (plain text without one)
    raw = "raw"     # the item's raw completion prompt, verbatim


class DataSource(str, Enum):
    auto = "auto"   # local file, else the Hugging Face hub
    local = "local"
    hub = "hub"


@dataclass
class ModelConfig:
    """Which model to load; ``name`` names result folders, ``spec`` goes to ``load_model``."""

    name: str = MISSING
    spec: str = MISSING                    # offline name, tiny-<arch>, local folder or hub id
    dtype: DType = DType.float32
    attn_implementation: Attention = Attention.sdpa
    extra_eos_token_ids: list[int] = field(default_factory=list)   # e.g. Llama 3's <|eot_id|>
    cache_dir: Optional[str] = None        # None: the loader's default ($LOOKAHEAD_CACHE)


@dataclass
class ExperimentConfig:
    """What one benchmark run generates; the values follow the reference harness's conventions."""

    name: str = MISSING
    max_new_tokens: int = 128
    stop_strings: list[str] = field(default_factory=list)
    score: bool = True                     # compute ROUGE / pass columns (code runs in the sandbox)


@dataclass
class DatasetConfig:
    """Which items: ``[offset : offset + limit]`` of the adapter's list, first ``turns`` turns each."""

    name: str = MISSING
    limit: Optional[int] = None
    offset: int = 0
    turns: Optional[int] = None            # None: every turn the item has (MT-Bench: 2)
    prompt_format: Optional[PromptFormat] = None   # None: the adapter's own format
    source: DataSource = DataSource.auto
    options: dict[str, Any] = field(default_factory=dict)   # adapter constructor arguments


@dataclass
class DecodingConfig:
    """The decoder under test; the baseline (``lookahead=False``, same sampling) always runs too.

    W = ``window``, N = ``ngram``, G = ``guess`` as in the paper; ``temperature == 0`` is greedy.
    """

    lookahead: bool = True
    window: int = 15
    ngram: int = 5
    guess: int = 15
    prompt_pool: bool = False
    pool_only: bool = False
    keep_pool: bool = True
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    # Sample each item at the temperature its dataset gives (MT-Bench: FastChat's per-category
    # table; 0 means greedy for that item); ``temperature`` is the fallback for items without one.
    item_temperature: bool = False
    # decoding=auto: the cost model picks (W, N, G), pool-only or greedy on calibration items that
    # are not evaluated (the ones right after the evaluated range); window/ngram/guess are ignored.
    auto: bool = False
    calibration_items: int = 2
    calibration_tokens: int = 64
    # Token trees and draft sources (lookahead_core/drafts.py; LookaheadConfig documents each):
    # merge candidates into one prefix tree, suffix-match drafts, recycled top-k successors, draft
    # depth (0 = N-1), the most tokens fed per step (0 = no cap).
    tree: bool = False
    suffix: int = 0
    recycle: int = 0
    depth: int = 0
    budget: int = 0


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    decoding: DecodingConfig = field(default_factory=DecodingConfig)
    data_root: str = "../shared/data"      # relative paths are resolved against the repository root
    results_dir: str = "results/raw"
    device: str = "auto"                   # auto: cuda, else mps, else cpu
    seed: int = 0                          # seeds the lookahead window draw and sampling
    repeats: int = 1                       # timed runs per decoder per prompt; the median is kept
    warmup: int = 1                        # untimed short decodes per decoder before the first item
    threads: Optional[int] = None          # torch.set_num_threads; None keeps torch's default
    # How generated code is run for pass@k: bwrap (bubblewrap, the default) or the weaker process
    # mode for machines without bubblewrap or user namespaces (see README, Sandbox).
    sandbox: str = "bwrap"


def register_configs() -> None:
    """Put the schema in Hydra's ConfigStore; ``conf/config.yaml`` lists it first in its defaults."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)


# ---------------------------------------------------------------------------------------------
# Composed config -> validated settings


@dataclass(frozen=True)
class Decoder:
    """One side of a comparison: the baseline (``lookahead is None``) or the decoder under test."""

    name: str
    lookahead: LookaheadConfig | None      # None: plain greedy / sampling through the core's loop
    is_baseline: bool = False


@dataclass(frozen=True)
class AutoSettings:
    """``decoding=auto``: how much to calibrate before the run picks its decoder."""

    calibration_items: int
    calibration_tokens: int


@dataclass(frozen=True)
class RunSettings:
    """Everything a run needs, validated; built from the composed config by :func:`to_settings`."""

    model: ModelConfig
    experiment: str
    dataset: DatasetConfig
    prompt_format: PromptFormat
    baseline: Decoder
    candidate: Decoder | None              # None when the decoding config is the baseline itself
    sampling: SamplingConfig
    limits: DecodeLimits                   # without EOS ids: those come from the tokenizer
    config_tag: str
    data_root: Path
    results_dir: Path
    device: str
    seed: int
    repeats: int
    warmup: int
    threads: int | None
    score: bool
    item_temperature: bool = False         # items may carry their own temperature (MT-Bench)
    auto: AutoSettings | None = None       # the candidate is "auto"; its config is chosen at run time
    sandbox: str = "bwrap"                 # experiments.sandbox mode for code scoring

    @property
    def decoders(self) -> tuple[Decoder, ...]:
        return (self.baseline,) if self.candidate is None else (self.baseline, self.candidate)

    def fingerprint(self) -> str:
        """Hash of every setting that changes a result row, except the seed and the item subset.

        It names the results file, so a rerun of the same command resumes it and a run with other
        settings (``max_new_tokens``, dtype, ...) never mixes its rows into it.
        """
        payload = {
            "model": {k: _plain(v) for k, v in asdict(self.model).items() if k not in ("name", "cache_dir")},
            "experiment": self.experiment,
            "dataset": [self.dataset.name, self.dataset.options, self.prompt_format.value,
                        self.dataset.source.value],
            "decoders": [(d.name, _lookahead_fields(d.lookahead)) for d in self.decoders],
            "sampling": [self.sampling.temperature, self.sampling.top_k, self.sampling.top_p],
            "limits": [self.limits.max_new_tokens, list(self.limits.stop_strings)],
            "run": [self.device, self.repeats, self.threads, self.score],
        }
        if self.auto is not None:
            payload["auto"] = asdict(self.auto)
        if self.item_temperature:
            payload["item_temperature"] = True
        blob = json.dumps(payload, sort_keys=True, default=str)
        # The "h" stops CSV readers from parsing a hash such as "951e9898" as a number.
        return "h" + hashlib.sha1(blob.encode()).hexdigest()[:8]

    def results_path(self) -> Path:
        name = f"{self.config_tag}-{self.fingerprint()}-s{self.seed}.csv"
        return self.results_dir / self.experiment / self.model.name / name


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


# Fields added with token trees: left out of the fingerprint at their defaults, so results files
# written before them keep their names and resume.
_TREE_DEFAULTS = {"tree": False, "suffix": 0, "recycle": 0, "depth": 0, "budget": 0}


def _lookahead_fields(config: LookaheadConfig | None) -> dict[str, Any] | None:
    if config is None:
        return None
    fields = asdict(config)
    fields.pop("seed")
    for name, default in _TREE_DEFAULTS.items():
        if fields[name] == default:
            fields.pop(name)
    return fields


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def to_settings(cfg: DictConfig, *, device: str | None = None) -> RunSettings:
    """Validate the composed config and convert it; raises :class:`ConfigError` naming the key.

    ``device`` is the resolved device (``auto`` already replaced); it enters the results file
    name, since timings on different devices must not share a file.
    """
    run: RunConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    dataset = run.dataset
    _check(_DEVICE.fullmatch(run.device) is not None, "device", "auto, cpu, mps, cuda or cuda:N", run.device)
    _check(run.repeats >= 1, "repeats", ">= 1", run.repeats)
    _check(run.warmup >= 0, "warmup", ">= 0", run.warmup)
    _check(run.threads is None or run.threads >= 1, "threads", ">= 1 or null", run.threads)
    _check(run.sandbox in SANDBOX_MODES, "sandbox", f"one of {list(SANDBOX_MODES)}", run.sandbox)
    _check(dataset.name in DATASETS, "dataset.name", f"one of {sorted(DATASETS)}", dataset.name)
    _check(dataset.limit is None or dataset.limit >= 0, "dataset.limit", ">= 0 or null", dataset.limit)
    _check(dataset.offset >= 0, "dataset.offset", ">= 0", dataset.offset)
    _check(dataset.turns is None or dataset.turns >= 1, "dataset.turns", ">= 1 or null", dataset.turns)

    decoding = run.decoding
    sampling = _build("decoding", SamplingConfig, temperature=decoding.temperature, top_k=decoding.top_k,
                      top_p=decoding.top_p, seed=run.seed)
    greedy = sampling.greedy and not decoding.item_temperature
    baseline = Decoder("greedy" if greedy else "sampling", None, is_baseline=True)
    candidate = auto = None
    if decoding.auto:
        _check(decoding.lookahead, "decoding.lookahead", "true with decoding.auto", decoding.lookahead)
        _check(decoding.calibration_items >= 1, "decoding.calibration_items", ">= 1", decoding.calibration_items)
        _check(decoding.calibration_tokens >= 1, "decoding.calibration_tokens", ">= 1", decoding.calibration_tokens)
        auto = AutoSettings(decoding.calibration_items, decoding.calibration_tokens)
        candidate = Decoder("auto", None)
    elif decoding.lookahead:
        lookahead = _build("decoding", LookaheadConfig, window=decoding.window, ngram=decoding.ngram,
                           guess=decoding.guess, prompt_pool=decoding.prompt_pool, pool_only=decoding.pool_only,
                           keep_pool=decoding.keep_pool, seed=run.seed, tree=decoding.tree, suffix=decoding.suffix,
                           recycle=decoding.recycle, depth=decoding.depth, budget=decoding.budget)
        candidate = Decoder(_decoder_name(lookahead), lookahead)
    limits = _build("experiment", DecodeLimits, max_new_tokens=run.experiment.max_new_tokens,
                    stop_strings=tuple(run.experiment.stop_strings))

    root = repo_root()
    try:  # builds the adapter (for its default prompt format) without reading any data
        adapter = get_dataset(dataset.name, **dataset.options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"dataset.options: {err}") from err
    prompt_format = dataset.prompt_format or PromptFormat(adapter.format)
    return RunSettings(
        model=run.model,
        experiment=run.experiment.name,
        dataset=dataset,
        prompt_format=prompt_format,
        baseline=baseline,
        candidate=candidate,
        sampling=sampling,
        limits=limits,
        config_tag=config_tag(candidate or baseline, sampling, item_temperature=decoding.item_temperature),
        data_root=_resolve(root, run.data_root),
        results_dir=_resolve(root, run.results_dir),
        device=device or run.device,
        seed=run.seed,
        repeats=run.repeats,
        warmup=run.warmup,
        threads=run.threads,
        score=run.experiment.score,
        item_temperature=decoding.item_temperature,
        auto=auto,
        sandbox=run.sandbox,
    )


def with_eos(settings: RunSettings, eos_token_ids: tuple[int, ...]) -> RunSettings:
    """The settings once the tokenizer has told us its EOS ids."""
    return replace(settings, limits=replace(settings.limits, eos_token_ids=eos_token_ids))


def config_tag(decoder: Decoder, sampling: SamplingConfig, *, item_temperature: bool = False) -> str:
    """A readable name of the decoding setup, e.g. ``lookahead_w15_n5_g15`` or ``sampling_t1_k0_p1``
    (``t-item`` when each item brings its own temperature)."""
    parts = [decoder.name]
    if decoder.lookahead is not None:
        config = decoder.lookahead
        if not config.pool_only:
            parts.append(f"w{config.window}")
        parts += [f"n{config.ngram}", f"g{config.guess}"]
        # token trees: tree, sfx<suffix>, rc<recycle>, d<depth>, k<budget>, each only when set
        parts += ["tree"] * config.tree + [f"{key}{value}" for key, value in (
            ("sfx", config.suffix), ("rc", config.recycle), ("d", config.depth), ("k", config.budget)) if value]
    if item_temperature:
        parts += ["t-item", f"k{sampling.top_k}", f"p{sampling.top_p:g}"]
    elif not sampling.greedy:
        parts += [f"t{sampling.temperature:g}", f"k{sampling.top_k}", f"p{sampling.top_p:g}"]
    return "_".join(parts)


def _decoder_name(lookahead: LookaheadConfig) -> str:
    if lookahead.pool_only:
        return "pool_only"
    return "lookahead_pool" if lookahead.prompt_pool else "lookahead"


def _build(key: str, cls: type, **kwargs: Any) -> Any:
    try:
        return cls(**kwargs)
    except ValueError as err:
        raise ConfigError(f"{key}: {err}") from err


def _check(ok: bool, key: str, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"{key} must be {rule}, got {value!r}")


def _resolve(root: Path, path: str) -> Path:
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else (root / candidate).resolve()

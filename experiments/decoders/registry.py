"""The decoder registry: every way to generate is one small class here plus one yaml in ``conf/decoding/``.

A yaml names its class with ``kind`` (default ``core``) and sets that class's parameters; the keys
every decoder shares (``temperature``, ``top_k``, ``top_p``, ``item_temperature``) belong to the job,
because a job compares its decoders against one baseline at one temperature. The runner knows no
decoder by name: it calls

* :meth:`Decoder.prepare` once, after the model loads (``auto`` calibrates, ``hf_assisted`` loads
  its draft model),
* :meth:`Decoder.generate` per prompt (the runner times every call alike with forward hooks), or
  :meth:`Decoder.generate_batch` per batch of prompts with ``batch_size`` > 1 (decoders with
  ``batched = True``),
* :meth:`Decoder.columns` for the row's config columns.

Adding a method (README, "Adding a decoder"): a class with a ``Params`` dataclass (its yaml keys,
typed, with defaults) registered with ``@register("<kind>")``, and ``conf/decoding/<name>.yaml``
with ``kind: <kind>``. Nothing else changes.

This module imports neither torch nor transformers at import time: configs are validated before
the heavy libraries load (``run.py``), so a bad override fails in a fraction of a second.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Sequence
from pathlib import Path
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from experiments.config.identity import ASIDE, differing
from lookahead_core.config import DecodeLimits, LookaheadConfig, SamplingConfig, config_fields

DECODERS: dict[str, type[Decoder]] = {}


def register(kind: str):
    """Class decorator: ``kind`` is what a yaml's ``kind:`` key names."""
    def add(cls: type[Decoder]) -> type[Decoder]:
        cls.kind = kind
        DECODERS[kind] = cls
        return cls
    return add


@dataclass
class Generation:
    """What a decoder returns for one prompt; timing is the runner's (forward hooks), not the decoder's."""

    tokens: list[int]
    state: Any = None                  # the conversation to continue (core decoders), else None
    stats: Any = None                  # lookahead_core.DecodeStats for core decoders, else None


class Decoder:
    """One way to generate. ``name`` labels its rows; ``params`` is its validated ``Params``."""

    kind: ClassVar[str]
    family: ClassVar[str] = "core"     # "core": this project's decode loop; "hf": transformers generate
    batched: ClassVar[bool] = False    # has generate_batch (the job's batch_size may exceed 1)
    # The linear kernel this decoder's calls run on (stock or stream) when the job measures both
    # (model.linear=both, settings.kernel_twins); None: the model's, as loaded.
    linear: str | None = None

    @dataclass
    class Params:
        pass

    def __init__(self, name: str, params: Any, seed: int = 0) -> None:
        self.name = name
        self.params = params
        self.seed = seed

    @classmethod
    def params_schema(cls) -> type:
        return cls.Params

    @property
    def lookahead(self) -> LookaheadConfig | None:
        """The core's lookahead config this decoder decodes with; None: no lookahead step (greedy,
        plain sampling, transformers' decoders)."""
        return None

    def columns(self) -> dict[str, Any]:
        """The row's config columns (see ``runner.COLUMNS``); ``params`` holds every setting."""
        return {"params": json.dumps(_plain(self.params), sort_keys=True)}

    def identity(self) -> list:
        """What tells its results apart (``experiments.config.identity``): its name, kind and the
        parameters that differ from their defaults."""
        return [self.name, self.kind, differing(self.params)]

    def learn(self, generation: Generation) -> None:
        """Called with each evaluated turn's generation (the first repeat's; never the warm-up's),
        after every repeat of that turn ran: what an online decoder may learn from."""

    def prepare(self, job: Any) -> None:
        """Called once after the model loads, before the warm-up."""

    def generate(self, job: Any, ids: list[int], state: Any, limits: DecodeLimits,
                 sampling: SamplingConfig) -> Generation:
        raise NotImplementedError

    def generate_batch(self, job: Any, prompts: list[list[int]], limits: DecodeLimits,
                       sampling: SamplingConfig) -> list[Generation]:
        """Each prompt's generation, the batch decoded together (fresh conversations: no state)."""
        raise NotImplementedError(f"{self.name} decodes one sequence at a time")


def _plain(params: Any) -> Any:
    return dataclasses.asdict(params) if dataclasses.is_dataclass(params) else params


# ---------------------------------------------------------------------------------------------
# The core's decode loop: greedy, lookahead, prompt pool, pool-only, sampling, auto


def _core_params() -> type:
    """``lookahead`` (false: the plain greedy / sampling loop) plus every ``LookaheadConfig`` field
    but the seed (the job's), with its type and default: a field added to ``LookaheadConfig`` is a
    yaml key at once."""
    hints = typing.get_type_hints(LookaheadConfig)
    fields = [("lookahead", bool, field(default=True))]
    for f in dataclasses.fields(LookaheadConfig):
        if f.name == "seed":
            continue
        hint = f.metadata.get("yaml", hints[f.name])     # what a yaml writes (``sources``: a mapping)
        if hint is not hints[f.name]:
            default = field(default_factory=typing.get_origin(hint) or hint)
        elif f.default is not dataclasses.MISSING:
            default = field(default=f.default)
        else:
            default = field(default_factory=f.default_factory)
        fields.append((f.name, hint, default))
    # Not LookaheadConfig fields: where the trained drafters of ``sources`` come from.
    fields.append(("heads", str, field(default="")))        # Medusa heads (FasterDecoding's format)
    fields.append(("drafter", str, field(default="")))      # an EAGLE drafter (EAGLE's published layout)
    return dataclasses.make_dataclass("CoreParams", fields)


def lookahead_config(params: Any, seed: int) -> LookaheadConfig | None:
    """The core config a core decoder's params describe (``None``: no lookahead)."""
    core = {f.name for f in dataclasses.fields(LookaheadConfig)}
    values = {f.name: getattr(params, f.name) for f in dataclasses.fields(params) if f.name in core}
    return LookaheadConfig(**values, seed=seed) if params.lookahead else None


def core_columns(config: LookaheadConfig | None) -> dict[str, Any]:
    """The row's config columns of a decoder running the core's loop with ``config``."""
    return {
        "W": None if config is None or config.pool_only else config.window,
        "N": None if config is None else config.ngram,
        "G": None if config is None else config.guess,
        "prompt_pool": None if config is None else config.prompt_pool,
        "pool_only": None if config is None else config.pool_only,
        "params": json.dumps(config_fields(config), sort_keys=True, default=str),
    }


@register("core")
class CoreDecoder(Decoder):
    """``lookahead_core.decode``: greedy or sampling with ``lookahead: false``, else lookahead
    (W, N, G), with the prompt pool, pool-only, ...: whatever the ``LookaheadConfig`` fields say."""

    Params = _core_params()
    batched = True
    prior = None                 # draft acceptance (DraftStats) a conversation's first turn starts from

    def __init__(self, name: str, params: Any, seed: int = 0) -> None:
        super().__init__(name, params, seed)
        self.config = lookahead_config(params, seed)    # validates (ValueError names the field)
        for key, what in (("heads", "Medusa heads"), ("drafter", "EAGLE drafter")):
            folder = getattr(params, key)
            if folder and not (Path(folder).expanduser() / "config.json").is_file():
                raise ValueError(f"{key}: {folder!r} holds no {what} (no config.json there)")

    @property
    def lookahead(self) -> LookaheadConfig | None:
        return self.config

    def prepare(self, job) -> None:
        """Loads the trained drafters a config's ``sources`` name onto the job's model: Medusa heads
        (``heads``, or the ones trained for the job's model: ``python -m experiments.tools.medusa
        model=<model>``), an EAGLE drafter (``drafter``, or ``python -m experiments.tools.eagle``'s)."""
        if self.config is None:
            return
        from experiments.models.heads import heads_dir, train_command

        model = job.settings.model.name
        for kind, key, what, layout in (("medusa", "heads", "Medusa heads", "FasterDecoding's format"),
                                        ("eagle", "drafter", "EAGLE drafter", "EAGLE's published layout")):
            if kind not in dict(self.config.sources) or kind in job.lm.drafters:
                continue
            given = getattr(self.params, key)
            folder = Path(given).expanduser() if given else heads_dir(model, kind=kind)
            if not (folder / "config.json").is_file():
                raise ValueError(f"{self.name}: no {what} for {model} at {folder}; train them with "
                                 f"`{train_command(model, kind)}` or set {key}=<folder> ({layout})")
            if kind == "medusa":
                from lookahead_core.medusa import load_heads

                job.lm.drafters[kind] = load_heads(folder, job.model)
            else:
                from lookahead_core.eagle import load_drafter

                job.lm.drafters[kind] = load_drafter(folder, job.model)
            print(f"{self.name}: {what} from {folder}")

    def columns(self) -> dict[str, Any]:
        return core_columns(self.config)

    def generate(self, job, ids, state, limits, sampling) -> Generation:
        """A conversation's first turn starts from ``prior`` (if any); later turns carry their own
        acceptance on (``DecodeState.drafts``)."""
        from lookahead_core import DecodeState, decode

        if state is None and self.prior is not None:
            state = DecodeState(cache=None, cached_tokens=[], drafts=self.prior)
        out = decode(job.lm_for(self), ids, self.config, limits, sampling, state=state, tokenizer=job.tokenizer)
        return Generation(out.tokens, out.state, out.stats)

    def generate_batch(self, job, prompts, limits, sampling) -> list[Generation]:
        from lookahead_core import decode_batch

        outs = decode_batch(job.lm_for(self), prompts, self.config, limits, sampling, tokenizer=job.tokenizer, prior=self.prior)
        return [Generation(out.tokens, None, out.stats) for out in outs]


@register("auto")
class AutoDecoder(CoreDecoder):
    """The cost model's pick (lookahead_core/cost/) on the device's latency curve (cached per
    ``autotune.CurveKey``). Protocol ``online`` (the default) decodes with the widest cost-aware
    tree, each step feeding the nodes its estimates say pay on this device, from the acceptance
    stored for the model and dataset (or the guesses) on; ``grid`` first calibrates a grid on
    items that are not evaluated and decodes as the config predicted fastest (greedy included),
    with B > 1 fastest for batches of B (``autotune.calibrate_batch``).

    The record is saved beside the results (``<csv>.auto.json``) and reused by a rerun, so a
    resumed job keeps its decoder; a grid's pick is also cached for other jobs on the same curve,
    items and grid (``autotune.pick_key``). Every evaluated decode starts from the acceptance
    measured so far and adds its own to the store."""

    @dataclass
    class Params:
        calibration_items: int = 3       # first turns of the items right after the evaluated range
        calibration_tokens: int = 128    # new tokens per calibration decode
        calibration_offset: Optional[int] = None   # first calibration item; None: after the range
        predict: bool = False            # also calibrate the job's other core decoders (predicted vs measured)
        # measure the latency curve and calibrate again, ignoring the caches (how, not what: ASIDE)
        recalibrate: bool = field(default=False, metadata=ASIDE)
        # online: calibrate nothing, decode with the widest cost-aware tree (cost.widest_tree), each
        # step cut by its nodes' estimates; grid: calibrate the grid on the calibration items and
        # decode with the predicted fastest (pays where its cached pick is reused, docs/auto.md)
        protocol: str = "online"
        eagle: bool = True               # online: consider the model's trained EAGLE drafter, where there is one

    PROTOCOLS = ("online", "grid")

    def __init__(self, name: str, params: Any, seed: int = 0) -> None:
        Decoder.__init__(self, name, params, seed)
        if params.calibration_items < 1 or params.calibration_tokens < 1:
            raise ValueError(f"calibration_items and calibration_tokens must be >= 1, got "
                             f"{params.calibration_items} and {params.calibration_tokens}")
        if params.protocol not in self.PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(self.PROTOCOLS)}, got {params.protocol!r}")
        self.config = None
        self.record: dict | None = None
        self.prior = None                # draft acceptance so far (DraftStats): the next decode's prior
        self.store = None                # autotune.AcceptanceStore the prior goes to

    def learn(self, generation: Generation) -> None:
        """The turn's draft acceptance joins the prior of the next first turn, and the store."""
        if self.prior is None or self.store is None or generation.stats is None:
            return
        self.prior.merge(generation.stats.drafts)
        self.store.add(generation.stats.drafts)

    def prepare(self, job) -> None:
        from experiments.decoders import autotune

        params = self.params
        items = job.calibration_items(params.calibration_items, params.calibration_offset)
        always = [d.config for d in job.settings.decoders
                  if params.predict and isinstance(d, CoreDecoder) and d.config is not None and d is not self]
        sampling = None if job.settings.sampling.greedy else job.settings.sampling
        path = job.auto_record_path(self.name)
        prompts = [job.prompt_ids(item, 0, ()) for item in items]
        limits = dataclasses.replace(job.limits, max_new_tokens=params.calibration_tokens)
        self.record, self.store, self.prior = autotune.prepare(
            job.lm, job.settings.model.name, job.settings.dataset.name, [item.item_id for item in items], prompts,
            limits, path, protocol=params.protocol, sampling=sampling, always=always, batch=job.settings.batch_size,
            recalibrate=params.recalibrate)
        self.consider_eagle(job, path, prompts, limits, sampling)
        self.config = autotune.chosen_config(self.record, seed=self.seed)
        if self.prior is None and self.config is not None:
            from lookahead_core import DraftStats

            self.prior = DraftStats()
        print(f"{self.name}: {autotune.describe(self.record, path)}")


    def consider_eagle(self, job, path: Path, prompts: list[list[int]], limits, sampling) -> None:
        """Protocol online, where an EAGLE drafter was trained for the job's model (``heads_dir``):
        price it on this device, try it on the calibration items ``prompts`` and let it join the
        tree if it pays there (``autotune.consider_eagle``); a resumed job whose record took it in
        loads it again."""
        from experiments.models.heads import heads_dir
        from experiments.decoders import autotune

        folder = heads_dir(job.settings.model.name, kind="eagle")
        if "eagle" in self.record:
            if self.record["eagle"]["used"] and "eagle" not in job.lm.drafters:
                from lookahead_core.eagle import load_drafter

                job.lm.drafters["eagle"] = load_drafter(self.record["eagle"]["drafter"], job.model)
        elif self.params.protocol == "online" and self.params.eagle and (folder / "config.json").is_file():
            self.record = autotune.consider_eagle(job.lm, self.record, folder, path, prompts, limits,
                                                  sampling=sampling, prior=self.prior)


# ---------------------------------------------------------------------------------------------
# transformers generate: greedy / sampling, prompt lookup, assisted, early exit


@register("hf")
class HFGenerate(Decoder):
    """``model.generate``: greedy at temperature 0, else sampling (the job's temperature)."""

    family = "hf"
    batched = True      # the assisted subclasses are not: transformers takes batch size 1 there

    def generate_kwargs(self, job) -> dict[str, Any]:
        return {}

    def generate(self, job, ids, state, limits, sampling) -> Generation:
        return self.generate_batch(job, [ids], limits, sampling)[0]

    def generate_batch(self, job, prompts, limits, sampling) -> list[Generation]:
        """``generate`` on the prompts left-padded with the job's pad id (a batch of one: no padding).
        Each row is cut after its first EOS; in a batch, a row without one loses the pad ids
        ``generate`` filled in once it had stopped (at a stop string)."""
        import torch

        model = job.model
        pad = job.pad_token_id
        width = max(map(len, prompts))
        x = torch.tensor([[pad] * (width - len(p)) + list(p) for p in prompts], device=model.device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=model.device)
        kwargs = self.generate_kwargs(job)
        if sampling.greedy:
            kwargs.update(do_sample=False)
        else:
            torch.manual_seed(sampling.seed)
            kwargs.update(do_sample=True, temperature=sampling.temperature, top_k=sampling.top_k or None,
                          top_p=sampling.top_p)
        if limits.stop_strings:
            kwargs.update(stop_strings=list(limits.stop_strings), tokenizer=job.tokenizer)
        out = model.generate(x, attention_mask=mask, max_new_tokens=limits.max_new_tokens,
                             eos_token_id=list(limits.eos_token_ids) or None, pad_token_id=pad, **kwargs)
        rows = out[:, width:].tolist()
        return [Generation(_finished_row(row, limits.eos_token_ids, pad, padded=len(rows) > 1)) for row in rows]


def _finished_row(row: list[int], eos: Sequence[int], pad: int, *, padded: bool) -> list[int]:
    """A ``generate`` row up to its first EOS (kept); without one and ``padded``, its trailing pad
    ids go (a model that itself ends on the pad id loses those too: pad ids are rarely sampled)."""
    for i, token in enumerate(row):
        if token in eos:
            return row[: i + 1]
    if padded:
        while row and row[-1] == pad:
            row = row[:-1]
    return row


@register("hf_pld")
class HFPromptLookup(HFGenerate):
    """transformers prompt lookup: ``generate(prompt_lookup_num_tokens=k)``."""

    batched = False

    @dataclass
    class Params:
        k: int = 10                       # prompt_lookup_num_tokens: tokens proposed per step
        max_matching_ngram: int = 2       # max_matching_ngram_size: longest n-gram matched

    def __init__(self, name: str, params: Any, seed: int = 0) -> None:
        super().__init__(name, params, seed)
        if params.k < 1 or params.max_matching_ngram < 1:
            raise ValueError(f"k and max_matching_ngram must be >= 1, got {params.k} and {params.max_matching_ngram}")

    def columns(self) -> dict[str, Any]:
        return {**super().columns(), "prompt_lookup": self.params.k}

    def generate_kwargs(self, job) -> dict[str, Any]:
        return {"prompt_lookup_num_tokens": self.params.k, "max_matching_ngram_size": self.params.max_matching_ngram}


@register("hf_assisted")
class HFAssisted(HFGenerate):
    """transformers assisted decoding with a draft model (``assistant_model``: any ``load_model``
    spec). When the draft's tokenizer differs from the target's, transformers' cross-tokenizer
    assisted decoding runs (``generate(tokenizer=..., assistant_tokenizer=...)``)."""

    batched = False

    @dataclass
    class Params:
        assistant_model: str = "smollm2_135m"   # offline name, tiny-<arch>, local folder or hub id
        num_assistant_tokens: int = 20          # draft tokens per step to start from
        schedule: str = "heuristic"             # num_assistant_tokens_schedule: heuristic, constant, heuristic_transient

    def __init__(self, name: str, params: Any, seed: int = 0) -> None:
        super().__init__(name, params, seed)
        schedules = ("heuristic", "constant", "heuristic_transient")
        if params.schedule not in schedules:
            raise ValueError(f"schedule must be one of {', '.join(schedules)}, got {params.schedule!r}")
        if params.num_assistant_tokens < 1:
            raise ValueError(f"num_assistant_tokens must be >= 1, got {params.num_assistant_tokens}")
        self.assistant = self.assistant_tokenizer = None

    def columns(self) -> dict[str, Any]:
        return {**super().columns(), "assistant": self.params.assistant_model}

    def prepare(self, job) -> None:
        self.assistant, self.assistant_tokenizer = job.load_assistant(self.params.assistant_model)

    def generate_kwargs(self, job) -> dict[str, Any]:
        self.assistant.generation_config.num_assistant_tokens = self.params.num_assistant_tokens
        self.assistant.generation_config.num_assistant_tokens_schedule = self.params.schedule
        kwargs: dict[str, Any] = {"assistant_model": self.assistant}
        if _different_tokenizers(job.tokenizer, self.assistant_tokenizer):
            kwargs.update(tokenizer=job.tokenizer, assistant_tokenizer=self.assistant_tokenizer)
        return kwargs


def _different_tokenizers(target: Any, draft: Any) -> bool:
    if target is None or draft is None or not hasattr(target, "get_vocab") or not hasattr(draft, "get_vocab"):
        return False
    return target.get_vocab() != draft.get_vocab()


@register("hf_early_exit")
class HFEarlyExit(HFGenerate):
    """transformers early-exit self-speculation: the first ``assistant_early_exit`` layers of the
    model draft, the whole model verifies (``generate(assistant_early_exit=k)``; models trained for
    it, e.g. LayerSkip, accept far more than others)."""

    batched = False

    @dataclass
    class Params:
        assistant_early_exit: int = 4     # layers that draft
        num_assistant_tokens: int = 20

    def __init__(self, name: str, params: Any, seed: int = 0) -> None:
        super().__init__(name, params, seed)
        if params.assistant_early_exit < 1:
            raise ValueError(f"assistant_early_exit must be >= 1, got {params.assistant_early_exit}")

    def columns(self) -> dict[str, Any]:
        return {**super().columns(), "assistant": f"early_exit_{self.params.assistant_early_exit}"}

    def prepare(self, job) -> None:
        layers = job.model.config.num_hidden_layers
        if self.params.assistant_early_exit >= layers:
            from experiments.config.errors import ConfigError
            raise ConfigError(f"decoding.assistant_early_exit must be < the model's {layers} layers, "
                              f"got {self.params.assistant_early_exit}")

    def generate_kwargs(self, job) -> dict[str, Any]:
        return {"assistant_early_exit": self.params.assistant_early_exit,
                "num_assistant_tokens": self.params.num_assistant_tokens}


@register("hf_custom")
class HFCustomGenerate(HFGenerate):
    """transformers' ``generate`` running this project's decoder from the repository's ``hub/``
    folder (``generate(custom_generate=<repo>/hub, trust_remote_code=True, lookahead=<config>)``):
    what a user of ``custom_generate`` gets, measured beside ``decode()`` of the same config (a
    ``core`` decoder with the same keys). Its keys are the core decoders' (``lookahead: false``:
    the loop without drafts); each call pays what a user's does, transformers loading the folder
    included."""

    Params = _core_params()

    def __init__(self, name: str, params: Any, seed: int = 0) -> None:
        super().__init__(name, params, seed)
        self.config = lookahead_config(params, seed)    # validates (ValueError names the field)
        for key in ("heads", "drafter"):
            if getattr(params, key):
                raise ValueError(f"{key}: trained drafters are not loaded through custom_generate; use a core decoder")
        self._stats: list = []

    def columns(self) -> dict[str, Any]:
        return core_columns(self.config)

    def generate_kwargs(self, job) -> dict[str, Any]:
        from experiments.data.datasets import repo_root

        return {"custom_generate": str(repo_root() / "hub"), "trust_remote_code": True,
                "lookahead": self.config or "greedy", "lookahead_stats": self._stats}

    def generate_batch(self, job, prompts, limits, sampling) -> list[Generation]:
        self._stats.clear()
        generations = super().generate_batch(job, prompts, limits, sampling)
        return [dataclasses.replace(g, stats=s) for g, s in zip(generations, self._stats, strict=True)]

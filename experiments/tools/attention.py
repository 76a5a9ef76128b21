"""Per-step latency against tokens fed under eager, SDPA and flex_attention: what the attention
implementation costs one step on this device.

    python -m experiments.tools.attention model=smollm2_135m 'kv=[512,2048]' threads=1 out=results/attention
    python -m experiments.tools.attention out=results/attention report_only=true      # the tables and plot again

Configured by ``conf/attention.yaml`` (the ``model`` group of ``run.py`` and this tool's keys, typed
by :class:`AttentionConfig`); a bad key or value fails in one line naming it, before torch loads.

Method. The three implementations load the same weights (one model each). For each KV length,
each builds a cache of that many random tokens once. A step of k tokens is fed in two shapes, the
cache cut back after each:

* ``chain``: a causal chain (greedy, one-candidate steps); eager and SDPA let the model build its
  causal mask (SDPA's unmasked kernel), flex gets the core's chain ``BlockMask``;
* ``tree``: a branching token tree of k - 1 nodes under the input token (a fixed random tree),
  the core's dense float mask under eager and SDPA, its ``BlockMask`` under flex; the logits of
  the rows a tree step keeps.

Flex compiles first: every (KV, k, shape) once, untimed; that time is reported as
``compile_s``. Then ``rounds`` rounds: in each, every (KV, k, shape) visits the three
implementations in an order rotated per round, so none always runs first. ``rows.csv`` has every
timed forward; the tables give the median over rounds (and its ratio to SDPA) per size. Rounds
already in ``rows.csv`` are kept and a rerun adds the missing ones. A round in which flex ran
torch's uncompiled fallback (past the recompile limit) is not written: the run stops.
"""

from __future__ import annotations

import json
import os
import random
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import pandas as pd
from hydra.core.config_store import ConfigStore
from matplotlib.figure import Figure
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from experiments.config.schema import ModelConfig
from experiments.config.settings import check_packages
from experiments.data.datasets import repo_root
from experiments.reporting.tables import markdown
from experiments.tools import app

IMPLEMENTATIONS = ("eager", "sdpa", "flex_attention")
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SHAPES = ("chain", "tree")


@dataclass
class AttentionConfig:
    """``conf/attention.yaml``: the model (``model``, the harness's group) and what is timed."""

    model: ModelConfig = field(default_factory=ModelConfig)
    kv: list[int] = field(default_factory=lambda: [512, 2048])   # KV cache lengths
    sizes: list[int] = field(default_factory=lambda: list(SIZES))  # tokens fed per step (k)
    rounds: int = 5
    threads: int = 1
    out: str = "results/attention"         # rows.csv, meta.json, summary.md, latency.png; .hydra/ (the config)
    report_only: bool = False              # only rewrite summary.md and latency.png from ``out``


ConfigStore.instance().store(name="attention_schema", node=AttentionConfig)


def check(cfg: DictConfig) -> AttentionConfig:
    """The composed config as an :class:`AttentionConfig`; a value out of range (or a model whose
    packages are missing) is a ConfigError naming its key."""
    s = OmegaConf.to_object(cfg)
    app.positive_lists(s, "kv", "sizes")
    app.at_least_one(s, "rounds", "threads")
    app.one_kernel(s.model)
    if not s.report_only:
        check_packages(s.model)
    return s


def tree_parents(nodes: int, seed: int = 0) -> tuple[int, ...]:
    """A fixed random tree of ``nodes`` nodes (each node's parent an earlier node or the input token)."""
    rng = random.Random(seed)
    return tuple(rng.randrange(max(-1, i - 8), i) for i in range(nodes))


class Bench:
    """One implementation's model and its caches per KV length."""

    def __init__(self, model, kv_lengths: Sequence[int], seed: int = 0) -> None:
        import torch
        from lookahead_core.layout import causal_layout
        from lookahead_core.model_io import CausalLM

        self.lm = CausalLM(model)
        vocab = model.config.vocab_size
        gen = torch.Generator().manual_seed(seed)
        self.caches = {}
        with torch.inference_mode():
            for kv in kv_lengths:
                cache = self.lm.new_cache()
                prefix = torch.randint(0, vocab, (kv,), generator=gen).tolist()
                offsets, _ = causal_layout(kv)
                self.lm.forward(cache, prefix, offsets, None, 0, torch.tensor([kv - 1]))
                self.caches[kv] = cache
        self.tokens = torch.randint(0, vocab, (max(SIZES),), generator=gen).tolist()

    def step(self, kv: int, k: int, shape: str) -> float:
        import torch
        from lookahead_core.layout import step_layout
        from lookahead_core.model_io import truncate_kv

        with torch.inference_mode():
            cache = self.caches[kv]
            if shape == "chain":
                offsets, visible, rows = torch.arange(k), None, torch.tensor([k - 1])
            else:
                layout = step_layout(0, 0, tree_parents(k - 1))
                offsets, visible, rows = layout.offsets, layout.visible, layout.logit_rows
            start = time.perf_counter()
            self.lm.forward(cache, self.tokens[:k], offsets, visible, kv, rows)
            seconds = time.perf_counter() - start
            truncate_kv(cache, kv)
        return seconds


def measure(s: AttentionConfig, out: Path) -> None:
    """Time every cell; refuses to record flex timings of torch's uncompiled fallback."""
    import torch
    from lookahead_core.flex import FALLBACK_WARNING, rearm_fallback_warning

    torch.set_num_threads(s.threads)
    torch._dynamo.reset()                         # compile this run's kernels within the recompile limit
    rearm_fallback_warning()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def check_compiled() -> None:
            if any(FALLBACK_WARNING in str(w.message) for w in caught):
                raise RuntimeError("flex_attention ran uncompiled (torch's recompile limit): its timings would "
                                   "not be the kernel's; nothing of this round was written")

        _measure(s, out, check_compiled)


def _measure(s: AttentionConfig, out: Path, check_compiled) -> None:
    import torch
    import transformers

    from experiments.rows.provenance import git_commit
    from lookahead_core.capability import device_name
    from experiments.models import loader as model_loader

    path = out / "rows.csv"
    done = pd.read_csv(path) if path.exists() else pd.DataFrame(columns=["round"])
    rounds = [r for r in range(s.rounds) if r not in set(done["round"])]
    if not rounds:
        print(f"{path}: all {s.rounds} rounds measured")
        return
    model_config = s.model
    benches = {}
    for attention in IMPLEMENTATIONS:
        model, _ = model_loader.load_model(model_config.spec, dtype=model_config.dtype.value, attn_implementation=attention,
                                           cache_dir=model_config.cache_dir, linear=model_config.linear.value)
        benches[attention] = Bench(model, s.kv)
    cells = [(kv, k, shape) for kv in s.kv for k in s.sizes for shape in SHAPES]
    started = time.perf_counter()
    for kv, k, shape in tqdm(cells, desc="flex_attention compile (untimed)"):
        benches["flex_attention"].step(kv, k, shape)
    compile_s = time.perf_counter() - started
    for attention in ("eager", "sdpa"):                               # their one-off costs, untimed
        for kv, k, shape in cells:
            benches[attention].step(kv, k, shape)
    meta_path = out / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    meta.setdefault("compile_s", []).append(round(compile_s, 1))
    meta.update(model=model_config.name, dtype=model_config.dtype.value, threads=s.threads, kv=list(s.kv),
                sizes=list(s.sizes), cpu=device_name("cpu"), avx512=_avx512(), torch=torch.__version__,
                transformers=transformers.__version__, git_commit=git_commit(repo_root()),
                date=time.strftime("%Y-%m-%d"))
    meta_path.write_text(json.dumps(meta, indent=1) + "\n")
    progress = tqdm(total=len(rounds) * len(cells) * len(IMPLEMENTATIONS), desc="timed forwards")
    for r in rounds:
        rows = []
        order = list(IMPLEMENTATIONS)
        for index, (kv, k, shape) in enumerate(cells):
            shift = (r + index) % len(order)
            for attention in order[shift:] + order[:shift]:
                rows.append({"round": r, "attention": attention, "kv": kv, "k": k, "shape": shape,
                             "seconds": benches[attention].step(kv, k, shape), "load_avg": os.getloadavg()[0]})
                progress.update()
        check_compiled()
        pd.DataFrame(rows).to_csv(path, mode="a", header=not path.exists(), index=False)   # a round at a time
    progress.close()


def _avx512() -> bool:
    try:
        return "avx512f" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def tables(rows: pd.DataFrame) -> pd.DataFrame:
    """Median ms per (kv, shape, k) and implementation, with each one's ratio to SDPA."""
    median = rows.groupby(["kv", "shape", "k", "attention"])["seconds"].median().unstack("attention") * 1e3
    out = median.reindex(columns=list(IMPLEMENTATIONS)).round(2)
    for attention in ("eager", "flex_attention"):
        out[f"{attention}/sdpa"] = (median[attention] / median["sdpa"]).round(2)
    return out.reset_index()


def report(out: Path) -> str:
    rows = pd.read_csv(out / "rows.csv")
    meta = json.loads((out / "meta.json").read_text())
    table = tables(rows)
    dtype = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}.get(meta.get("dtype", "float32"), meta.get("dtype"))
    parts = [f"Model {meta['model']}, {dtype}, {meta['threads']} thread(s), {meta['cpu']} (AVX-512: {meta['avx512']}), "
             f"torch {meta['torch']}, transformers {meta['transformers']}, commit {meta['git_commit'][:7]}, "
             f"{meta['date']}. {rows['round'].nunique()} rounds, median ms per forward; flex compile "
             f"{', '.join(f'{c:.0f}' for c in meta['compile_s'])} s (per process, untimed)."]
    for (kv, shape), group in table.groupby(["kv", "shape"]):
        parts.append(f"### KV {kv}, {shape} steps\n\n" + markdown(group.drop(columns=["kv", "shape"])))
    text = "\n\n".join(parts) + "\n"
    (out / "summary.md").write_text(text)
    plot(table, out / "latency.png")
    return text


def plot(table: pd.DataFrame, path: Path) -> None:
    kvs = sorted(table["kv"].unique())
    fig = Figure(figsize=(5 * len(kvs), 4))
    for i, kv in enumerate(kvs):
        ax = fig.add_subplot(1, len(kvs), i + 1)
        for shape, style in zip(SHAPES, ("--", "-")):
            part = table[(table["kv"] == kv) & (table["shape"] == shape)]
            for attention, color in zip(IMPLEMENTATIONS, ("tab:gray", "tab:blue", "tab:orange")):
                ax.plot(part["k"], part[attention], style, color=color, marker="o", markersize=3,
                        label=f"{attention} ({shape})")
        ax.set(xscale="log", yscale="log", xlabel="tokens fed per step (k)", ylabel="ms per forward",
               title=f"KV {kv}")
        ax.grid(True, which="both", alpha=0.3)
    fig.axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def run(s: AttentionConfig) -> str:
    """Measure what ``out`` lacks (unless ``report_only``), then write and return the report."""
    out = Path(s.out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    if not s.report_only:
        measure(s, out)
    return report(out)


@hydra.main(config_path=str(repo_root() / "conf"), config_name="attention", version_base="1.3")
def main(cfg: DictConfig) -> None:
    print(run(app.checked(cfg, check)))


if __name__ == "__main__":
    app.launch("attention", main, check)

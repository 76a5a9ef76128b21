"""Where a core decode step's host-side time goes.

    python -m experiments.tools.profile model=smollm2_135m out=results/lineup/profile_smollm2
    python -m experiments.tools.profile model=smollm2_135m experiment=humaneval \\
        'decoders=[greedy,{use:lookahead,name:la_N5W7G7,window:7,ngram:5,guess:7}]' out=results/lineup/profile

Configured by ``conf/profile.yaml``: run.py's groups and keys (the job the profile measures, planned
and checked as run.py plans it: a bad key fails in one line before torch loads) plus ``out``. Each core
decoder of the job (the lineup's, ``suite=paper`` by default) decodes the first turns of its items
through the job's own timed path (``Job.timed``, the path every row is measured on) for unprofiled
per-step totals, then again under cProfile; the profile's cumulative times are grouped into
categories of the core's work that do not nest, as shares of the decode loop (a full decode minus a
one-token decode). Writes ``profile.csv``, ``profile.md`` and ``profile_top_functions.md`` to ``out``.
"""

from __future__ import annotations

import cProfile
import inspect
import io
import pstats
from dataclasses import dataclass, replace
from pathlib import Path

import hydra
import pandas as pd
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig

from experiments.config.schema import RunConfig, register_configs
from experiments.config.settings import chosen_decoders, plan
from experiments.data.datasets import repo_root
from experiments.reporting.tables import markdown
from experiments.tools import app


@dataclass
class ProfileConfig(RunConfig):
    """``conf/profile.yaml``: a run.py job (:class:`RunConfig`) and the folder its profile goes to."""

    out: str = MISSING


register_configs()
ConfigStore.instance().store(name="profile_schema", node=ProfileConfig)


# Functions of the core whose cumulative time is reported, in categories that do not nest.
PROFILE_CATEGORIES: dict[str, tuple[tuple[str, str], ...]] = {
    "attention mask (layout.attention_mask)": (("layout.py", "attention_mask"),),
    "step layout (lru-cached)": (("layout.py", "step_layout"),),
    "pool candidates lookup": (("pool.py", "tagged"),),
    "tree build / prune / node scores": (("layout.py", "build_tree"), ("layout.py", "prune_tree"), ("drafts.py", "scores")),
    "draft acceptance bookkeeping": (("drafts.py", "record"),),
    "pool insert (window n-grams + prompt pool)": (("pool.py", "add_all"), ("pool.py", "add_from_sequence")),
    "window update / tokens": (("window.py", "update"), ("window.py", "tokens")),
    "verify (tree walk)": (("verify.py", "walk_tree"),),
    "KV commit (commit_kv)": (("model_io.py", "commit_kv"),),
    "accept / stop checks": (("decoder.py", "_accept"),),
}


def profile_breakdown(stats: pstats.Stats, model) -> dict[str, float]:
    """Seconds per category in one profile; 'model forward' is the model class's own forward."""
    forward = inspect.unwrap(type(model).forward).__code__
    table = stats.stats  # (file, line, name) -> (cc, nc, tt, ct, callers)

    def cumulative(file: str, name: str) -> float:
        return sum(v[3] for (f, _, n), v in table.items() if f.endswith(file) and n == name and "lookahead_core" in f)

    out = {"model forward": sum(v[3] for (f, line, n), v in table.items() if (f, line, n) == (
        forward.co_filename, forward.co_firstlineno, forward.co_name))}
    out["CausalLM.forward glue (input tensors, .to(device))"] = (
        cumulative("model_io.py", "forward") - out["model forward"] - cumulative("layout.py", "attention_mask"))
    for category, functions in PROFILE_CATEGORIES.items():
        out[category] = sum(cumulative(f, n) for f, n in functions)
    out["decode (total)"] = cumulative("decoder.py", "decode")
    return out


def loop_breakdown(full: dict[str, float], prefill_only: dict[str, float]) -> dict[str, float]:
    """The decode loop's share of each category: a full decode minus a decode of one token
    (prefill and first token only); 'other loop work' is what no category covers."""
    loop = {k: full[k] - prefill_only.get(k, 0.0) for k in full}
    total = loop.pop("decode (total)")
    loop["other loop work"] = total - sum(loop.values())
    return {k: v / total for k, v in loop.items()}


def profile(planned, out: str | Path) -> Path:
    """Host-side time per step of each core decoder of the planned job (``plan``'s settings,
    adapter and items): unprofiled totals through the job's own timed path (``Job.timed``, after
    its warm-up), then a cProfile breakdown; the tables go to ``out``."""
    import torch

    from experiments.decoders.registry import CoreDecoder
    from experiments.job.runner import Job, placed

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings, adapter, items = planned
    job = Job.start(placed(settings), adapter, items)
    job.meter.close()     # the core's own step record and cProfile time this view, not the hooks
    prompts = [job.prompt_ids(item, 0, ()) for item in items]
    limits = replace(job.limits, stop_strings=())
    decoders = [d for d in settings.decoders if type(d) is CoreDecoder]
    job.warm_up(items[:1])
    rows, raw = [], []
    for decoder in decoders:
        steps = decode_s = model_s = 0.0
        for ids in prompts:
            stats = job.timed(decoder, [ids], limits=limits)[0].output.stats
            steps += stats.steps
            decode_s += stats.decode_seconds
            model_s += stats.model_seconds
        profiles = []
        for limit in (limits, replace(limits, max_new_tokens=1)):
            profiler = cProfile.Profile()
            for ids in prompts:
                profiler.runcall(job.timed, decoder, [ids], limits=limit)
            profiles.append(profiler)
        shares = loop_breakdown(*(profile_breakdown(pstats.Stats(p), job.model) for p in profiles))
        row = {"decoder": decoder.name, "steps": int(steps), "ms_per_step": 1e3 * decode_s / steps,
               "host_ms_per_step": 1e3 * (decode_s - model_s) / steps, "overhead_frac": 1 - model_s / decode_s}
        row.update({f"{k} [% of loop, profiled]": 100 * v for k, v in shares.items()})
        rows.append(row)
        text = io.StringIO()
        pstats.Stats(profiles[0], stream=text).sort_stats("tottime").print_stats(25)
        raw.append(f"## {decoder.name}\n\n```\n{text.getvalue()}\n```")
    table = pd.DataFrame(rows)
    table.to_csv(out / "profile.csv", index=False)
    transposed = table.set_index("decoder").T
    note = (f"{settings.model.name}, {len(prompts)} prompt(s) of {settings.dataset.name}, "
            f"{settings.limits.max_new_tokens} new tokens, {torch.get_num_threads()} thread(s). ms_per_step, "
            "host_ms_per_step and overhead_frac come from unprofiled runs (host = outside CausalLM.forward, so "
            "mask building counts as model time there); the percentages are shares of the decode loop under "
            "cProfile, which inflates Python-heavy parts.")
    md = f"# Host-side profile\n\n{note}\n\n" + markdown(transposed.reset_index(), floatfmt=".2f") + "\n"
    (out / "profile.md").write_text(md, encoding="utf-8")
    (out / "profile_top_functions.md").write_text("\n\n".join(raw) + "\n", encoding="utf-8")
    print(md)
    return out / "profile.md"


@hydra.main(config_path=str(repo_root() / "conf"), config_name="profile", version_base="1.3")
def main(cfg: DictConfig) -> None:
    cfg = app.checked(cfg, lambda c: chosen_decoders(c, HydraConfig.get().overrides.task))   # decoding=X profiles X
    profile(app.checked(cfg, plan), cfg.out)


if __name__ == "__main__":
    app.launch("profile", main, plan)

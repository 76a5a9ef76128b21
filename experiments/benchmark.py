"""Every decoder on the same prompts, in one process, interleaved: who is fastest on this device?

    python -m experiments.benchmark --model smollm2_135m --dataset mtbench --limit 20 \\
        --max-new-tokens 128 --configs 5,15,15 5,7,7 4,5,5 3,4,4 --pool both --threads 1 \\
        --auto --predict --out results/benchmark/smollm2_mtbench
    python -m experiments.benchmark report --out results/benchmark/smollm2_mtbench
    python -m experiments.benchmark profile --model smollm2_135m --configs 5,7,7 --out results/benchmark/profile

Decoders (``--configs`` are N,W,G triples, the paper's n-gram size, window and guess set size):

* ``hf_greedy``: transformers ``generate(do_sample=False)``, the reference everything is timed against;
* ``hf_pld_k<k>``: transformers prompt lookup, ``generate(prompt_lookup_num_tokens=k)``;
* ``core_greedy``: this project's decode loop without lookahead;
* ``la_N<N>W<W>G<G>`` and ``..._pool``: lookahead, without / with the prompt pool (``--pool``);
* ``pool_N<N>G<G>``: pool-only decoding (no Jacobi window, ``--pool-only N,G``);
* any other core config, e.g. token trees, from ``--core`` specs of ``LookaheadConfig`` fields
  (``--core ngram=5,window=7,guess=7,prompt_pool=1,tree=1``), named by ``cost_model.config_label``
  (``la_N5W7G7_pool_tree``);
* ``auto``: the config :func:`lookahead_core.cost_model.choose_config` picks on calibration prompts
  that are not benchmark prompts (``--auto``).

Method. The model is loaded once. After an untimed warm-up of every decoder, each prompt is decoded
by every decoder back to back, in an order rotated by one per prompt, ``--repeats`` times (median).
Timing: the wall clock of the whole call, minus the duration of its first model forward (the
prefill), which forward hooks measure for every decoder alike (``generate`` cannot report its
prefill). So ``decode_s`` = everything after the prefill, including ``generate``'s or the core's
own host work, and ``wall_s`` (end to end) is kept too. The same hooks count forwards (steps =
forwards - 1) and time the model, so ``overhead_frac`` = share of ``decode_s`` outside the model,
measured the same way for every decoder. One CSV row per prompt per decoder is appended as soon as
a prompt finishes; a rerun of the same command resumes. Aggregation is in :func:`summarize`.
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import dataclasses
import inspect
import io
import json
import os
import pstats
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import transformers
from matplotlib.figure import Figure
from tqdm import tqdm

from lookahead_core import DecodeLimits, LookaheadConfig, decode
from lookahead_core import cost_model as cm
from lookahead_core import models as model_loader

from . import autotune
from .datasets import Item, get_dataset
from .tiny_tokenizer import ByteTokenizer

COLUMNS: tuple[str, ...] = (
    # what ran
    "model", "dataset", "item_id", "decoder", "family", "N", "W", "G", "prompt_pool", "pool_only",
    "prompt_lookup", "threads", "max_new_tokens", "repeats", "order", "load_avg", "torch", "transformers",
    # how it went
    "prompt_tokens", "new_tokens", "forwards", "steps", "S", "accepted_hist", "step_tokens_mean",
    "step_tokens_hist", "wall_s", "prefill_s", "decode_s", "tokens_per_s", "model_s", "overhead_frac",
    "core_decode_s", "core_model_s", "core_overhead_frac",
    # what came out
    "matches_hf_greedy", "matches_core_greedy",
    # token trees: the core config's fields (JSON) and acceptance per draft source and depth (JSON rows)
    "lookahead", "draft_acceptance",
)  # fmt: skip

HF_GREEDY, CORE_GREEDY = "hf_greedy", "core_greedy"
PAIR = ["dataset", "item_id"]
WARMUP_TOKENS = 16


# ---------------------------------------------------------------------------------------------
# Decoders


@dataclass(frozen=True)
class Decoder:
    """One way to generate. ``family`` "hf" runs ``model.generate``; "core" runs ``decode``."""

    name: str
    family: str
    lookahead: LookaheadConfig | None = None
    prompt_lookup: int = 0


def parse_ints(text: str, count: int) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != count:
        raise argparse.ArgumentTypeError(f"expected {count} comma-separated integers, got {text!r}")
    return values


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def parse_core(text: str) -> LookaheadConfig:
    """``ngram=5,window=7,guess=7,prompt_pool=1,tree=1`` -> that LookaheadConfig (bools as 0/1)."""
    fields = {f.name: f.type for f in dataclasses.fields(LookaheadConfig)}
    kwargs: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key not in fields or not value:
            raise argparse.ArgumentTypeError(f"{part!r}: expected key=value with key in {sorted(fields)}")
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: the value must be an integer (bools as 0/1)") from None
        kwargs[key] = bool(number) if fields[key] in ("bool", bool) else number
    try:
        return LookaheadConfig(**kwargs)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None


def core_decoders(configs: Sequence[tuple[int, int, int]], pool: str,
                  pool_only: Sequence[tuple[int, int]], extra: Sequence[LookaheadConfig] = ()) -> list[Decoder]:
    """``configs`` (N, W, G) with the prompt pool off/on/both, then pool-only (N, G) configs, then
    ``extra`` configs (``--core``)."""
    pools = {"off": (False,), "on": (True,), "both": (False, True)}[pool]
    decoders = []
    for n, w, g in configs:
        for with_pool in pools:
            config = LookaheadConfig(window=w, ngram=n, guess=g, prompt_pool=with_pool)
            decoders.append(Decoder(cm.config_label(config), "core", config))
    for n, g in pool_only:
        config = LookaheadConfig(window=1, ngram=n, guess=g, pool_only=True)
        decoders.append(Decoder(cm.config_label(config), "core", config))
    decoders += [Decoder(cm.config_label(config), "core", config) for config in extra]
    return decoders


def build_decoders(configs, pool, pool_only, prompt_lookup, auto: LookaheadConfig | None | bool = False,
                   extra: Sequence[LookaheadConfig] = ()) -> list[Decoder]:
    """The baselines, then the core's configs, then ``auto`` (when ``auto`` is not False)."""
    decoders = [Decoder(HF_GREEDY, "hf")]
    decoders += [Decoder(f"hf_pld_k{k}", "hf", prompt_lookup=k) for k in prompt_lookup]
    decoders += [Decoder(CORE_GREEDY, "core")]
    decoders += core_decoders(configs, pool, pool_only, extra)
    if auto is not False:
        decoders.append(Decoder("auto", "core", auto))
    names = [d.name for d in decoders]
    duplicates = sorted(n for n, c in Counter(names).items() if c > 1)
    if duplicates:
        raise ValueError(f"decoders given twice: {duplicates}")
    return decoders


# ---------------------------------------------------------------------------------------------
# Prompts


@dataclass
class Session:
    model: Any
    tokenizer: Any
    model_name: str
    eos: tuple[int, ...]
    pad: int | None

    @classmethod
    def load(cls, spec: str, dtype: str = "float32", device: str = "cpu") -> Session:
        model, tokenizer = model_loader.load_model(spec, dtype=dtype, device=device)
        if tokenizer is None:                          # tiny random models ship none
            tokenizer = ByteTokenizer(model.config.vocab_size)
        eos: list[int] = []
        for source in (getattr(tokenizer, "eos_token_id", None), model.generation_config.eos_token_id):
            eos += [source] if isinstance(source, int) else list(source or [])
        eos = list(dict.fromkeys(eos))
        pad = model.generation_config.pad_token_id
        pad = pad if pad is not None else (eos[0] if eos else 0)
        return cls(model, tokenizer, spec, tuple(eos), pad)

    def prompt_ids(self, dataset, item: Item) -> list[int]:
        """The first turn: the chat template (or a plain transcript) for chat sets, else the raw prompt."""
        if dataset.format == "raw" and item.prompt is not None:
            return list(self.tokenizer.encode(dataset.raw_prompt(item)))
        messages = dataset.build_messages(item, 0)
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        transcript = "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages)
        return list(self.tokenizer.encode(transcript + "\n\nAssistant:"))


# ---------------------------------------------------------------------------------------------
# Timing


class ForwardMeter:
    """Forward hooks on the model: how many forwards a call made and how long each took."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.durations: list[float] = []
        self._start = 0.0
        self._sync = model.device.type == "cuda"
        self._handles = [model.register_forward_pre_hook(self._before), model.register_forward_hook(self._after)]

    def _before(self, module, args) -> None:
        if self._sync:
            torch.cuda.synchronize()
        self._start = time.perf_counter()

    def _after(self, module, args, output) -> None:
        if self._sync:
            torch.cuda.synchronize()
        self.durations.append(time.perf_counter() - self._start)

    def reset(self) -> None:
        self.durations = []

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


@dataclass
class Timed:
    tokens: list[int]
    wall_s: float
    prefill_s: float
    model_s: float            # the model's forwards after the prefill
    forwards: int
    stats: Any = None         # DecodeStats for the core


def run_decoder(session: Session, meter: ForwardMeter, decoder: Decoder, ids: list[int], max_new_tokens: int) -> Timed:
    model = session.model
    meter.reset()
    if decoder.family == "hf":
        x = torch.tensor([ids], device=model.device)
        extra = {"prompt_lookup_num_tokens": decoder.prompt_lookup} if decoder.prompt_lookup else {}
        _sync(model)
        start = time.perf_counter()
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=max_new_tokens,
                             eos_token_id=list(session.eos) or None, pad_token_id=session.pad, **extra)
        _sync(model)
        wall = time.perf_counter() - start
        tokens, stats = out[0, len(ids):].tolist(), None
    else:
        limits = DecodeLimits(max_new_tokens=max_new_tokens, eos_token_ids=session.eos)
        start = time.perf_counter()
        result = decode(model, ids, decoder.lookahead, limits)
        wall = time.perf_counter() - start
        tokens, stats = result.tokens, result.stats
    durations = meter.durations
    return Timed(tokens, wall, durations[0] if durations else 0.0, sum(durations[1:]), len(durations), stats)


def _sync(model) -> None:
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)


def rotated(decoders: Sequence[Decoder], index: int) -> list[Decoder]:
    shift = index % len(decoders)
    return list(decoders[shift:]) + list(decoders[:shift])


def run_prompt(session: Session, meter: ForwardMeter, decoders: Sequence[Decoder], ids: list[int],
               index: int, max_new_tokens: int, repeats: int, bar: tqdm | None = None) -> dict[str, Timed]:
    """Every decoder on one prompt, in rotated order, ``repeats`` times; the median-wall run each."""
    runs: dict[str, list[Timed]] = {d.name: [] for d in decoders}
    for _ in range(repeats):
        for decoder in rotated(decoders, index):
            if bar is not None:
                bar.set_postfix_str(decoder.name)
            runs[decoder.name].append(run_decoder(session, meter, decoder, ids, max_new_tokens))
            if bar is not None:
                bar.update(1)
    return {name: sorted(timed, key=lambda t: t.wall_s - t.prefill_s)[len(timed) // 2] for name, timed in runs.items()}


def make_rows(session: Session, dataset_name: str, item_id: str, decoders: Sequence[Decoder],
              results: dict[str, Timed], ids: list[int], index: int, settings: dict) -> list[dict]:
    reference = {name: results[name].tokens for name in (HF_GREEDY, CORE_GREEDY) if name in results}
    order = {d.name: position for position, d in enumerate(rotated(decoders, index))}
    rows = []
    for decoder in decoders:
        timed = results[decoder.name]
        config = decoder.lookahead
        stats = timed.stats
        new = len(timed.tokens)
        steps = max(timed.forwards - 1, 0)
        decode_s = timed.wall_s - timed.prefill_s
        row = {
            **settings,
            "model": session.model_name, "dataset": dataset_name, "item_id": item_id,
            "decoder": decoder.name, "family": decoder.family,
            "N": None if config is None else config.ngram,
            "W": None if config is None or config.pool_only else config.window,
            "G": None if config is None else config.guess,
            "prompt_pool": None if config is None else config.prompt_pool,
            "pool_only": None if config is None else config.pool_only,
            "prompt_lookup": decoder.prompt_lookup or None,
            "order": order[decoder.name], "load_avg": round(os.getloadavg()[0], 2),
            "prompt_tokens": len(ids), "new_tokens": new, "forwards": timed.forwards, "steps": steps,
            "S": stats.compression if stats is not None else ((new - 1) / steps if steps else 1.0),
            "wall_s": timed.wall_s, "prefill_s": timed.prefill_s, "decode_s": decode_s,
            "tokens_per_s": new / decode_s if decode_s > 0 else None,
            "model_s": timed.model_s,
            "overhead_frac": 1.0 - timed.model_s / decode_s if decode_s > 0 else None,
            "matches_hf_greedy": timed.tokens == reference[HF_GREEDY] if HF_GREEDY in reference else None,
            "matches_core_greedy": timed.tokens == reference[CORE_GREEDY] if CORE_GREEDY in reference else None,
        }
        if stats is not None:
            row.update(
                accepted_hist=json.dumps(stats.accepted_histogram),
                step_tokens_mean=statistics.fmean(stats.step_tokens) if stats.step_tokens else None,
                step_tokens_hist=json.dumps(dict(sorted(Counter(stats.step_tokens).items()))),
                core_decode_s=stats.decode_seconds, core_model_s=stats.model_seconds,
                core_overhead_frac=stats.overhead_fraction,
                draft_acceptance=json.dumps(stats.drafts.table()),
            )
        if config is not None:
            row["lookahead"] = json.dumps({k: v for k, v in dataclasses.asdict(config).items() if k != "seed"})
        rows.append(row)
    return rows


# ---------------------------------------------------------------------------------------------
# The results file


class RowStore:
    """``rows.csv``: prompts with a row for every decoder are finished; other rows are dropped."""

    def __init__(self, path: Path, decoder_names: Sequence[str]) -> None:
        self.path = path
        self.stale_header = False
        rows = self._read() if path.exists() else []
        names = set(decoder_names)
        by_item: dict[str, set[str]] = {}
        for row in rows:
            by_item.setdefault(row["item_id"], set()).add(row["decoder"])
        self.finished = {item for item, seen in by_item.items() if names <= seen}
        kept = [row for row in rows if row["item_id"] in self.finished]
        if not path.exists() or len(kept) != len(rows) or self.stale_header:
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".csv.partial")
            partial.write_text(_render(kept, header=True), encoding="utf-8")
            os.replace(partial, path)

    def _read(self) -> list[dict[str, str]]:
        text = self.path.read_text(encoding="utf-8")
        records = list(csv.reader(io.StringIO(text)))
        if not records:
            return []
        header = tuple(records[0])
        if header != COLUMNS[:len(header)]:
            raise RuntimeError(f"{self.path} has other columns; move it away to start afresh")
        self.stale_header = header != COLUMNS          # an older file: rewritten with the new columns
        body = records[1:-1] if text and not text.endswith("\n") else records[1:]   # a torn last row
        return [dict(zip(header, record)) for record in body]

    def append(self, rows: list[dict]) -> None:
        with open(self.path, "a", encoding="utf-8", newline="") as handle:
            handle.write(_render(rows))
            handle.flush()
            os.fsync(handle.fileno())


def _render(rows: list[dict], header: bool = False) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, extrasaction="raise", restval="")
    if header:
        writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def load_rows(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, dtype={"item_id": str})
    for column in ("prompt_pool", "pool_only", "matches_hf_greedy", "matches_core_greedy"):
        df[column] = df[column].map({True: True, False: False, "True": True, "False": False}).astype("boolean")
    return df


# ---------------------------------------------------------------------------------------------
# Aggregation


def _iqr(values: pd.Series) -> tuple[float, float]:
    return float(values.quantile(0.25)), float(values.quantile(0.75))


def summarize(df: pd.DataFrame, baseline: str = HF_GREEDY) -> pd.DataFrame:
    """One row per decoder: tokens/s median and IQR over prompts, S, speedups, overhead, match rates.

    Speedups pair each prompt with the baseline's row of the same prompt: ``speedup_median`` is
    the median of per-prompt ratios of ``decode_s``, ``speedup_sum`` the ratio of summed
    ``decode_s`` (long answers weigh in proportion to their cost), ``speedup_e2e`` the same with
    the prefill included, ``speedup_vs_core`` the ratio of sums against ``core_greedy``'s loop.
    """
    base = df[df["decoder"] == baseline][[*PAIR, "decode_s", "wall_s"]]
    core = df[df["decoder"] == CORE_GREEDY][[*PAIR, "core_decode_s"]]
    out = []
    for name, group in df.groupby("decoder", sort=False):
        paired = group.merge(base, on=PAIR, suffixes=("", "_base"))
        first = group.iloc[0]
        q1, q3 = _iqr(group["tokens_per_s"])
        row = {
            "decoder": name, "config": cm.config_label(_config_from_row(first)) if first["family"] == "core" else "",
            "N": first["N"], "W": first["W"], "G": first["G"],
            "prompts": len(group), "new_tokens": group["new_tokens"].mean(),
            "tokens_per_step": group["step_tokens_mean"].mean() if group["step_tokens_mean"].notna().any() else None,
            "S": group["new_tokens"].sub(1).sum() / group["steps"].sum() if group["steps"].sum() else 1.0,
            "tok_per_s": group["tokens_per_s"].median(), "tok_per_s_q1": q1, "tok_per_s_q3": q3,
            "speedup_median": (paired["decode_s_base"] / paired["decode_s"]).median(),
            "speedup_sum": paired["decode_s_base"].sum() / paired["decode_s"].sum(),
            "speedup_e2e": paired["wall_s_base"].sum() / paired["wall_s"].sum(),
            "overhead": group["overhead_frac"].mean(),
            "match_hf_greedy": group["matches_hf_greedy"].astype("Float64").mean(),
            "match_core_greedy": group["matches_core_greedy"].astype("Float64").mean(),
        }
        if group["family"].iloc[0] == "core" and len(core):
            pc = group.merge(core, on=PAIR, suffixes=("", "_core"))
            row["speedup_vs_core"] = pc["core_decode_s_core"].sum() / pc["core_decode_s"].sum()
        out.append(row)
    return pd.DataFrame(out)


def draft_acceptance(df: pd.DataFrame) -> pd.DataFrame:
    """Per core decoder, draft source and depth: nodes fed, tried (the walk reached their parent)
    and accepted, summed over prompts, and acceptance = accepted / tried."""
    totals: dict[tuple[str, str, int], Counter] = {}
    column = df["draft_acceptance"] if "draft_acceptance" in df else pd.Series(dtype=object)
    for decoder, cell in zip(df["decoder"], column):
        if not isinstance(cell, str) or not cell:
            continue
        for r in json.loads(cell):
            totals.setdefault((decoder, r["source"], int(r["depth"])), Counter()).update(
                {k: r[k] for k in ("fed", "tried", "accepted")})
    return pd.DataFrame([{"decoder": d, "source": s, "depth": k, **c,
                          "acceptance": c["accepted"] / c["tried"] if c["tried"] else None}
                         for (d, s, k), c in totals.items()])


def summary_markdown(table: pd.DataFrame, title: str) -> str:
    def num(value, spec):
        return "" if value is None or pd.isna(value) else format(value, spec)

    lines = [
        f"### {title}",
        "",
        "| decoder | N | W | G | prompts | S | tokens/step | tok/s median [IQR] | speedup median | speedup sum | "
        "speedup e2e | vs core greedy | overhead | match HF greedy |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in table.iterrows():
        name = f"auto = {r['config']}" if r["decoder"] == "auto" else r["decoder"]
        lines.append(
            f"| {name} | {num(r['N'], '.0f')} | {num(r['W'], '.0f')} | {num(r['G'], '.0f')} | {r['prompts']} | "
            f"{r['S']:.2f} | {num(r['tokens_per_step'], '.1f')} | {r['tok_per_s']:.2f} [{r['tok_per_s_q1']:.2f}-{r['tok_per_s_q3']:.2f}] | "
            f"{r['speedup_median']:.2f}x | {r['speedup_sum']:.2f}x | {r['speedup_e2e']:.2f}x | "
            f"{num(r.get('speedup_vs_core'), '.2f')} | {100 * r['overhead']:.1f}% | "
            f"{num(r['match_hf_greedy'], '.0%')} |"
        )
    return "\n".join(lines)


def predicted_vs_measured(df: pd.DataFrame, calibration: dict) -> pd.DataFrame:
    """Each calibrated core decoder: predicted speedup over core greedy (with S from the
    calibration prompts, and with the S and step shapes measured on the benchmark prompts) against
    the measured ratio of summed core loop times."""
    cost = cm.CostModel.from_rows(calibration["latency"])
    calibrated = {row["decoder"]: row for row in calibration["candidates"] if row["status"] == "calibrated"}
    core = df[df["decoder"] == CORE_GREEDY][[*PAIR, "core_decode_s"]]
    auto = calibration.get("chosen")
    out = []
    for name, group in df[df["family"] == "core"].groupby("decoder", sort=False):
        label = auto if name == "auto" else name
        if name == CORE_GREEDY or label not in calibrated:
            continue
        calib = calibrated[label]
        config = _config_from_row(group.iloc[0])
        counts: Counter[int] = Counter()
        for hist in group["step_tokens_hist"].dropna():
            counts.update({int(k): v for k, v in json.loads(hist).items()})
        step_tokens = [k for k, v in counts.items() for _ in range(v)]
        accepted_total = int(group["new_tokens"].sub(1).sum())
        accepted = [accepted_total / len(step_tokens)] * len(step_tokens)
        host = calib["host_ms_per_step"] / 1e3
        paired = group.merge(core, on=PAIR, suffixes=("", "_core"))
        out.append({
            "decoder": name, "config": label,
            "S_calibration": calib["S"], "S_measured": accepted_total / group["steps"].sum(),
            "step_tokens_calibration": calib["step_tokens_mean"], "step_tokens_measured": group["step_tokens_mean"].mean(),
            "predicted_calibration": calib["predicted_speedup"],
            "predicted_oracle_S": cost.predict_steps(config, step_tokens, accepted, host_seconds=host),
            "measured": paired["core_decode_s_core"].sum() / paired["core_decode_s"].sum(),
            "measured_calibration_run": calib["calibration_measured_speedup"],
        })
    return pd.DataFrame(out)


def _config_from_row(row) -> LookaheadConfig | None:
    if pd.isna(row["N"]):
        return None
    if isinstance(row.get("lookahead"), str) and row["lookahead"]:
        return LookaheadConfig(**json.loads(row["lookahead"]))
    if bool(row["pool_only"]):
        return LookaheadConfig(window=1, ngram=int(row["N"]), guess=int(row["G"]), pool_only=True)
    return LookaheadConfig(window=int(row["W"]), ngram=int(row["N"]), guess=int(row["G"]),
                           prompt_pool=bool(row["prompt_pool"]))


def plot_predicted(table: pd.DataFrame, path: Path, title: str) -> Path:
    fig = Figure(figsize=(5.5, 5), layout="tight")
    ax = fig.subplots()
    top = max(1.2, table[["predicted_calibration", "predicted_oracle_S", "measured"]].max().max() * 1.1)
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8, label="prediction = measurement")
    ax.axhline(1.0, color="grey", linewidth=0.5, linestyle=":")
    ax.scatter(table["predicted_calibration"], table["measured"], label="S from calibration prompts", marker="o")
    ax.scatter(table["predicted_oracle_S"], table["measured"], label="S measured on these prompts", marker="x")
    for _, r in table.iterrows():
        ax.annotate(r["decoder"], (r["predicted_calibration"], r["measured"]), fontsize=6,
                    xytext=(3, 2), textcoords="offset points")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="predicted speedup over core greedy",
           ylabel="measured speedup over core greedy", title=title)
    ax.legend(fontsize="small", loc="upper left")
    fig.savefig(path, dpi=110)
    return path


def plot_speedups(table: pd.DataFrame, path: Path, title: str) -> Path:
    fig = Figure(figsize=(max(5.0, 0.45 * len(table) + 1.5), 3.8), layout="tight")
    ax = fig.subplots()
    ax.bar(range(len(table)), table["speedup_sum"], color=["tab:grey" if d.startswith(("hf", "core")) else "tab:blue"
                                                          for d in table["decoder"]])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(table)), table["decoder"], rotation=60, ha="right", fontsize=7)
    ax.set(ylabel="speedup over HF greedy (ratio of sums)", title=title)
    fig.savefig(path, dpi=110)
    return path


def write_report(out: Path) -> str:
    """``summary.md``/``summary.csv``/``speedup.png`` and, if calibrated, ``predicted_vs_measured.*``."""
    df = load_rows(out / "rows.csv")
    if df.empty:
        return "(no rows yet)"
    meta = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    title = f"{meta.get('model', df['model'].iloc[0])} / {meta.get('dataset', df['dataset'].iloc[0])}"
    table = summarize(df)
    table.to_csv(out / "summary.csv", index=False)
    plot_speedups(table, out / "speedup.png", title)
    sections = [summary_markdown(table, title), _method_note(meta, df)]
    drafts = draft_acceptance(df)
    if not drafts.empty:
        drafts.to_csv(out / "draft_acceptance.csv", index=False)
        sections.append("#### Draft nodes per source and depth (fed; tried = the walk reached the parent; "
                        "accepted)\n\n" + drafts.to_markdown(index=False, floatfmt=".3f"))
    calibration_path = out / "calibration.json"
    if calibration_path.exists():
        calibration = json.loads(calibration_path.read_text())
        sections.append(calibration["markdown"])
        pvm = predicted_vs_measured(df, calibration)
        if not pvm.empty:
            pvm.to_csv(out / "predicted_vs_measured.csv", index=False)
            plot_predicted(pvm, out / "predicted_vs_measured.png", title)
            sections.append("#### Cost model: predicted vs measured speedup over core greedy\n\n"
                            + pvm.to_markdown(index=False, floatfmt=".2f"))
    text = "\n\n".join(sections) + "\n"
    (out / "summary.md").write_text(text, encoding="utf-8")
    return text


SPEEDUP_GOAL_DATASETS = ("humaneval", "mbpp")   # issue #5: at least 1.3x on these


def collect(root: Path) -> pd.DataFrame:
    """One row per run folder under ``root``: auto's pick and speedups against HF greedy and HF
    prompt lookup (its best k), with the issue's goals checked."""
    rows = []
    for rows_csv in sorted(root.glob("*/rows.csv")):
        df = load_rows(rows_csv)
        if df.empty or "auto" not in set(df["decoder"]):
            continue
        table = summarize(df).set_index("decoder")
        auto = table.loc["auto"]
        pld = table[table.index.str.startswith("hf_pld")]
        best_pld = pld["speedup_sum"].idxmax() if len(pld) else None
        dataset = df["dataset"].iloc[0]
        row = {
            "model": df["model"].iloc[0], "dataset": dataset, "prompts": int(auto["prompts"]),
            "auto_pick": auto["config"], "auto_S": auto["S"],
            "auto_speedup": auto["speedup_sum"], "auto_speedup_median": auto["speedup_median"],
            "pld": best_pld, "pld_S": pld.loc[best_pld, "S"] if best_pld else None,
            "pld_speedup": pld.loc[best_pld, "speedup_sum"] if best_pld else None,
            "core_greedy_speedup": table.loc[CORE_GREEDY, "speedup_sum"] if CORE_GREEDY in table.index else None,
            "match_hf_greedy": table["match_hf_greedy"].min(),
        }
        row["goal_not_slower"] = row["auto_speedup"] >= 1.0
        row["goal_1.3x"] = row["auto_speedup"] >= 1.3 if dataset in SPEEDUP_GOAL_DATASETS else None
        row["goal_beats_pld"] = row["auto_speedup"] > row["pld_speedup"] if best_pld else None
        rows.append(row)
    return pd.DataFrame(rows)


TREE_S_GOAL = 1.15     # issue #11: a tree's S at least 15% above the same (N, W, G)'s linear branches


def tree_vs_linear(root: Path) -> pd.DataFrame:
    """Every token-tree decoder with a window beside the linear-branch decoder of the same (N, W, G)
    and prompt pool, on the same prompts: S, tokens fed per step, and the goal (S at least 15%
    higher while feeding no more tokens per step)."""
    rows = []
    for rows_csv in sorted(root.glob("*/rows.csv")):
        df = load_rows(rows_csv)
        if df.empty:
            continue
        table = summarize(df)
        configs = {r["decoder"]: _config_from_row(df[df["decoder"] == r["decoder"]].iloc[0])
                   for _, r in table.iterrows() if r["config"]}
        by_name = table.set_index("decoder")
        for name, config in configs.items():
            if config is None or not config.tree or config.pool_only:
                continue
            linear = dataclasses.replace(config, tree=False, suffix=0, recycle=0, depth=0, budget=0)
            match = [n for n, c in configs.items() if c == linear]
            if not match:
                continue
            lin, tree = by_name.loc[match[0]], by_name.loc[name]
            row = {"model": df["model"].iloc[0], "dataset": df["dataset"].iloc[0], "prompts": int(tree["prompts"]),
                   "linear": match[0], "tree": name, "S_linear": lin["S"], "S_tree": tree["S"],
                   "S_ratio": tree["S"] / lin["S"], "fed_linear": lin["tokens_per_step"],
                   "fed_tree": tree["tokens_per_step"], "speedup_linear": lin["speedup_sum"],
                   "speedup_tree": tree["speedup_sum"], "match_hf_greedy": tree["match_hf_greedy"]}
            row["goal_S_15pct_no_more_fed"] = row["S_ratio"] >= TREE_S_GOAL and row["fed_tree"] <= row["fed_linear"]
            rows.append(row)
    return pd.DataFrame(rows)


def write_collection(root: Path) -> str:
    """``goals.md``/``goals.csv``/``goals.png`` in ``root``: every run folder's auto against HF;
    ``trees.md``/``trees.csv``: token trees against linear branches at the same (N, W, G)."""
    trees = tree_vs_linear(root)
    tree_text = ""
    if not trees.empty:
        trees.to_csv(root / "trees.csv", index=False)
        shown = trees.copy()
        shown["goal_S_15pct_no_more_fed"] = shown["goal_S_15pct_no_more_fed"].map({True: "yes", False: "**no**"})
        tree_text = ("### Token trees against linear branches at the same (N, W, G), same prompts\n\n"
                     + shown.to_markdown(index=False, floatfmt=".2f") + "\n")
        (root / "trees.md").write_text(tree_text, encoding="utf-8")
    table = collect(root)
    if table.empty:
        return tree_text or "(no run folders with an auto decoder)"
    table.to_csv(root / "goals.csv", index=False)
    models = list(dict.fromkeys(table["model"]))
    fig = Figure(figsize=(4.5 * len(models), 3.8), layout="tight")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        part = table[table["model"] == model].set_index("dataset")
        part[["pld_speedup", "core_greedy_speedup", "auto_speedup"]].rename(columns={
            "pld_speedup": "HF prompt lookup", "core_greedy_speedup": "core greedy", "auto_speedup": "auto",
        }).plot.bar(ax=ax, rot=30)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set(title=model, xlabel="", ylabel="speedup over HF greedy (ratio of sums)")
        ax.legend(fontsize="small")
    fig.savefig(root / "goals.png", dpi=110)
    shown = table.copy()
    for goal in [c for c in shown.columns if c.startswith("goal_")]:
        shown[goal] = shown[goal].map({True: "yes", False: "**no**"}).fillna("")
    text = ("### decoding=auto against transformers (speedup over `generate` greedy, ratio of summed decode time)\n\n"
            + shown.to_markdown(index=False, floatfmt=".2f") + "\n\n![goals](goals.png)\n")
    (root / "goals.md").write_text(text, encoding="utf-8")
    return text + ("\n" + tree_text if tree_text else "")


def _method_note(meta: dict, df: pd.DataFrame) -> str:
    return (
        f"{df['item_id'].nunique()} prompts x {df['decoder'].nunique()} decoders, max {int(df['max_new_tokens'].iloc[0])} "
        f"new tokens, {meta.get('threads', df['threads'].iloc[0])} torch thread(s), {meta.get('repeats', 1)} repeat(s), "
        f"load average {df['load_avg'].min():.1f}-{df['load_avg'].max():.1f} during the run; "
        f"torch {df['torch'].iloc[0]}, transformers {df['transformers'].iloc[0]}. "
        "tok/s and speedups use decode_s = wall - prefill forward (hooks time it for every decoder); "
        "'speedup e2e' includes the prefill; 'vs core greedy' compares the core's own loop times; "
        "'overhead' = share of decode_s outside the model's forward. "
        "S = tokens after the first / forwards after the prefill."
    )


# ---------------------------------------------------------------------------------------------
# Calibration (decoding=auto and the cost model's check)


def calibrate(session: Session, prompts: list[list[int]], tokens: int, core: Sequence[Decoder],
              auto: bool, predict: bool, out: Path) -> dict:
    """Run (or reload) the calibration: the default grid when ``auto``, plus the benchmarked
    configs when ``predict`` (these are never pruned, so each gets a prediction)."""
    always = [d.lookahead for d in core if d.lookahead is not None] if predict else []
    limits = DecodeLimits(max_new_tokens=tokens, eos_token_ids=session.eos)
    record = autotune.calibrate(session.model, prompts, limits, out / "calibration.json",
                                grid=None if auto else [], always=always)
    autotune.write_tables(record, out)
    return record


# ---------------------------------------------------------------------------------------------
# Entry points


def benchmark_items(dataset, args: argparse.Namespace) -> tuple[list[Item], list[Item]]:
    """The benchmark prompts and the calibration prompts, never the same items.

    ``--every K`` takes every K-th item from ``--offset`` on (spread over a dataset's categories,
    e.g. MT-Bench's 8 blocks of 10); calibration then uses the items right after the first few
    benchmark items (offset + 1, offset + 1 + K, ...). With K = 1 the benchmark takes consecutive
    items and calibration the ones right after them (or from ``--calibration-offset``).
    """
    every = args.every
    if every == 1:
        items = dataset.load(args.data_root, args.limit, args.offset, source="local")
        start = args.calibration_offset if args.calibration_offset is not None else args.offset + len(items)
        return items, dataset.load(args.data_root, args.calibration_prompts, start, source="local")
    everything = dataset.load(args.data_root, None, 0, source="local")
    items = everything[args.offset::every][:args.limit]
    start = args.calibration_offset if args.calibration_offset is not None else args.offset + 1
    calibration = everything[start::every][:args.calibration_prompts]
    taken = {item.item_id for item in items}
    if any(item.item_id in taken for item in calibration):
        raise ValueError("calibration items overlap the benchmark items; choose another --calibration-offset")
    return items, calibration


def run(args: argparse.Namespace) -> Path:
    started = time.perf_counter()
    out = Path(args.out)
    if args.threads:
        torch.set_num_threads(args.threads)
    dataset = get_dataset(args.dataset)
    items, calibration_items = benchmark_items(dataset, args)
    session = Session.load(args.model, args.dtype, args.device)
    core = core_decoders(args.configs, args.pool, args.pool_only, args.core)

    calibration = None
    if args.auto or args.predict:
        prompts = [session.prompt_ids(dataset, item) for item in calibration_items]
        calibration = calibrate(session, prompts, args.calibration_tokens, core, args.auto, args.predict, out)
    auto: LookaheadConfig | None | bool = False
    if args.auto:
        auto = autotune.chosen_config(calibration)
    decoders = build_decoders(args.configs, args.pool, args.pool_only, args.prompt_lookup, auto, args.core)

    meta = {"model": args.model, "dataset": args.dataset, "offset": args.offset, "limit": args.limit,
            "threads": torch.get_num_threads(), "repeats": args.repeats, "max_new_tokens": args.max_new_tokens,
            "decoders": [d.name for d in decoders], "command": " ".join(sys.argv)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    store = RowStore(out / "rows.csv", [d.name for d in decoders])
    todo = [(index, item) for index, item in enumerate(items) if item.item_id not in store.finished]
    print(f"{args.model} / {args.dataset}: {len(items) - len(todo)} of {len(items)} prompts already in {store.path}",
          file=sys.stderr)
    settings = {"threads": torch.get_num_threads(), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                "torch": torch.__version__, "transformers": transformers.__version__}
    meter = ForwardMeter(session.model)
    try:
        if todo and args.warmup:
            ids = session.prompt_ids(dataset, todo[0][1])
            for decoder in decoders:
                run_decoder(session, meter, decoder, ids, min(WARMUP_TOKENS, args.max_new_tokens))
        with tqdm(total=len(todo) * len(decoders) * args.repeats, desc=f"{args.model}/{args.dataset}",
                  unit="decode") as bar:
            longest = 0.0
            for index, item in todo:
                if args.time_budget and time.perf_counter() - started + longest > args.time_budget:
                    print(f"time budget of {args.time_budget} s reached: rerun the command to resume", file=sys.stderr)
                    break
                prompt_start = time.perf_counter()
                ids = session.prompt_ids(dataset, item)
                results = run_prompt(session, meter, decoders, ids, index, args.max_new_tokens, args.repeats, bar)
                store.append(make_rows(session, args.dataset, item.item_id, decoders, results, ids, index, settings))
                longest = max(longest, time.perf_counter() - prompt_start)
    finally:
        meter.close()
    print(write_report(out))
    return out / "rows.csv"


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2_135m", help="models.load_model spec (tiny-llama for tests)")
    parser.add_argument("--dataset", default="mtbench")
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--every", type=positive_int, default=1,
                        help="take every K-th item from --offset (spread over categories); default consecutive")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--configs", nargs="*", type=lambda s: parse_ints(s, 3), default=[(5, 15, 15), (5, 7, 7), (4, 5, 5), (3, 4, 4)],
                        help="lookahead configs as N,W,G")
    parser.add_argument("--pool", choices=("off", "on", "both"), default="both", help="prompt pool for --configs")
    parser.add_argument("--pool-only", nargs="*", type=lambda s: parse_ints(s, 2), default=[(4, 1)],
                        help="pool-only configs as N,G")
    parser.add_argument("--core", nargs="*", type=parse_core, default=[],
                        help="more core configs as LookaheadConfig fields, e.g. ngram=5,window=7,guess=7,prompt_pool=1,tree=1")
    parser.add_argument("--prompt-lookup", nargs="*", type=int, default=[10],
                        help="transformers prompt_lookup_num_tokens values (none: skip)")
    parser.add_argument("--auto", action="store_true", help="add the config choose_config picks")
    parser.add_argument("--predict", action="store_true", help="calibrate every config: predicted vs measured")
    parser.add_argument("--calibration-prompts", type=int, default=3)
    parser.add_argument("--calibration-tokens", type=int, default=64)
    parser.add_argument("--calibration-offset", type=int, default=None, help="default: right after the benchmark prompts")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1, help="0: no warm-up decode")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds: start no prompt that would end past it (a rerun resumes)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True)


# ---------------------------------------------------------------------------------------------
# Profiling the core's host-side work


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


def profile_breakdown(stats: pstats.Stats, model: torch.nn.Module) -> dict[str, float]:
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


def profile(args: argparse.Namespace) -> Path:
    """Host-side time per step of each config: unprofiled totals, then a cProfile breakdown."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.threads:
        torch.set_num_threads(args.threads)
    dataset = get_dataset(args.dataset)
    session = Session.load(args.model, args.dtype, args.device)
    prompts = [session.prompt_ids(dataset, item) for item in dataset.load(args.data_root, args.limit, args.offset, source="local")]
    limits = DecodeLimits(max_new_tokens=args.max_new_tokens, eos_token_ids=session.eos)
    decoders = [Decoder(CORE_GREEDY, "core")] + core_decoders(args.configs, args.pool, args.pool_only, args.core)
    decode(session.model, prompts[0], None, DecodeLimits(WARMUP_TOKENS))
    rows, raw = [], []
    for decoder in decoders:
        steps = decode_s = model_s = 0.0
        for ids in prompts:
            stats = decode(session.model, ids, decoder.lookahead, limits).stats
            steps += stats.steps
            decode_s += stats.decode_seconds
            model_s += stats.model_seconds
        profiles = []
        for limit in (limits, DecodeLimits(max_new_tokens=1, eos_token_ids=session.eos)):
            profiler = cProfile.Profile()
            for ids in prompts:
                profiler.runcall(decode, session.model, ids, decoder.lookahead, limit)
            profiles.append(profiler)
        shares = loop_breakdown(*(profile_breakdown(pstats.Stats(p), session.model) for p in profiles))
        row = {"decoder": decoder.name, "steps": int(steps), "ms_per_step": 1e3 * decode_s / steps,
               "host_ms_per_step": 1e3 * (decode_s - model_s) / steps, "overhead_frac": 1 - model_s / decode_s}
        row.update({f"{k} [% of loop, profiled]": 100 * v for k, v in shares.items()})
        rows.append(row)
        profiler = profiles[0]
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        raw.append(f"## {decoder.name}\n\n```\n{text.getvalue()}\n```")
    table = pd.DataFrame(rows)
    table.to_csv(out / "profile.csv", index=False)
    transposed = table.set_index("decoder").T
    note = (f"{args.model}, {len(prompts)} prompt(s) of {args.dataset}, {args.max_new_tokens} new tokens, "
            f"{torch.get_num_threads()} thread(s). ms_per_step, host_ms_per_step and overhead_frac come from "
            "unprofiled runs (host = outside CausalLM.forward, so mask building counts as model time there); "
            "the percentages are shares of the decode loop under cProfile, which inflates Python-heavy parts.")
    md = f"# Host-side profile\n\n{note}\n\n" + transposed.to_markdown(floatfmt=".2f") + "\n"
    (out / "profile.md").write_text(md, encoding="utf-8")
    (out / "profile_top_functions.md").write_text("\n\n".join(raw) + "\n", encoding="utf-8")
    print(md)
    return out / "profile.md"


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in ("run", "report", "profile", "collect") else "run"
    parser = argparse.ArgumentParser(prog=f"python -m experiments.benchmark {command}",
                                     description=__doc__.split("\n\n")[0])
    if command == "collect":
        parser.add_argument("root", help="folder whose subfolders are benchmark runs with --auto")
        print(write_collection(Path(parser.parse_args(argv).root)))
        return
    if command == "report":
        parser.add_argument("--out", required=True)
        print(write_report(Path(parser.parse_args(argv).out)))
        return
    add_run_arguments(parser)
    if command == "profile":
        parser.set_defaults(limit=2, max_new_tokens=64, prompt_lookup=[])
        profile(parser.parse_args(argv))
    else:
        run(parser.parse_args(argv))


if __name__ == "__main__":
    main()

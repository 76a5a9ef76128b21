"""Every decoder on the same prompts, in one process, interleaved: who is fastest on this device?

A preset of the one harness (``run.py``, experiments/job/runner.py): the flags below become a job with
``baseline=hf_greedy`` and a list of decoders, whose rows (the harness's one schema) go to
``<out>/rows.csv``; ``report``, ``collect`` and the cost model's predicted-vs-measured view read them.

    python -m experiments.presets.benchmark run --model smollm2_135m --dataset mtbench --limit 20 \\
        --max-new-tokens 128 --configs 5,15,15 5,7,7 4,5,5 3,4,4 --pool both --threads 1 \\
        --auto --predict --out results/benchmark/smollm2_mtbench
    python -m experiments.presets.benchmark report --out results/benchmark/smollm2_mtbench
    python -m experiments.presets.benchmark collect results/benchmark/auto
    python -m experiments.presets.benchmark profile --model smollm2_135m --configs 5,7,7 --out results/benchmark/profile

Decoders (``--configs`` are N,W,G triples, the paper's n-gram size, window and guess set size):

* ``hf_greedy``: transformers ``generate(do_sample=False)``, the baseline everything is timed against;
* ``hf_pld_k<k>``: transformers prompt lookup, ``generate(prompt_lookup_num_tokens=k)``;
* ``core_greedy``: this project's decode loop without lookahead;
* ``la_N<N>W<W>G<G>`` and ``..._pool``: lookahead, without / with the prompt pool (``--pool``);
* ``pool_N<N>G<G>``: pool-only decoding (no Jacobi window, ``--pool-only N,G``);
* any other core config, e.g. token trees, from ``--core`` specs of ``LookaheadConfig`` fields
  (``--core ngram=5,window=7,guess=7,prompt_pool=1,tree=1``), named by ``lookahead_core.config.config_label``
  (``la_N5W7G7_pool_tree``);
* ``auto``: the config :func:`lookahead_core.cost.choose_config` picks on calibration prompts
  that are not benchmark prompts (``--auto``; ``--predict`` also calibrates every benchmarked config).

Method (the harness's): the model is loaded once; after an untimed warm-up of every decoder, each
prompt (its first turn) is decoded by every decoder back to back, in an order rotated by one per
prompt, ``--repeats`` times (median). Forward hooks time every decoder alike: ``decode_s`` = wall
clock - the first forward (the prefill), ``steps`` = forwards - 1, ``overhead_frac`` = share of
``decode_s`` outside the model. A rerun of the same command resumes. ``--every K`` takes every
K-th item from ``--offset`` on (spread over a dataset's categories, e.g. MT-Bench's 8 blocks of 10).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from matplotlib.figure import Figure

from experiments.reporting import report
from experiments.reporting.drafts import draft_acceptance, draft_reliability, plot_reliability
from experiments.reporting.tables import cell, markdown
from experiments.data.datasets import repo_root
from experiments.config.schema import register_configs
from lookahead_core.config import LookaheadConfig, config_fields, config_label, linear_twin

HF_GREEDY, CORE_GREEDY = "hf_greedy", "core_greedy"
PAIR = ["dataset", "item_id"]


# ---------------------------------------------------------------------------------------------
# The preset: flags -> a harness job


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
    """``ngram=5,window=7,guess=7,prompt_pool=1,tree=1`` -> that LookaheadConfig (bools as 0/1); a
    registered source's name sizes it (``medusa=8``: ``sources={"medusa": 8}``)."""
    from lookahead_core.sources import SOURCES

    fields = {f.name: f.type for f in dataclasses.fields(LookaheadConfig)}
    registered = sorted(name for name, kind in SOURCES.items() if kind.field is None)
    kwargs: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        if key in registered and value.isdigit():
            kwargs.setdefault("sources", {})[key] = int(value)
            continue
        if key not in fields or key == "seed" or not value:
            raise argparse.ArgumentTypeError(f"{part!r}: expected key=value with key in {sorted(fields)} "
                                             f"or a registered source {registered}")
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: the value must be an integer (bools as 0/1)") from None
        kwargs[key] = bool(number) if fields[key] in ("bool", bool) else number
    try:
        return LookaheadConfig(**kwargs)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{text!r}: {err}") from None


def core_entry(config: LookaheadConfig) -> dict[str, Any]:
    """A ``decoders`` entry running exactly ``config`` (every field), named by its one name."""
    fields = config_fields(config)
    fields["sources"] = dict(config.sources)
    return {"use": "lookahead", "name": config_label(config), **fields}


def core_decoders(configs: Sequence[tuple[int, int, int]], pool: str, pool_only: Sequence[tuple[int, int]],
                  extra: Sequence[LookaheadConfig] = ()) -> list[dict[str, Any]]:
    """``configs`` (N, W, G) with the prompt pool off/on/both, then pool-only (N, G) configs, then
    ``extra`` configs (``--core``), as ``decoders`` entries of the harness."""
    pools = {"off": (False,), "on": (True,), "both": (False, True)}[pool]
    entries = []
    for n, w, g in configs:
        for with_pool in pools:
            name = config_label(LookaheadConfig(window=w, ngram=n, guess=g, prompt_pool=with_pool))
            entries.append({"use": "lookahead", "name": name, "window": w, "ngram": n, "guess": g,
                            "prompt_pool": with_pool})
    for n, g in pool_only:
        name = config_label(LookaheadConfig(window=1, ngram=n, guess=g, pool_only=True))
        entries.append({"use": "pool_only", "name": name, "window": 1, "ngram": n, "guess": g})
    return entries + [core_entry(config) for config in extra]


def build_decoders(configs, pool, pool_only, prompt_lookup, auto: dict[str, Any] | None = None,
                   extra: Sequence[LookaheadConfig] = ()) -> list[dict[str, Any]]:
    """The ``decoders`` list of the job (the baseline hf_greedy is the job's ``baseline``)."""
    entries: list[dict[str, Any]] = [{"use": "hf_pld", "name": f"hf_pld_k{k}", "k": k} for k in prompt_lookup]
    entries += [{"use": "greedy", "name": CORE_GREEDY}]
    entries += core_decoders(configs, pool, pool_only, extra)
    if auto is not None:
        entries.append({"use": "auto", "name": "auto", **auto})
    names = [HF_GREEDY] + [e["name"] for e in entries]
    duplicates = sorted(n for n, c in Counter(names).items() if c > 1)
    if duplicates:
        raise ValueError(f"decoders given twice: {duplicates}")
    return entries


def model_overrides(spec: str) -> list[str]:
    """The harness overrides that load ``spec``: its conf/model yaml when one has that spec
    (``smollm2_135m``), else the spec itself (``tiny-llama``, a local folder, a hub id)."""
    models = {path.stem: path for path in (repo_root() / "conf" / "model").glob("*.yaml")}
    by_spec = {(yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("spec"): stem
               for stem, path in models.items()}
    return [f"model={by_spec[spec]}"] if spec in by_spec else \
        [f"model.name={spec}", f"model.spec={spec}", "model.packages=[]"]


def job_config(args: argparse.Namespace):
    """The harness config these flags describe."""
    overrides = [
        *model_overrides(args.model), f"model.dtype={args.dtype}", f"experiment={args.dataset}",
        f"experiment.max_new_tokens={args.max_new_tokens}", f"dataset.offset={args.offset}", "dataset.turns=1",
        "decoding.temperature=0", "baseline=hf_greedy", f"repeats={args.repeats}", f"warmup={args.warmup}",
        f"device={args.device}", f"results_file={Path(args.out).resolve() / 'rows.csv'}",
    ]
    if args.limit is not None and args.every == 1:     # --every: plan_job takes every K-th item
        overrides.append(f"dataset.limit={args.limit}")
    for key, value in (("threads", args.threads), ("time_budget", args.time_budget), ("data_root", args.data_root)):
        if value is not None:
            overrides.append(f"{key}={value}")
    auto = None
    if args.auto or args.predict:
        if args.predict and not args.auto:
            print("--predict calibrates through the auto decoder: adding --auto", file=sys.stderr)
        offset = args.calibration_offset
        if offset is None and args.every > 1:          # the items right after the first benchmark item
            offset = args.offset + 1
        auto = {"calibration_items": args.calibration_prompts, "calibration_tokens": args.calibration_tokens,
                "calibration_offset": offset, "predict": args.predict, "recalibrate": args.recalibrate,
                "protocol": "grid" if args.predict else args.protocol}      # predicted vs measured: the grid's
    return compose_job(overrides, build_decoders(args.configs, args.pool, args.pool_only, args.prompt_lookup,
                                                 auto, args.core))


def compose_job(overrides: Sequence[str], decoders: list[dict[str, Any]]):
    """The harness config of ``overrides`` with the job's ``decoders`` list (presets build both)."""
    from hydra import compose, initialize_config_dir

    register_configs()
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=list(overrides))
    cfg.decoders = decoders
    return cfg


def plan_job(args: argparse.Namespace):
    """The harness's plan of these flags (settings, adapter, items), with ``--every``'s items:
    every K-th from ``--offset``, calibration (``--auto``) on items that are none of them."""
    from experiments.job import runner
    from experiments.decoders.registry import AutoDecoder
    from experiments.config.settings import plan

    settings, adapter, items = plan(job_config(args))
    if args.every > 1:
        items = items[::args.every][:args.limit]
        taken = {item.item_id for item in items}
        for auto in (d for d in settings.decoders if isinstance(d, AutoDecoder)):
            calibration = runner.calibration_items(adapter, settings, items, auto.params.calibration_items,
                                                   auto.params.calibration_offset)
            if any(item.item_id in taken for item in calibration):
                raise ValueError("calibration items overlap the benchmark items: use fewer --calibration-prompts "
                                 "than --every, or another --calibration-offset")
    return settings, adapter, items


def run(args: argparse.Namespace) -> Path:
    from experiments.job.runner import run_job

    out = Path(args.out)
    settings, adapter, items = plan_job(args)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"model": args.model, "dataset": args.dataset, "offset": args.offset, "limit": args.limit,
            "every": args.every, "threads": args.threads, "repeats": args.repeats,
            "max_new_tokens": args.max_new_tokens, "decoders": [d.name for d in settings.decoders],
            "command": " ".join(sys.argv)}
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    path = run_job(settings, adapter, items)
    print(write_report(out))
    return path


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="smollm2_135m", help="models.load_model spec (tiny-llama for tests)")
    parser.add_argument("--dataset", default="mtbench", help="an experiment of conf/experiment (its first turns)")
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
    parser.add_argument("--predict", action="store_true",
                        help="calibrate every config: predicted vs measured (auto's protocol grid)")
    parser.add_argument("--protocol", choices=("online", "grid"), default="online", help="auto's protocol (docs/auto.md)")
    parser.add_argument("--recalibrate", action="store_true",
                        help="auto measures its latency curve and calibrates again, ignoring the calibration cache")
    parser.add_argument("--calibration-prompts", type=int, default=3)
    parser.add_argument("--calibration-tokens", type=int, default=128)
    parser.add_argument("--calibration-offset", type=int, default=None,
                        help="default: right after the benchmark prompts (with --every: after the first one)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--warmup", type=int, default=1, help="0: no warm-up decode")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--time-budget", type=float, default=None,
                        help="seconds: start no prompt that would end past it (a rerun resumes)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", required=True)


# ---------------------------------------------------------------------------------------------
# Views of the rows: the decoder table, the cost model's check, the collection


def load_rows(path: Path) -> pd.DataFrame:
    return report.load_results([path])


def _config_from_row(row) -> Any:
    """The core config a row ran (its ``params``), or None (greedy, transformers)."""
    from lookahead_core import LookaheadConfig

    params = row["params"]
    if row["family"] != "core" or pd.isna(params) or params in ("null", ""):
        return None
    return LookaheadConfig(**json.loads(params))


def summarize(df: pd.DataFrame, baseline: str = HF_GREEDY) -> pd.DataFrame:
    """One row per decoder (the baseline first): the harness's summary (experiments.reporting.report) with
    the config's label, N/W/G and the ratio of summed decode time against ``core_greedy``."""
    # One run folder is one setup (its flags are fixed by run.json and its rows file): rows resumed
    # by a later version of the code carry another config tag and settings hash, but pool with the
    # earlier ones.
    df = df.assign(**{key: "+".join(dict.fromkeys(df[key].astype(str))) for key in ("config", "settings")})
    table = report.summarize(df)
    base = df[df["decoder"] == baseline]
    base_row = report.summarize_decoder(tuple(base[report.GROUP].iloc[0]), base, base) if len(base) else None
    rows = ([base_row] if base_row else []) + table.to_dict("records")
    core = df[df["decoder"] == CORE_GREEDY][[*PAIR, "decode_s"]]
    out = []
    for row in rows:
        group = df[df["decoder"] == row["decoder"]]
        first = group.iloc[0]
        config = _config_from_row(first)
        row.update(family=first["family"], N=first["N"], W=first["W"], G=first["G"], prompts=len(group),
                   label=config_label(config) if first["family"] == "core" else "",
                   speedup_sum=row.get("speedup", 1.0) if row["decoder"] != baseline else 1.0)
        if row["decoder"] == baseline:
            row.update(speedup_median=1.0, speedup_e2e=1.0, speedup=1.0)
        if first["family"] == "core" and len(core):
            paired = group.merge(core, on=PAIR, suffixes=("", "_core"))
            row["speedup_vs_core"] = paired["decode_s_core"].sum() / paired["decode_s"].sum()
        row["match_hf_greedy"] = 1.0 if row["decoder"] == baseline else row["matches_greedy"]
        out.append(row)
    return pd.DataFrame(out)


def summary_markdown(table: pd.DataFrame, title: str) -> str:
    rows = [{
        "decoder": f"auto = {r['label']}" if r["decoder"] == "auto" else r["decoder"],
        "N": cell(r["N"], ".0f"), "W": cell(r["W"], ".0f"), "G": cell(r["G"], ".0f"), "prompts": str(r["prompts"]),
        "S": f"{r['S']:.2f}", "tokens/step": cell(r["tokens_per_step"], ".1f"),
        "tok/s median [IQR]": f"{r['tok_s_median']:.2f} [{r['tok_s_q1']:.2f}-{r['tok_s_q3']:.2f}]",
        "speedup median": f"{r['speedup_median']:.2f}x", "speedup sum": f"{r['speedup_sum']:.2f}x",
        "speedup e2e": f"{r['speedup_e2e']:.2f}x", "vs core greedy": cell(r.get("speedup_vs_core"), ".2f"),
        "overhead": f"{100 * r['overhead']:.1f}%", "match HF greedy": cell(r["match_hf_greedy"], ".0%"),
        "pass@1": cell(r.get("pass@1"), ".2f"),
    } for _, r in table.iterrows()]
    return f"### {title}\n\n" + markdown(pd.DataFrame(rows, dtype=object))


def predicted_vs_measured(df: pd.DataFrame, calibration: dict) -> pd.DataFrame:
    """Each core decoder of the run: predicted speedup over core greedy (with S from the
    calibration prompts, where the calibration ran that config, and with the S and step shapes
    measured on the benchmark prompts) against the measured ratio of summed core loop times.

    The second prediction asks whether the cost model, had it seen these prompts' S, ranks the
    configs as they measured; it uses the config's host time per step from the calibration, or
    greedy's where the calibration did not run the config. ``best_cut`` prices the same steps as
    if each had fed only the tokens it committed (``CostModel.best_cut``): what the config's drafts
    are worth on this device, however well a step were cut."""
    candidates = {row["decoder"]: row for row in calibration["candidates"] if row.get("S") is not None
                  and not pd.isna(row["S"])}
    from lookahead_core import cost as cm

    cost = cm.CostModel.from_rows(calibration["latency"])
    core = df[df["decoder"] == CORE_GREEDY][[*PAIR, "decode_s"]]
    auto = calibration.get("chosen")
    greedy_host = candidates["greedy"]["host_ms_per_step"] / 1e3 if "greedy" in candidates else None
    out = []
    for name, group in df[df["family"] == "core"].groupby("decoder", sort=False):
        label = auto if name == "auto" else name
        if name == CORE_GREEDY or label == "greedy":
            continue
        calib = candidates.get(label)
        calibrated = calib is not None and calib["status"] == "calibrated"
        config = _config_from_row(group.iloc[0])
        step_tokens = list(report.histogram(group["step_tokens_hist"]).elements())
        committed = list(report.histogram(group["accepted_hist"]).elements())
        accepted_total = int(group["new_tokens"].sub(1).sum())
        accepted = [accepted_total / len(step_tokens)] * len(step_tokens)
        host = calib["host_ms_per_step"] / 1e3 if calib is not None else greedy_host
        paired = group.merge(core, on=PAIR, suffixes=("", "_core"))
        out.append({
            "decoder": name, "config": label, "calibration": calib["status"] if calib is not None else "not run",
            "S_calibration": calib["S"] if calibrated else float("nan"),
            "S_measured": accepted_total / group["steps"].sum(),
            "step_tokens_calibration": calib["step_tokens_mean"] if calibrated else float("nan"),
            "step_tokens_measured": group["step_tokens_mean"].mean(),
            "predicted_calibration": calib["predicted_speedup"] if calibrated else float("nan"),
            "predicted_oracle_S": cost.predict_steps(config, step_tokens, accepted, host_seconds=host),
            "best_cut": cost.best_cut(committed, host_seconds=host),
            "measured": paired["decode_s_core"].sum() / paired["decode_s"].sum(),
            "measured_calibration_run": calib["calibration_measured_speedup"] if calibrated else float("nan"),
        })
    return pd.DataFrame(out)


def plot_predicted(table: pd.DataFrame, path: Path, title: str) -> Path:
    fig = Figure(figsize=(5.5, 5), layout="tight")
    ax = fig.subplots()
    top = max(1.2, table[["predicted_calibration", "predicted_oracle_S", "measured"]].max().max() * 1.1)
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8, label="prediction = measurement")
    ax.axhline(1.0, color="grey", linewidth=0.5, linestyle=":")
    ax.scatter(table["predicted_calibration"], table["measured"], label="S from calibration prompts", marker="o")
    ax.scatter(table["predicted_oracle_S"], table["measured"], label="S measured on these prompts", marker="x")
    for _, r in table.iterrows():
        x = r["predicted_oracle_S"] if pd.isna(r["predicted_calibration"]) else r["predicted_calibration"]
        ax.annotate(r["decoder"], (x, r["measured"]), fontsize=6,
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


def write_report(out: Path, calibration_path: Path | None = None) -> str:
    """``summary.md``/``summary.csv``/``speedup.png`` and, if calibrated, ``predicted_vs_measured.*``.

    ``calibration_path``: the ``rows.auto.json`` of another run on the same prompts (a run of fixed
    configs has none): its latency curve predicts this run's configs from their measured S."""
    if not (out / "rows.csv").exists() or len(load_rows(out / "rows.csv")) == 0:
        return "(no rows yet)"
    df = load_rows(out / "rows.csv")
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
                        "accepted)\n\n" + markdown(drafts, floatfmt=".3f"))
    reliability = draft_reliability(df)
    if not reliability.empty:
        reliability.to_csv(out / "draft_reliability.csv", index=False)
        plot_reliability(reliability, out / "reliability.png", title)
        sections.append("#### Draft estimates per source: predicted against observed acceptance, by decile of "
                        "the prediction (reliability.png)\n\n" + markdown(reliability, floatfmt=".3f"))
    own = out / "rows.auto.json"
    if calibration_path is None and own.exists():
        calibration_path = own
    if calibration_path is not None:
        calibration = json.loads(Path(calibration_path).read_text())
        heading = "#### Cost model: predicted vs measured speedup over core greedy"
        if Path(calibration_path).resolve() == own.resolve():
            from experiments.decoders import autotune

            autotune.write_tables(calibration, out)
            sections.append(calibration["markdown"])
        else:
            heading += f" (latency curve and host times of {calibration_path})"
        pvm = predicted_vs_measured(df, calibration)
        if not pvm.empty:
            pvm.to_csv(out / "predicted_vs_measured.csv", index=False)
            plot_predicted(pvm, out / "predicted_vs_measured.png", title)
            sections.append(heading + "\n\n" + markdown(pvm, floatfmt=".2f"))
    text = "\n\n".join(sections) + "\n"
    (out / "summary.md").write_text(text, encoding="utf-8")
    return text


GOALS_FILE = repo_root() / "conf" / "goals.yaml"


@dataclasses.dataclass(frozen=True)
class Goal:
    """One of the project's goals (``conf/goals.yaml``, which says what each field means): the
    yes/no ``column`` it writes in the ``table`` (``goals`` or ``trees``) of ``collect``."""

    name: str
    table: str
    column: str
    measure: str
    statement: str
    threshold: float | None = None
    beats: str | None = None
    no_more_than: tuple[str, str] | None = None
    datasets: tuple[str, ...] | None = None      # None: every data set

    def __post_init__(self) -> None:
        if (self.threshold is None) == (self.beats is None):
            raise ValueError(f"goal {self.name!r}: give exactly one of threshold and beats")
        if self.table not in ("goals", "trees"):
            raise ValueError(f"goal {self.name!r}: table must be goals or trees, got {self.table!r}")

    def check(self, row: dict[str, Any]) -> bool | None:
        """Whether ``row`` (a row of the goal's table) meets the goal; None where it does not apply."""
        if self.datasets is not None and row["dataset"] not in self.datasets:
            return None
        if self.beats is not None:
            other = row[self.beats]
            return None if other is None else row[self.measure] > other
        held = row[self.measure] >= self.threshold
        if self.no_more_than is not None:
            low, high = self.no_more_than
            held = held and row[low] <= row[high]
        return held


def load_goals(path: Path = GOALS_FILE, table: str | None = None) -> list[Goal]:
    """The goals of ``path`` (of one ``table``, or all), in the file's order."""
    goals = []
    for entry in yaml.safe_load(Path(path).read_text(encoding="utf-8"))["goals"]:
        entry = dict(entry)
        datasets = entry.pop("datasets", "all")
        pair = entry.pop("no_more_than", None)
        goals.append(Goal(**entry, datasets=None if datasets == "all" else tuple(datasets),
                          no_more_than=None if pair is None else tuple(pair)))
    return [goal for goal in goals if table is None or goal.table == table]


def load_runs(root: Path) -> list[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """Every run folder under ``root`` with rows: (folder name, rows, ``summarize`` by decoder)."""
    runs = []
    for rows_csv in sorted(root.glob("*/rows.csv")):
        df = load_rows(rows_csv)
        if not df.empty:
            runs.append((rows_csv.parent.name, df, summarize(df).set_index("decoder")))
    return runs


def collect(runs: Sequence[tuple[str, pd.DataFrame, pd.DataFrame]]) -> pd.DataFrame:
    """One row per run folder (``load_runs``; ``run``: its name) with an auto decoder: auto's pick
    and speedups against HF greedy and HF prompt lookup (its best k), with the goals of ``conf/goals.yaml``
    (``table: goals``) checked."""
    goals = load_goals(table="goals")
    rows = []
    for run_name, df, table in runs:
        if "auto" not in table.index or HF_GREEDY not in table.index:
            continue
        auto = table.loc["auto"]
        pld = table[table.index.str.startswith("hf_pld")]
        best_pld = pld["speedup_sum"].idxmax() if len(pld) else None
        dataset = df["dataset"].iloc[0]
        row = {
            "run": run_name, "model": df["model"].iloc[0], "dataset": dataset, "prompts": int(auto["prompts"]),
            "auto_pick": auto["label"], "auto_S": auto["S"],
            "auto_speedup": auto["speedup_sum"], "auto_speedup_median": auto["speedup_median"],
            "pld": best_pld, "pld_S": pld.loc[best_pld, "S"] if best_pld else None,
            "pld_speedup": pld.loc[best_pld, "speedup_sum"] if best_pld else None,
            "core_greedy_speedup": table.loc[CORE_GREEDY, "speedup_sum"] if CORE_GREEDY in table.index else None,
            "match_hf_greedy": table["match_hf_greedy"].min(),
        }
        row.update({goal.column: goal.check(row) for goal in goals})
        rows.append(row)
    return pd.DataFrame(rows)


def tree_vs_linear(runs: Sequence[tuple[str, pd.DataFrame, pd.DataFrame]]) -> pd.DataFrame:
    """Every token-tree decoder with a window, of every run folder, beside the linear-branch decoder
    of the same (N, W, G) and prompt pool on the same prompts: S, tokens fed per step, and the goals
    of ``conf/goals.yaml`` with ``table: trees`` (S at least 15% higher while feeding no more tokens
    per step); ``commit``: the code the tree's rows were decoded with.

    The twin is taken from the tree's own run folder where it has one, else from another folder
    (``load_runs``) of the same model, dataset and items (S and tokens fed are deterministic under
    greedy decoding; each speedup is against its own folder's HF greedy)."""
    goals = load_goals(table="trees")
    groups: dict[tuple, dict[tuple[str, str], tuple[Any, pd.Series, str]]] = {}
    for run_name, df, table in runs:
        key = (df["model"].iloc[0], df["dataset"].iloc[0], tuple(sorted(df["item_id"].astype(str).unique())))
        decoders = groups.setdefault(key, {})
        for name in table.index:
            rows = df[df["decoder"] == name]
            config = _config_from_row(rows.iloc[0])
            if config is not None:
                commit = "+".join(dict.fromkeys(rows["git_commit"].dropna().astype(str))) if "git_commit" in rows else ""
                decoders[(run_name, name)] = (config, table.loc[name], commit)
    rows = []
    for (model, dataset, _), decoders in groups.items():
        for (tree_run, name), (config, tree, commit) in decoders.items():
            if not config.tree or config.pool_only:
                continue
            linear = linear_twin(config)
            twins = sorted((run != tree_run, run, n) for (run, n), (c, _, _) in decoders.items() if c == linear)
            if not twins:
                continue
            _, lin_run, lin_name = twins[0]
            lin = decoders[(lin_run, lin_name)][1]
            row = {"model": model, "dataset": dataset, "prompts": int(tree["prompts"]),
                   "linear": lin_name, "tree": name, "S_linear": lin["S"], "S_tree": tree["S"],
                   "S_ratio": tree["S"] / lin["S"], "fed_linear": lin["tokens_per_step"],
                   "fed_tree": tree["tokens_per_step"], "speedup_linear": lin["speedup_sum"],
                   "speedup_tree": tree["speedup_sum"], "match_hf_greedy": tree["match_hf_greedy"],
                   "linear_run": lin_run, "tree_run": tree_run, "commit": commit}
            row.update({goal.column: goal.check(row) for goal in goals})
            rows.append(row)
    return pd.DataFrame(rows)


def write_collection(root: Path) -> str:
    """``goals.md``/``goals.csv``/``goals.png`` in ``root``: every run folder's auto against HF;
    ``trees.md``/``trees.csv``: token trees against linear branches at the same (N, W, G)."""
    runs = load_runs(root)
    trees = tree_vs_linear(runs)
    tree_text = ""
    if not trees.empty:
        trees.to_csv(root / "trees.csv", index=False)
        shown = trees.copy()
        for goal in load_goals(table="trees"):
            shown[goal.column] = shown[goal.column].map({True: "yes", False: "**no**"})
        tree_text = ("### Token trees against linear branches at the same (N, W, G), same prompts\n\n"
                     + markdown(shown, floatfmt=".2f") + "\n")
        (root / "trees.md").write_text(tree_text, encoding="utf-8")
    table = collect(runs)
    if table.empty:
        return tree_text or "(no run folders with an auto decoder)"
    table.to_csv(root / "goals.csv", index=False)
    models = list(dict.fromkeys(table["model"]))
    fig = Figure(figsize=(4.5 * len(models), 3.8), layout="tight")
    axes = fig.subplots(1, len(models), squeeze=False)[0]
    for ax, model in zip(axes, models):
        part = table[table["model"] == model]
        part = part.set_index("dataset" if part["dataset"].is_unique else "run")
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
            + markdown(shown, floatfmt=".2f") + "\n\n![goals](goals.png)\n")
    (root / "goals.md").write_text(text, encoding="utf-8")
    return text + ("\n" + tree_text if tree_text else "")


def _method_note(meta: dict, df: pd.DataFrame) -> str:
    return (
        f"{df['item_id'].nunique()} prompts x {df['decoder'].nunique()} decoders, max {int(df['max_new_tokens'].iloc[0])} "
        f"new tokens, {int(df['threads'].iloc[0]) if df['threads'].notna().any() else '?'} torch thread(s), "
        f"{meta.get('repeats', 1)} repeat(s), load average {df['load_avg'].min():.1f}-{df['load_avg'].max():.1f} "
        f"during the run; torch {df['torch'].iloc[0]}, transformers {df['transformers'].iloc[0]}. "
        "tok/s and speedups use decode_s = wall - prefill forward (hooks time it for every decoder); "
        "'speedup e2e' includes the prefill; 'vs core greedy' is the ratio of summed decode_s against "
        "core_greedy; 'overhead' = share of decode_s outside the model's forward. "
        "S = tokens after the first / forwards after the prefill."
    )


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and argv[0] in ("run", "report", "profile", "collect") else "run"
    parser = argparse.ArgumentParser(prog=f"python -m experiments.presets.benchmark {command}",
                                     description=__doc__.split("\n\n")[0])
    if command == "collect":
        parser.add_argument("root", help="folder whose subfolders are benchmark runs with --auto")
        print(write_collection(Path(parser.parse_args(argv).root)))
        return
    if command == "report":
        parser.add_argument("--out", required=True)
        parser.add_argument("--calibration", type=Path, default=None,
                            help="rows.auto.json of a run on the same prompts, for a run without --auto")
        args = parser.parse_args(argv)
        print(write_report(Path(args.out), args.calibration))
        return
    add_run_arguments(parser)
    if command == "profile":
        parser.set_defaults(limit=2, max_new_tokens=64, prompt_lookup=[])
        from experiments.presets.profile import profile
        args = parser.parse_args(argv)
        profile(args, plan_job(args))
    else:
        run(parser.parse_args(argv))


if __name__ == "__main__":
    main()

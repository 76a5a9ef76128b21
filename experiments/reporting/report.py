"""Aggregate result CSVs into markdown tables and plots.

    python -m experiments.reporting.report results/raw --out results/report

Arguments are CSV files, directories (searched recursively) or glob patterns. Rows are grouped by
run setup (experiment, model, device, dtype, decoding config and the settings hash that names the
CSV); seeds of one setup pool together, so pass@k counts each seed as a sample. Speedups pair each
decoder row with the baseline row of the same item, turn and seed, and are ratios of summed
decoding time, so long answers weigh in proportion to their cost, as a user's wall clock does.
"""

from __future__ import annotations

import argparse
import glob
import gzip
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from experiments.grading.metrics import ROUGE_TYPES, bootstrap_ci, pass_at_k_report
from experiments.reporting.drafts import draft_reliability, plot_reliability
from experiments.reporting.tables import markdown
from experiments.rows.schema import COLUMNS
from experiments.rows.store import sidecar

GROUP = ["experiment", "model", "device", "dtype", "config", "settings"]
PAIR_WITH_BASELINE = ["item_id", "turn", "seed"]   # a decoder's row meets its baseline's on these
BOOL_COLUMNS = ["baseline", "prompt_pool", "pool_only", "matches_greedy", "passed"]
TEXT_COLUMNS = ["experiment", "dataset", "item_id", "batch_items", "category", "model", "decoder", "family", "config",
                "settings", "assistant", "params", "git_commit", "text", "diff_verdict", "sandbox", "step_log",
                "draft_acceptance", "draft_reliability"]
PASS_KS = (1, 10, 100)

SUMMARY_COLUMNS = [
    "experiment", "model", "dtype", "decoder", "against", "config", "max_new_tokens", "items", "rows", "new_tokens",
    "S", "speedup", "speedup_median", "tok_s_base", "tok_s", "batch_size", "throughput", "matches_greedy", "overhead",
    "pass@1", "pass@1_base",
]  # fmt: skip
QUALITY_COLUMNS = [
    *ROUGE_TYPES, *(f"{kind}_base" for kind in ROUGE_TYPES),
    *(f"pass@{k}" for k in PASS_KS), *(f"pass@{k}_base" for k in PASS_KS),
]  # fmt: skip
# ROUGE means come with 95% percentile-bootstrap intervals over rows (``<kind>_lo``/``_hi``, the
# baseline's ``<kind>_base_lo``/``_hi``) and, for the decoder under test, the paired per-row
# difference to the baseline (``<kind>_diff`` with ``_diff_lo``/``_diff_hi``): an interval that
# contains 0 means the two decoders' summaries score the same within the sample's resolution.


ROWS_FILES = (".csv", ".csv.gz")   # a job's rows, plain or gzip (committed results)


def find_csvs(paths: Iterable[str | Path]) -> list[Path]:
    """Rows files (``.csv`` or ``.csv.gz``) named by ``paths``: files as given, directories
    recursively, globs expanded."""
    found: list[Path] = []
    for entry in map(str, paths):
        if Path(entry).is_dir():
            found += sorted(path for path in Path(entry).rglob("*.csv*") if path.name.endswith(ROWS_FILES))
        elif Path(entry).is_file():
            found.append(Path(entry))
        else:
            found += sorted(Path(match) for match in glob.glob(entry, recursive=True) if match.endswith(ROWS_FILES))
    return [path for path in dict.fromkeys(found) if _is_rows(path)]


def row_config(params: str | None):
    """The core config a row ran, from its ``params`` column (``config_fields`` as JSON, sources as
    pairs); None for a row without one (greedy, transformers' decoders)."""
    from lookahead_core.config import LookaheadConfig

    fields = json.loads(params) if isinstance(params, str) and params not in ("", "null") else None
    if not fields:
        return None
    return LookaheadConfig(**{**fields, "sources": dict(map(tuple, fields.get("sources") or []))})


def _is_rows(path: Path) -> bool:
    """A job's rows (not a summary table written beside them)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        header = handle.readline()
    return {"item_id", "decoder", "decode_s"} <= set(header.strip().split(","))


def load_results(paths: Iterable[str | Path]) -> pd.DataFrame:
    """All rows of the CSVs under ``paths``, with booleans as pandas' nullable ``boolean``;
    columns an older file lacks are empty."""

    files = find_csvs(paths)
    if not files:
        raise FileNotFoundError(f"no result CSVs under {list(map(str, paths))}")
    frames = [pd.read_csv(path, dtype={column: str for column in TEXT_COLUMNS + BOOL_COLUMNS},
                          keep_default_na=False, na_values=[""]) for path in files]
    # A job killed before its first item leaves a header alone; its all-empty columns would turn
    # every numeric column of the others into objects.
    df = pd.concat([frame for frame in frames if len(frame)] or frames[:1], ignore_index=True)
    for column in COLUMNS:
        if column not in df:
            df[column] = pd.Series([None] * len(df), dtype=object if column in TEXT_COLUMNS + BOOL_COLUMNS else float)
    for column in BOOL_COLUMNS:
        df[column] = df[column].map({"True": True, "False": False}).astype("boolean")
    return df


def one_setup(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` as one run setup: rows resumed by a later version of the code carry another config tag
    and settings hash, but pool with the earlier ones (one folder of a lineup is one setup)."""
    return df.assign(**{key: "+".join(dict.fromkeys(df[key].astype(str))) for key in ("config", "settings")})


def summarize(df: pd.DataFrame, by: Sequence[str] = GROUP, baseline: str | None = None,
              with_baseline: bool = False) -> pd.DataFrame:
    """The one summary of rows: one row per group of ``by`` (the run setup unless told) and decoder
    under test, against the group's baseline rows: those flagged ``baseline``, or ``baseline``'s rows
    where a decoder is named. ``with_baseline``: the baseline's own row first in each group (a group
    that ran only its baseline reports on the baseline itself either way)."""
    rows = []
    for keys, group in df.groupby(list(by), sort=True):
        keys = keys if isinstance(keys, tuple) else (keys,)
        is_base = group["decoder"] == baseline if baseline else group["baseline"].fillna(False).astype(bool)
        base = group[is_base]
        tested = list(dict.fromkeys(group.loc[~is_base, "decoder"]))
        bases = list(dict.fromkeys(base["decoder"]))
        for decoder in (bases if with_baseline or not tested else []) + tested:
            rows.append(summarize_decoder(keys, base, group[group["decoder"] == decoder], by))
    return pd.DataFrame(rows)


def summarize_decoder(keys: tuple, base: pd.DataFrame, tested: pd.DataFrame, by: Sequence[str] = GROUP) -> dict:
    """One row of :func:`summarize`: the rows ``tested`` (one decoder) of the group ``keys`` (values of
    ``by``), paired per item, turn and seed with the baseline rows ``base`` for speedups and quality
    differences. Where ``tested`` is the baseline itself, the row has no ``against``, speedup or
    ``_base`` keys. Keys come in a fixed order; the quality ones only where the rows have those metrics."""
    row = dict(zip(by, keys, strict=True))
    calls = _calls(tested)
    row.update(
        decoder=tested["decoder"].iloc[0],
        max_new_tokens=int(tested["max_new_tokens"].iloc[0]),
        items=tested["item_id"].nunique(),
        rows=len(tested),
        seeds=tested["seed"].nunique(),
        new_tokens=tested["new_tokens"].mean(),
        S=compression(tested),
        S_mean=tested["S"].mean(),
        tokens_per_step=tested["step_tokens_mean"].mean(),
        tok_s=_ratio(tested["new_tokens"].sum(), tested["decode_s"].sum()),   # per sequence
        batch_size=int(tested["batch_size"].fillna(1).max()),
        calls=len(calls),
        call_new_tokens=calls["batch_new_tokens"].sum(),
        call_decode_s=calls["decode_s"].sum(),
        throughput=_ratio(calls["batch_new_tokens"].sum(), calls["decode_s"].sum()),
        tok_s_median=tested["tokens_per_s"].median(),
        tok_s_q1=tested["tokens_per_s"].quantile(0.25),
        tok_s_q3=tested["tokens_per_s"].quantile(0.75),
        matches_greedy=tested["matches_greedy"].astype("Float64").mean(),
        overhead=tested["overhead_frac"].mean(),
    )
    row.update(_quality(tested, suffix=""))
    if not set(tested["decoder"]) <= set(base["decoder"]):
        paired = tested.merge(base, on=PAIR_WITH_BASELINE, suffixes=("", "_base"))
        row.update(
            against=base["decoder"].iloc[0] if len(base) else None,
            tok_s_base=_ratio(paired["new_tokens_base"].sum(), paired["decode_s_base"].sum()),
            speedup=_ratio(paired["decode_s_base"].sum(), paired["decode_s"].sum()),
            speedup_median=(paired["decode_s_base"] / paired["decode_s"]).median(),
            speedup_e2e=_ratio(paired["wall_s_base"].sum(), paired["wall_s"].sum()),
        )
        row.update(_quality(base, suffix="_base"))
        for kind in ROUGE_TYPES:
            both = paired[[kind, f"{kind}_base"]].dropna()
            if len(both):
                diff = both[kind] - both[f"{kind}_base"]
                row[f"{kind}_diff"] = diff.mean()
                row[f"{kind}_diff_lo"], row[f"{kind}_diff_hi"] = bootstrap_ci(diff.to_numpy())
    return row


def compression(rows: pd.DataFrame) -> float:
    """S: tokens after each row's first (which the prefill makes) per verification forward."""
    steps = rows["steps"].sum()
    return (rows["new_tokens"] - 1).clip(lower=0).sum() / steps if steps else 1.0


def twins(rows: pd.DataFrame) -> pd.DataFrame:
    """``model.linear=both`` rows (decoders ``<name>@<kernel>``) with ``name`` and ``kernel`` columns."""
    rows = rows[rows["decoder"].str.contains("@", regex=False)]
    name_kernel = rows["decoder"].str.rsplit("@", n=1)
    return rows.assign(name=name_kernel.str[0], kernel=name_kernel.str[1])


def _calls(rows: pd.DataFrame) -> pd.DataFrame:
    """One row per generate call (a batch, or a row of its own at batch size 1): its new tokens, every
    sequence of its batch (``batch_new_tokens``), and its ``decode_s``. Rows written before the batch
    columns count as calls of one sequence each."""
    solo = rows["batch"].isna()
    calls = rows.assign(batch_size=rows["batch_size"].fillna(1),
                        batch=rows["batch"].where(~solo, -1.0 - pd.Series(range(len(rows)), index=rows.index)),
                        batch_new_tokens=rows["batch_new_tokens"].where(~solo, rows["new_tokens"]))
    return calls.drop_duplicates(["batch_size", "batch", "turn", "seed"])   # a file may hold several sizes


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def _quality(rows: pd.DataFrame, suffix: str) -> dict:
    quality = {}
    for kind in ROUGE_TYPES:
        values = rows[kind].dropna()
        if len(values):
            quality[f"{kind}{suffix}"] = values.mean()
            quality[f"{kind}{suffix}_lo"], quality[f"{kind}{suffix}_hi"] = bootstrap_ci(values.to_numpy())
    scored = rows[rows["passed"].notna()]
    if len(scored):
        samples = {item: list(group["passed"].astype(bool)) for item, group in scored.groupby("item_id")}
        quality.update({f"{name}{suffix}": value for name, value in pass_at_k_report(samples, PASS_KS).items()})
    return quality


def divergence_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per dtype, model and decoding config: greedy rows compared with their baseline, how many
    differ, and their verdicts (``near_tie``: within the dtype's numerical noise, ``mismatch``: the
    baseline was confident, ``earlier_turn``: the conversation already differed in an earlier turn)."""
    compared = df[df["matches_greedy"].notna()]
    lines = []
    for (dtype, model, config, decoder), group in compared.groupby(["dtype", "model", "config", "decoder"], sort=True):
        verdicts = group["diff_verdict"].value_counts()
        differ = int((~group["matches_greedy"].astype(bool)).sum())
        near = int(verdicts.get("near_tie", 0))
        lines.append({"dtype": dtype, "model": model, "config": config, "decoder": decoder, "rows": len(group),
                      "differ": differ,
                      "near_tie": near, "mismatch": int(verdicts.get("mismatch", 0)),
                      "earlier_turn": int(verdicts.get("earlier_turn", 0)),
                      "near_tie_share": near / differ if differ else None})
    return pd.DataFrame(lines)


def to_markdown(table: pd.DataFrame, columns: Sequence[str] | None = None) -> str:
    """A GitHub markdown table of the columns that exist and hold a value."""
    return markdown(table, columns, drop_empty=True)


# ---------------------------------------------------------------------------------------------
# Plots


def plot_scaling(df: pd.DataFrame, out_dir: Path) -> list[Path]:
    """S against W, one line per N, per experiment x model x decoder (the paper's scaling curve).

    Drawn only where at least two windows ran; points average over items and any other setting.
    """
    windowed = df[~df["baseline"].fillna(False) & df["W"].notna()]
    paths = []
    for (experiment, model, decoder), group in windowed.groupby(["experiment", "model", "decoder"]):
        if group["W"].nunique() < 2:
            continue
        curves = group.groupby(["N", "W"])["S"].mean().unstack("N").sort_index()   # rows W, columns N
        fig, ax = _figure(figsize=(5, 3.5))
        for n in curves.columns:
            ax.plot(curves.index, curves[n], marker="o", label=f"N={int(n)}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(curves.index, [str(int(w)) for w in curves.index])
        ax.set(xlabel="window W", ylabel="step compression S", title=f"{experiment} / {model} / {decoder}")
        ax.legend()
        paths.append(_save(fig, out_dir / f"scaling_{experiment}_{model}_{decoder}.png"))
    return paths


def plot_speedup(table: pd.DataFrame, out_dir: Path) -> Path | None:
    """Speedup over the baseline per experiment/model (groups) and decoding config (bars)."""
    if "speedup" not in table or table["speedup"].isna().all():
        return None
    rows = table[table["speedup"].notna()].assign(run=lambda t: t["experiment"] + "\n" + t["model"])
    rows = rows.assign(label=_labels(rows))
    pivot = rows.pivot_table(index="run", columns="label", values="speedup", aggfunc="mean")
    fig, ax = _figure(figsize=(max(5, 1.2 * len(pivot) + 0.4 * pivot.size), 4))
    pivot.plot.bar(ax=ax, rot=0)
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set(xlabel="", ylabel="speedup (baseline / decoder time)")
    ax.legend(fontsize="small")
    return _save(fig, out_dir / "speedup.png")


def histogram(column: pd.Series) -> Counter[int]:
    """The per-step histograms of a rows column (``accepted_hist``, ``step_tokens_hist``: JSON
    objects of count by size) summed over its rows; empty cells are skipped."""
    counts: Counter[int] = Counter()
    for hist in column.dropna():
        counts.update({int(k): v for k, v in json.loads(hist).items()})
    return counts


def plot_accepted(df: pd.DataFrame, out_dir: Path) -> Path | None:
    """Share of decoding steps by tokens accepted per step, per experiment x model x decoding config."""
    cand = df[~df["baseline"].fillna(False)]
    if cand.empty:
        return None
    cand = cand.assign(label=cand["experiment"] + "/" + cand["model"] + ": " + _labels(cand))
    shares = {}
    for label, group in cand.groupby("label"):
        counts = histogram(group["accepted_hist"])
        total = sum(counts.values())
        shares[label] = {k: v / total for k, v in counts.items()} if total else {}
    frame = pd.DataFrame(shares).sort_index().fillna(0.0)
    fig, ax = _figure(figsize=(max(5, 0.5 * len(frame) * max(1, len(shares) / 2)), 3.5))
    frame.plot.bar(ax=ax, rot=0)
    ax.set(xlabel="tokens accepted in a step", ylabel="share of steps")
    ax.legend(fontsize="small")
    return _save(fig, out_dir / "accepted_hist.png")


def _labels(rows: pd.DataFrame) -> pd.Series:
    """The config tag for a setup with one decoder under test, else the decoder's name; plus the
    settings hash where one label ran with several settings."""
    tested = rows[~rows["baseline"].fillna(False)] if "baseline" in rows else rows
    decoders = tested.groupby(["config", "settings"])["decoder"].nunique()
    several_decoders = rows.set_index(["config", "settings"]).index.map(lambda key: decoders.get(key, 1) > 1)
    label = pd.Series(list(rows["decoder"].where(several_decoders, rows["config"])), index=rows.index)
    several = label.groupby(label).transform(lambda part: rows.loc[part.index, "settings"].nunique() > 1)
    return label.where(~several, label + " [" + rows["settings"] + "]")


def _figure(figsize: tuple[float, float]) -> tuple[Figure, object]:
    """A figure outside pyplot: no GUI backend, nothing global, nothing to close."""
    fig = Figure(figsize=figsize, layout="tight")
    return fig, fig.subplots()


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path


# ---------------------------------------------------------------------------------------------
# The report


def write_report(paths: Iterable[str | Path], out_dir: str | Path) -> Path:
    """``report.md`` (tables and plot links) and ``summary.csv`` in ``out_dir``; returns the markdown."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    df = load_results(paths)
    table = summarize(df)
    table.to_csv(out / "summary.csv", index=False)
    plots = [*plot_scaling(df, out), plot_speedup(table, out), plot_accepted(df, out)]
    reliability = draft_reliability(df)
    if not reliability.empty:
        reliability.to_csv(out / "draft_reliability.csv", index=False)
        plot_reliability(reliability, out / "reliability.png", "all rows")
        plots.append(out / "reliability.png")
    calibration = auto_calibration(find_csvs(paths))
    sections = [
        "# Lookahead decoding results",
        f"{len(df)} rows from {df.groupby(GROUP).ngroups} run setups.",
        "## Speed\n\n" + to_markdown(table, SUMMARY_COLUMNS),
        "## Quality\n\n" + _quality_section(table),
        "## Divergence from greedy\n\nGreedy rows that differ from their baseline, judged at the first "
        "differing token by the baseline's top-2 logit margin (lookahead_core/numerics.py: `near_tie` "
        "below the dtype's tolerance, else `mismatch`).\n\n" + to_markdown(divergence_table(df)),
        *(["## Spec-Bench layout\n\nSpeedup over the baseline per task and overall in two definitions, one row "
            "each (wall time includes the prefill, as Spec-Bench times a generation): " + leaderboard_note()
            + ". Mean accepted tokens per step; the last rows count the items and turns per column.\n\n"
            + leaderboard_markdown(leaderboard(df[df["dataset"] == "specbench"]))]
          if (df["dataset"] == "specbench").any() else []),
        *(["## Linear kernels (`model.linear=both`)\n\nEach decoder on PyTorch's linear layers (`stock`) and on "
            "the streaming CPU kernel (`stream`) in the same job, interleaved on the same items; every speedup "
            "is over the stock greedy baseline (`docs/cpu_kernels.md`).\n\n" + to_markdown(kernels)]
          if len(kernels := kernel_table(table)) else []),
        *(["## Each kernel on its own: decoders against greedy per category\n\nOn the items every decoder of a "
            "kernel ran, the ratio of greedy's summed decoding time to the decoder's on the same layers "
            "(`vs_greedy`) and of the fastest other decoder's (`vs_best`, named in `best`); below 1 is slower.\n\n"
            + to_markdown(layers)] if len(layers := same_layers_table(df)) else []),
        *(["## `auto`: what calibrating cost beside the decoding it tuned\n\n" + AUTO_NOTE + "\n\n"
            + to_markdown(calibration)] if len(calibration) else []),
        *(["## Draft estimates: predicted against observed acceptance\n\nPer decoder (all its setups) and "
            "source, each tried node binned by the decile of the estimate its step was cut with "
            "(`docs/auto.md`); `reliability.png` draws it.\n\n" + to_markdown(reliability)]
          if not reliability.empty else []),
        "## Plots\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in plots if p is not None),
    ]
    report = out / "report.md"
    report.write_text("\n\n".join(sections) + "\n", encoding="utf-8")
    return report


def kernel_table(table: pd.DataFrame) -> pd.DataFrame:
    """Setups run with ``model.linear=both`` (decoders ``<name>@stock`` and ``<name>@stream``):
    per setup and decoder, speedup and S on each kernel side by side, every speedup over the
    setup's baseline (the stock twin of its greedy baseline, so the greedy stock row is 1 by
    definition), ``stream/stock``, what the kernel alone changes for that decoder, and ``gap_<kernel>``
    = S - speedup, what the steps' width costs: a step feeding k tokens at the cost of one closes it."""
    if "speedup" not in table or not table["decoder"].str.contains("@", regex=False).any():
        return pd.DataFrame()
    rows = twins(table)
    base = rows.dropna(subset=["against"]).drop_duplicates(["experiment", "model", "settings"])
    greedy = base.assign(decoder=base["against"], kernel="stock", speedup=1.0, S=1.0, matches_greedy=None,
                         name=base["against"].str.rsplit("@", n=1).str[0])
    rows = pd.concat([greedy, rows], ignore_index=True)
    out = []
    for (experiment, model, _, name), group in rows.groupby(["experiment", "model", "settings", "name"], sort=False):
        by = group.set_index("kernel")
        if not {"stock", "stream"} <= set(by.index):
            continue
        out.append({"experiment": experiment, "model": model, "decoder": name, "items": int(group["items"].max()),
                    "speedup_stock": by.at["stock", "speedup"], "speedup_stream": by.at["stream", "speedup"],
                    "stream/stock": by.at["stream", "speedup"] / by.at["stock", "speedup"],
                    "S_stock": by.at["stock", "S"], "S_stream": by.at["stream", "S"],
                    "gap_stock": by.at["stock", "S"] - by.at["stock", "speedup"],
                    "gap_stream": by.at["stream", "S"] - by.at["stream", "speedup"],
                    "matches_greedy": group["matches_greedy"].astype("Float64").mean()})
    return pd.DataFrame(out).sort_values(["experiment", "model"], kind="stable", ignore_index=True) if out \
        else pd.DataFrame()


def same_layers_table(df: pd.DataFrame) -> pd.DataFrame:
    """Rows of ``model.linear=both`` jobs, each kernel on its own: per (experiment, model, kernel,
    category) every decoder's summed ``decode_s`` against greedy's on the same layers (``vs_greedy``)
    and against the fastest other decoder's (``vs_best``, which one in ``best``), on the items every
    decoder of the kernel ran; ``S`` = tokens after the first per verification forward. Categories
    are Spec-Bench's tasks on its rows, the items' own elsewhere, then ``all``. ``vs_greedy`` below 1
    is a decoder slower than greedy on that kernel (issue 61's check: ``auto`` never is)."""
    from experiments.data.datasets import SPEC_BENCH_TASK_OF

    rows = twins(df)
    rows["group"] = rows["category"].where(rows["dataset"] != "specbench", rows["category"].map(SPEC_BENCH_TASK_OF))
    greedy_of = rows[rows["baseline"].fillna(False)].groupby(["experiment", "model"])["name"].first()
    out = []
    for (experiment, model, kernel), job in rows.groupby(["experiment", "model", "kernel"], sort=False):
        names = list(dict.fromkeys(job["name"]))
        greedy = greedy_of.get((experiment, model))
        job = job[job.groupby(PAIR_WITH_BASELINE)["name"].transform("nunique") == len(names)]
        if greedy not in names or job.empty:
            continue
        for category, part in [*job.groupby("group", sort=True), ("all", job)]:
            decode = part.groupby("name", sort=False)["decode_s"].sum()
            for name in names:
                if name == greedy:
                    continue
                others = decode.drop(name)
                out.append({"experiment": experiment, "model": model, "kernel": kernel, "category": category,
                            "decoder": name, "items": part[PAIR_WITH_BASELINE].drop_duplicates().shape[0],
                            "S": compression(part[part["name"] == name]), "vs_greedy": decode[greedy] / decode[name],
                            "best": others.idxmin(), "vs_best": others.min() / decode[name]})
    return pd.DataFrame(out)


AUTO_NOTE = ("`calibration_s`: what the job spent preparing the decoder (latency curve, calibration decodes; a pick "
             "reused from the cache costs only its lookup); `pick_calibration_s`: what the pick cost when it was "
             "made; `decode_s`: the decoder's summed decoding time over the job's rows; `share` = calibration_s / "
             "decode_s.")


def auto_calibration(files: Sequence[Path]) -> pd.DataFrame:
    """Per ``auto`` decoder of each results file (its record beside it, ``<csv>.<name>.json``): the
    pick, the protocol, this job's calibration seconds against the decoder's decoding seconds."""
    rows = []
    for path in files:
        base = sidecar(path, "").name                  # x.csv and x.csv.gz: records are x.<name>.json
        for record_path in sorted(path.parent.glob(base + ".*.json")):
            name = record_path.name[len(base) + 1:-len(".json")]
            record = json.loads(record_path.read_text())
            if "chosen" not in record:
                continue
            rows_of_file = load_results([path])
            mine = rows_of_file[rows_of_file["decoder"] == name]
            decode_s = float(mine["decode_s"].sum())
            spent = record.get("job_calibration_seconds",             # older records: the pick's own, unless reused
                                None if "reused_from" in record else record.get("calibration_seconds"))
            rows.append({"experiment": mine["experiment"].iloc[0] if len(mine) else None,
                         "model": mine["model"].iloc[0] if len(mine) else None, "decoder": name,
                         "protocol": record.get("protocol", "grid"), "pick": record["chosen"],
                         "reused": "reused_from" in record, "calibration_s": spent,
                         "pick_calibration_s": record.get("calibration_seconds"), "items": mine["item_id"].nunique(),
                         "decode_s": decode_s, "share": spent / decode_s if decode_s and spent is not None else None})
    return pd.DataFrame(rows)


def _quality_section(table: pd.DataFrame) -> str:
    if not any(column in table for column in QUALITY_COLUMNS):
        return "No quality metric applies to these datasets (ROUGE: cnndm, xsum; pass@k: code)."
    sections = [to_markdown(table, ["experiment", "model", "config", *QUALITY_COLUMNS])]
    rouge = rouge_table(table)
    if not rouge.empty:
        sections.append("ROUGE F1 with 95% bootstrap intervals; 'difference' is decoder minus baseline, "
                        "paired per row (an interval containing 0: no measurable difference).\n\n"
                        + markdown(rouge))
    return "\n\n".join(sections)


def rouge_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per run setup and ROUGE type: decoder, baseline and paired difference as 'mean [lo, hi]'."""
    def cell(row: pd.Series, column: str) -> str:
        if column not in row or pd.isna(row[column]):
            return ""
        return f"{row[column]:.3f} [{row[f'{column}_lo']:.3f}, {row[f'{column}_hi']:.3f}]"

    lines = []
    for _, row in table.iterrows():
        for kind in ROUGE_TYPES:
            if kind in row and pd.notna(row[kind]):
                lines.append({"experiment": row["experiment"], "model": row["model"], "config": row["config"],
                              "items": row["items"], "ROUGE": kind, "decoder": cell(row, kind),
                              "baseline": cell(row, f"{kind}_base"), "difference": cell(row, f"{kind}_diff")})
    return pd.DataFrame(lines)


# ---------------------------------------------------------------------------------------------
# One job's summary (printed at the end of every run), Spec-Bench's leaderboard


def job_summary(path: Path, df: pd.DataFrame) -> str:
    """The table of one results CSV (``df``, as read by :func:`load_results`), its plot (written
    beside it) and a line on what it means."""
    table = summarize(df)
    plot = plot_job(table, sidecar(path, ".png"))
    parts = [to_markdown(table, SUMMARY_COLUMNS)]
    if (df["dataset"] == "specbench").any():
        parts.append("Spec-Bench layout (speedup over the baseline per task, in two definitions: "
                     + leaderboard_note() + "):\n\n" + leaderboard_markdown(leaderboard(df)))
    kernels = kernel_table(table)
    if len(kernels):
        parts.append("Each decoder on both linear kernels (speedups over the stock greedy baseline):\n\n"
                     + to_markdown(kernels))
    if plot is not None:
        parts.append(f"plot: {plot}")
    parts.append(verdict(table))
    return "\n\n".join(parts)


def plot_job(table: pd.DataFrame, path: Path) -> Path | None:
    """Speedup over the baseline per decoder, with S and pass@1 (where scored) on the bars."""
    rows = table[table.get("speedup", pd.Series(dtype=float)).notna()] if "speedup" in table else table.iloc[0:0]
    if rows.empty:
        return None
    fig, ax = _figure(figsize=(max(4.0, 1.1 * len(rows) + 1.5), 3.6))
    ax.bar(rows["decoder"], rows["speedup"], color="tab:blue")
    ax.axhline(1.0, color="black", linewidth=0.8)
    for x, (_, r) in enumerate(rows.iterrows()):
        note = f"{r['speedup']:.2f}x\nS={r['S']:.2f}"
        if "pass@1" in r and pd.notna(r["pass@1"]):
            note += f"\npass@1={r['pass@1']:.2f}"
        ax.annotate(note, (x, r["speedup"]), ha="center", va="bottom", fontsize=7)
    base = rows["against"].iloc[0] if "against" in rows else "the baseline"
    first = rows.iloc[0]
    ax.set(ylabel=f"speedup over {base} (decode time)", ylim=(0, max(1.3, rows["speedup"].max() * 1.35)),
           title=f"{first['experiment']} / {first['model']}, {int(rows['items'].max())} items")
    return _save(fig, path)


def verdict(table: pd.DataFrame) -> str:
    """One line on what the speedups mean on the machine that measured them."""
    if "speedup" not in table or table["speedup"].isna().all():
        return "Only the baseline ran: nothing to compare."
    rows = table[table["speedup"].notna()]
    best = rows.loc[rows["speedup"].idxmax()]
    base = best.get("against", "the baseline")
    line = (f"On this {best['device']} machine {best['decoder']} is fastest at {best['speedup']:.2f}x {base} "
            f"({best['S']:.2f} tokens per forward)")
    if best["speedup"] < 1:
        line = f"On this {best['device']} machine nothing beats {base}; the best is {best['decoder']} at {best['speedup']:.2f}x"
    slow = rows[(rows["S"] > 1.05) & (rows["speedup"] < 1)]
    if len(slow):
        worst = slow.loc[slow["speedup"].idxmin()]
        line += (f"; {worst['decoder']} commits {worst['S']:.2f} tokens per forward yet runs at {worst['speedup']:.2f}x: "
                 "on this device what a step adds (a wider forward, or a draft model's forwards) costs more "
                 "than the forwards it saves (on a GPU a forward of tens of tokens costs about what one of "
                 "one token does, so S turns into speedup)")
    return line + "."


# The two speedup definitions the Spec-Bench layout shows, as its ``speedup`` column labels them.
SPEC_BENCH_SPEEDUP = "Spec-Bench: mean tok/s ratio"
SUMMED_TIME_SPEEDUP = "ours: summed time ratio"
SPEEDUP_DEFINITIONS = {
    SPEC_BENCH_SPEEDUP: "Spec-Bench's evaluation/speed.py: per item, new tokens / wall time (prefill included), "
                        "its turns pooled; the mean over the items of the decoder's rate divided by the mean of "
                        "the baseline's",
    SUMMED_TIME_SPEEDUP: "this harness's: the baseline's wall time (prefill included) summed over the turns, "
                         "divided by the decoder's",
}
COUNT_ROWS = ("items per column", "turns per column")


def spec_bench_speedup(paired: pd.DataFrame) -> float:
    """Spec-Bench's speedup (``evaluation/speed.py``) of paired rows (a decoder's columns beside
    the baseline's ``*_base``): per sample (item and seed; a multi-turn item's turns pooled),
    tokens per second = summed new tokens / summed wall time; the mean of the decoder's rates over
    the samples divided by the mean of the baseline's."""
    if paired.empty:
        return float("nan")
    sums = paired.groupby(["item_id", "seed"])[["new_tokens", "wall_s", "new_tokens_base", "wall_s_base"]].sum()
    rate = (sums["new_tokens"] / sums["wall_s"]).mean()
    base = (sums["new_tokens_base"] / sums["wall_s_base"]).mean()
    return _ratio(rate, base)


def summed_time_speedup(paired: pd.DataFrame) -> float:
    """This harness's speedup of paired rows: the baseline's summed wall time over the decoder's."""
    return _ratio(paired["wall_s_base"].sum(), paired["wall_s"].sum()) if len(paired) else float("nan")


def leaderboard(df: pd.DataFrame) -> pd.DataFrame:
    """Spec-Bench's leaderboard layout: per decoder, the speedup over the baseline on each task and
    overall, in both definitions (:data:`SPEEDUP_DEFINITIONS`), one row each, its ``speedup``
    column naming the definition: Spec-Bench's (mean per-item tokens/s over the baseline's) and
    this harness's (ratio of summed wall time); wall time includes the prefill in both, as
    Spec-Bench times a generation. ``#Mean Accepted Tokens`` is tokens after the first /
    verification forwards. The ``items per column`` and ``turns per column`` rows count the samples
    of each column (Spec-Bench averages over items)."""
    from experiments.data.datasets import SPEC_BENCH_TASK_OF, SPEC_BENCH_TASKS

    df = df.assign(task=df["category"].map(SPEC_BENCH_TASK_OF))
    base = df[df["baseline"].fillna(False)]
    lines = []
    for decoder, rows in df[~df["baseline"].fillna(False)].groupby("decoder", sort=False):
        paired = rows.merge(base, on=PAIR_WITH_BASELINE, suffixes=("", "_base"))
        accepted = compression(rows)
        for label, speedup in ((SPEC_BENCH_SPEEDUP, spec_bench_speedup), (SUMMED_TIME_SPEEDUP, summed_time_speedup)):
            line: dict[str, object] = {"decoder": decoder, "speedup": label}
            for task in SPEC_BENCH_TASKS:
                part = paired[paired["task"] == task]
                line[task] = speedup(part) if len(part) else None
            line["#Mean Accepted Tokens"] = accepted
            line["Overall"] = speedup(paired)
            lines.append(line)
    counts = []
    for name, count in zip(COUNT_ROWS, (lambda part: part[["item_id", "seed"]].drop_duplicates().shape[0], len)):
        row: dict[str, object] = {"decoder": name, "speedup": None}
        row.update({task: int(count(base[base["task"] == task])) for task in SPEC_BENCH_TASKS})
        row.update({"#Mean Accepted Tokens": None, "Overall": int(count(base))})
        counts.append(row)
    return pd.DataFrame([*lines, *counts])


def leaderboard_note() -> str:
    """What the ``speedup`` labels of :func:`leaderboard` mean, for the table's caption."""
    return "; ".join(f"`{label}` = {text}" for label, text in SPEEDUP_DEFINITIONS.items())


def leaderboard_markdown(table: pd.DataFrame) -> str:
    """The leaderboard as Spec-Bench prints it: speedups as ``1.23x``, counts as integers."""
    def cell(value: object, column: str, counts: bool) -> str:
        if value is None or pd.isna(value):
            return ""
        if column == "speedup":
            return str(value)
        if counts:
            return str(int(value))
        return f"{value:.2f}" if column == "#Mean Accepted Tokens" else f"{value:.2f}x"

    shown = table.astype(object).copy()
    for index, row in table.iterrows():
        counts = row["decoder"] in COUNT_ROWS
        for column in table.columns[1:]:
            shown.at[index, column] = cell(row[column], column, counts)
    return markdown(shown)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", default=["results/raw"], help="CSV files, directories or globs")
    parser.add_argument("--out", default="results/report", help="folder for report.md, summary.csv and plots")
    args = parser.parse_args(argv)
    report = write_report(args.paths, args.out)
    print(report.read_text(encoding="utf-8"))
    print(f"written: {report}")


if __name__ == "__main__":
    main()

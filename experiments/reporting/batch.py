"""Throughput against batch size, as tables and a plot over a results folder of ``suite=batch`` jobs.

    python run.py -m suite=batch experiment=mtbench,humaneval batch_size=1,2,4,8,16 results_dir=results/batch
    python -m experiments.tools.batch_latency out=results/batch       # t(B, k), for the cost-model views
    python -m experiments.reporting.batch results/batch               # rows.csv.gz, summary.csv, summary.md, plot
    python -m experiments.reporting.batch results/batch --roofline    # onto assumed hardware: roofline.md

The jobs' rows (every result CSV under the folder, one row per sequence per decoder, the baseline
``hf_greedy``: ``conf/suite/batch.yaml``) become ``rows.csv.gz`` in this view's columns (each sequence's
per-step record included). Per dataset, decoder and B: tokens/s = the batches' new tokens / their
``decode_s`` (sum over sum), and the speedup over ``hf_greedy``'s tokens/s on the same batches;
where lookahead stops paying; the plot of speedup against B. With ``<folder>/latency_batch.csv``
(t(B, k), ``experiments.tools.batch_latency``) also the cost model's predicted-vs-measured speedup
over core greedy per batch, ``auto``'s pick per B calibrated on the B = 1 sequences, and t(B, k).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from lookahead_core import LookaheadConfig
from lookahead_core import cost as cm

from experiments.reporting import report as harness_report
from experiments.reporting.tables import markdown

BASELINE = "hf_greedy"           # conf/suite/batch.yaml's baseline and its core greedy decoder
CORE_GREEDY = "core_greedy"
COLUMNS = ("dataset", "B", "batch", "decoder", "item_id", "composition", "prompt_tokens", "new_tokens", "steps",
           "S", "step_tokens", "accepted", "batch_new_tokens", "batch_forwards", "batch_decode_s", "batch_wall_s",
           "batch_tokens_per_s", "matches_hf_greedy", "lookahead", "max_new_tokens", "threads", "load_avg")
LATENCY_FILE = "latency_batch.csv"     # t(B, k), written by experiments.tools.batch_latency


def bench_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The jobs' harness rows (``report.load_results``) in this view's columns (:data:`COLUMNS`), one
    per sequence per decoder."""
    log = df["step_log"].map(lambda text: json.loads(text) if isinstance(text, str) else None)
    params = df["params"].map(lambda text: json.loads(text) if isinstance(text, str) else None)
    rows = pd.DataFrame({
        "dataset": df["dataset"], "B": df["batch_size"].astype(int), "batch": df["batch"].astype(int),
        "decoder": df["decoder"], "item_id": df["item_id"], "composition": df["batch_items"],
        "prompt_tokens": df["prompt_tokens"], "new_tokens": df["new_tokens"], "steps": df["steps"],
        "S": df["S"].where(df["family"] == "core"),
        "step_tokens": log.map(lambda entry: json.dumps(entry["fed"]) if entry else None),
        "accepted": log.map(lambda entry: json.dumps(entry["accepted"]) if entry else None),
        "batch_new_tokens": df["batch_new_tokens"], "batch_forwards": df["forwards"],
        "batch_decode_s": df["decode_s"], "batch_wall_s": df["wall_s"],
        "batch_tokens_per_s": df["batch_new_tokens"] / df["decode_s"],
        "matches_hf_greedy": df["matches_greedy"].fillna(True).astype(bool),
        "lookahead": params.map(lambda config: json.dumps(config) if config else None),
        "max_new_tokens": df["max_new_tokens"], "threads": df["threads"], "load_avg": df["load_avg"],
    }, columns=list(COLUMNS))
    return rows.sort_values(["dataset", "B", "batch", "decoder", "item_id"], kind="stable").reset_index(drop=True)


def configs(df: pd.DataFrame) -> dict[str, LookaheadConfig | None]:
    """Each decoder's core config, from its rows' ``lookahead`` column (its params; None: greedy)."""
    return {name: harness_report.row_config(group["lookahead"].dropna().iloc[0] if group["lookahead"].notna().any() else None)
            for name, group in df.groupby("decoder")}


def load_costs(path: Path) -> dict[int, cm.CostModel]:
    df = pd.read_csv(path)
    return {int(B): cm.CostModel.from_rows(group.to_dict("records")) for B, group in df.groupby("batch")}


def summarize(raw: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, decoder and B, from the jobs' harness rows (``report.load_results``) through the
    harness's summary (``report.summarize``, grouped by dataset and B): tokens/s (the batches' new
    tokens / their decode time, sum over sum), the speedup over hf_greedy's tokens/s on the same
    batches, mean per-sequence S of the core decoders, the share of sequences identical to hf_greedy."""
    raw = raw.sort_values(["batch", "item_id"], kind="stable")     # sums in the order of rows.csv.gz
    table = harness_report.summarize(raw, by=["dataset", "batch_size"], with_baseline=True)
    core = set(raw.loc[raw["family"] == "core", "decoder"])
    base = table[table.decoder == BASELINE].set_index(["dataset", "batch_size"])["throughput"]
    return pd.DataFrame({
        "dataset": table["dataset"], "decoder": table["decoder"], "B": table["batch_size"].astype(int),
        "batches": table["calls"], "new_tokens": table["call_new_tokens"], "decode_s": table["call_decode_s"],
        "tokens_per_s": table["throughput"], "S": table["S_mean"].where(table["decoder"].isin(core)),
        "identical": table["matches_greedy"].fillna(1.0).astype(float),
        "speedup": table["throughput"] / [base[key] for key in zip(table["dataset"], table["batch_size"])],
    }).sort_values(["dataset", "decoder", "B"]).reset_index(drop=True)


def predictions(df: pd.DataFrame, costs: dict[int, cm.CostModel]) -> pd.DataFrame:
    """Per batch and core decoder: the measured speedup over core greedy and the cost model's
    prediction from the batch's own per-step records and t(B, k)."""
    rows = []
    known = configs(df)
    core = df[df.decoder != BASELINE]
    for (dataset, B, index), group in core.groupby(["dataset", "B", "batch"]):
        greedy = group[group.decoder == CORE_GREEDY]
        if greedy.empty:
            continue
        for name, runs in group.groupby("decoder"):
            if name == CORE_GREEDY:
                continue
            steps = [json.loads(s) for s in runs.step_tokens]
            accepted = [json.loads(a) for a in runs.accepted]
            rows.append({"dataset": dataset, "B": B, "batch": index, "decoder": name,
                         "predicted": cm.predict_batch(costs, known[name], steps, accepted),
                         "measured": greedy.batch_decode_s.iloc[0] / runs.batch_decode_s.iloc[0]})
    table = pd.DataFrame(rows)
    return table.groupby(["dataset", "decoder", "B"])[["predicted", "measured"]].median().reset_index()


def auto_choices(df: pd.DataFrame, costs: dict[int, cm.CostModel], summary: pd.DataFrame) -> pd.DataFrame:
    """``auto`` per batch size: calibrated on the B = 1 runs (each sequence's per-step record), the
    pick per B, against the decoder measured fastest at that B."""
    rows = []
    known = configs(df)
    for dataset, group in df[df.B == df.B.min()].groupby("dataset"):
        calibration = {name: (known[name], [(json.loads(r.step_tokens), json.loads(r.accepted))
                                            for r in runs.itertuples()])
                       for name, runs in group.groupby("decoder") if name not in (BASELINE, CORE_GREEDY)}
        for B in sorted(df[df.dataset == dataset].B.unique()):
            pick, predicted = cm.choose_for_batch(costs, calibration, int(B))
            measured = summary[(summary.dataset == dataset) & (summary.B == B)].set_index("decoder")["speedup"]
            pick_measured = measured.get(CORE_GREEDY if pick == "greedy" else pick)
            rows.append({"dataset": dataset, "B": B, "auto_pick": pick, "predicted": predicted[pick],
                         "pick_measured": pick_measured, "best_measured": measured.idxmax(),
                         "best_speedup": measured.max()})
    return pd.DataFrame(rows)


def stops_paying(summary: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and draft decoder: the smallest B from which its speedup stays below 1."""
    rows = []
    for (dataset, name), group in summary[~summary.decoder.isin([BASELINE, CORE_GREEDY])].groupby(["dataset", "decoder"]):
        group = group.sort_values("B")
        below = None
        for B, speedup in zip(group.B, group.speedup):
            below = (below or B) if speedup < 1 else None
        rows.append({"dataset": dataset, "decoder": name, "best_speedup": group.speedup.max(),
                     "at_B": int(group.B[group.speedup.idxmax()]), "below_1_from_B": below})
    return pd.DataFrame(rows)


def plot(summary: pd.DataFrame, path: Path, title: str) -> Path:
    datasets = sorted(summary.dataset.unique())
    fig = Figure(figsize=(5.5 * len(datasets), 4))
    for i, dataset in enumerate(datasets):
        ax = fig.add_subplot(1, len(datasets), i + 1)
        for name, group in summary[(summary.dataset == dataset) & (summary.decoder != BASELINE)].groupby("decoder"):
            group = group.sort_values("B")
            ax.plot(group.B, group.speedup, marker="o", label=name)
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size B")
        ax.set_ylabel("speedup over batched generate greedy")
        ax.set_title(f"{dataset}: {title}")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def roofline_costs(params: float, bandwidth: float, flops: float, batch_sizes: Sequence[int],
                   bytes_per_param: int = 2) -> dict[int, cm.CostModel]:
    """An ASSUMED t(B, k), not a measurement: a forward of T = B x k tokens takes the longer of reading
    the weights once (``params x bytes / bandwidth``) and computing them (``2 x params x T / flops``);
    KV-cache reads, the same for every k at a given B, are left out. For projecting onto hardware
    this session has no access to; ``experiments.tools.batch_latency`` on the device measures the real curve."""
    from experiments.tools.batch_latency import SIZES

    sizes = tuple(sorted(set(SIZES) | {64, 128}))
    read = params * bytes_per_param / bandwidth
    return {B: cm.CostModel(sizes, tuple(max(read, 2 * params * B * k / flops) for k in sizes), device="roofline",
                            batch=B) for B in batch_sizes}


def project_roofline(df: pd.DataFrame, costs: dict[int, cm.CostModel]) -> pd.DataFrame:
    """Projected speedup over batched greedy per dataset, draft decoder and B, for batches made of
    every measured sequence's per-step record (B = 1 runs and batch runs alike, each sequence once)
    taken in turn: acceptance from the real model, step times from ``costs``."""
    rows = []
    known = configs(df)
    seqs = df[df.step_tokens.notna() & ~df.decoder.isin([BASELINE, CORE_GREEDY])].drop_duplicates(
        ["dataset", "decoder", "item_id"])
    for (dataset, name), group in seqs.groupby(["dataset", "decoder"]):
        records = [(json.loads(r.step_tokens), json.loads(r.accepted)) for r in group.itertuples()]
        for B in sorted(costs):
            batch = [records[b % len(records)] for b in range(B)]
            rows.append({"dataset": dataset, "decoder": name, "B": B, "sequences": len(records),
                         "projected": cm.predict_batch(costs, known[name], [r[0] for r in batch], [r[1] for r in batch])})
    return pd.DataFrame(rows)


def prompts(df: pd.DataFrame) -> dict[str, list[str]]:
    """Per dataset, the prompts of its largest batch size's batches, in order (the smaller B's are a prefix)."""
    out = {}
    for dataset, group in df.groupby("dataset"):
        largest = group[group.B == group.B.max()].drop_duplicates("batch").sort_values("batch")
        out[dataset] = list(dict.fromkeys(item for items in largest.composition for item in items.split()))
    return out


def header(raw: pd.DataFrame, df: pd.DataFrame) -> str:
    """Where and how the jobs ran, from their rows."""
    host = ", ".join(raw["device_name"].dropna().unique()) if "device_name" in raw else ""
    one = lambda column: ", ".join(map(str, raw[column].dropna().unique()))   # noqa: E731
    return (f"Device: {host or '?'}, threads={one('threads')}, {one('max_new_tokens')} new tokens, {one('dtype')}, "
            "shared machine (load average per row in rows.csv.gz): ratios, not absolute speeds, are the result. "
            "Prompts: " + "; ".join(f"{d}: {' '.join(ids)}" for d, ids in prompts(df).items()))


def write(folder: Path) -> str:
    """rows.csv.gz, summary.csv, summary.md and speedup_vs_batch.png in ``folder``; returns summary.md's text."""
    folder = Path(folder)
    raw = harness_report.load_results([folder])
    df = bench_rows(raw)
    df.to_csv(folder / "rows.csv.gz", index=False)
    summary = summarize(raw)
    summary.to_csv(folder / "summary.csv", index=False)
    model = ", ".join(raw["model"].dropna().unique())
    png = plot(summary, folder / "speedup_vs_batch.png", model)
    wide = summary.pivot_table(index=["dataset", "decoder"], columns="B", values="speedup").reset_index()
    wide.columns = [f"B={c}" if isinstance(c, (int, float)) and not isinstance(c, bool) else c for c in wide.columns]
    throughput = summary.pivot_table(index=["dataset", "decoder"], columns="B", values="tokens_per_s").reset_index()
    throughput.columns = [f"B={c}" if not isinstance(c, str) else c for c in throughput.columns]
    parts = [
        f"# Throughput against batch size: {model}", header(raw, df),
        "## Speedup over batched `generate` greedy at the same B (tokens/s ratio)", markdown(wide),
        "## Tokens/s (whole batch)", markdown(throughput),
        "## Per decoder: full table (S = mean per-sequence step compression; identical = share of rows "
        "token-identical to hf_greedy)", markdown(summary),
        "## Where lookahead stops paying", markdown(stops_paying(summary)),
    ]
    latency_path = folder / LATENCY_FILE
    if latency_path.exists():
        costs = load_costs(latency_path)
        t1 = {B: c.seconds[0] for B, c in costs.items()}
        latency = pd.DataFrame([{"B": B, "k": k, "t_ms": s * 1e3, "t/t(B,1)": s / t1[B],
                                 "per_seq_token_ms": s * 1e3 / (B * k)}
                                for B, c in sorted(costs.items()) for k, s in zip(c.tokens, c.seconds)])
        parts += [
            "## Cost model: predicted (from t(B, k) and each batch's per-step records) vs measured speedup over "
            "core greedy", markdown(predictions(df, costs)),
            "## auto per batch size (calibrated on the B = 1 sequences)", markdown(auto_choices(df, costs, summary)),
            "## t(B, k): one batched forward, 256-token cache", markdown(latency),
        ]
    else:
        parts.append(f"(No {LATENCY_FILE} here: `python -m experiments.tools.batch_latency out={folder}` measures "
                     "t(B, k) for the cost model's views.)")
    parts.append(f"![speedup against B]({png.name})")
    text = "\n\n".join(parts)
    (folder / "summary.md").write_text(text + "\n")
    return text


def roofline(folder: Path, params: float, bandwidth: float, flops: float, batch_sizes: Sequence[int]) -> str:
    """roofline.md in ``folder``: the measured sequences' acceptance under an assumed t(B, k)."""
    folder = Path(folder)
    table = project_roofline(bench_rows(harness_report.load_results([folder])), roofline_costs(params, bandwidth, flops, batch_sizes))
    wide = table.pivot_table(index=["dataset", "decoder"], columns="B", values="projected").reset_index()
    wide.columns = [f"B={c}" if not isinstance(c, str) else c for c in wide.columns]
    text = (f"# Roofline projection (ASSUMED hardware, not measured): {params:.3g} params, fp16, "
            f"{bandwidth:.3g} B/s, {flops:.3g} FLOP/s\n\nSpeedup over batched greedy, acceptance "
            f"from the measured sequences in rows.csv.gz:\n\n{markdown(wide)}\n")
    (folder / "roofline.md").write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a results folder of suite=batch jobs (searched recursively)")
    parser.add_argument("--roofline", action="store_true",
                        help="project onto assumed hardware (no measurement): see roofline_costs")
    parser.add_argument("--params", type=float, default=6.74e9, help="parameters (default Llama-2-7B)")
    parser.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s (default H200 HBM3e)")
    parser.add_argument("--flops", type=float, default=0.5 * 989e12, help="FLOP/s (default half of H200 dense fp16)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64, 128])
    args = parser.parse_args(argv)
    if args.roofline:
        print(roofline(args.folder, args.params, args.bandwidth, args.flops, args.batch_sizes))
    else:
        print(write(args.folder))


if __name__ == "__main__":
    main()

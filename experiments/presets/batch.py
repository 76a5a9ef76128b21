"""Throughput against batch size: what lookahead buys when several sequences decode together.

    nice -n 10 python -m experiments.presets.batch run --model smollm2_135m --datasets mtbench humaneval \\
        --batch-sizes 1 2 4 8 16 --batches 2 --max-new-tokens 128 --threads 1 --out results/batch
    python -m experiments.presets.batch report --out results/batch

A preset of the one harness (``run.py batch_size=B``): per dataset and B, a harness job with
``baseline=hf_greedy``, ``batch_size=B`` and these decoders, its rows in ``<out>/jobs/<dataset>_B<B>.csv``:

* ``hf_greedy``: transformers ``generate(do_sample=False)`` on the left-padded batch (the baseline);
* ``core_greedy``: ``lookahead_core.decode_batch`` without lookahead;
* ``pool_N3G1``, ``la_N4W5G5_pool``, ``tree_k6`` (pool + suffix + recycled token tree, 6 tokens a
  step): the same batched loop with drafts (``--decoders`` picks a subset).

Method (the harness's). The first job measures ``t(B, k)`` (one batched forward of B sequences, k
tokens each, after a 256-token cache) for the cost model with the model it loaded. Then for each dataset
and B the first ``--batches`` batches of B prompts (first turns; ``B = 16`` and ``--prompts 16``:
one) are decoded by every decoder back to back after an untimed warm-up, the order rotated per
batch: first one batch at every B (a whole curve early), then the rest. The prompts are the first
``--prompts`` of the dataset in ``--order spread`` (the default: round-robin over categories,
shuffled with ``--seed`` within; MT-Bench's first 16 in file order are all writing and roleplay) or
``file`` order; ``meta.json`` lists them. ``decode_s`` = wall clock of the call minus its first
forward (the prefill), throughput = the batch's new tokens / ``decode_s``, the speedup of a decoder
at B = its tokens/s over ``hf_greedy``'s on the same batches (ratio of sums). Every job resumes,
so a rerun of the command finishes what an interrupted one left. ``report`` writes ``rows.csv``
(the jobs' rows, one per sequence per decoder, each with its per-step record), the tables and the plot.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from tqdm import tqdm

from lookahead_core import LookaheadConfig
from lookahead_core import cost as cm
from lookahead_core.config import config_label

from experiments.reporting import report as harness_report
from experiments.reporting.tables import markdown
from experiments.presets.benchmark import compose_job, core_entry, model_overrides

# The decoders by name: the two greedy ones (no config), the drafting configs named by their one
# name (config_label: pool_N3G1, la_N4W5G5_pool), and the recycled token tree as tree_k6.
DECODERS: dict[str, LookaheadConfig | None] = {
    "hf_greedy": None,
    "core_greedy": None,
    **{config_label(config): config for config in (LookaheadConfig(window=1, ngram=3, guess=1, pool_only=True),
                                                   LookaheadConfig(window=5, ngram=4, guess=5, prompt_pool=True))},
    "tree_k6": cm.tree_config(6),
}
BASELINE = "hf_greedy"
COLUMNS = ("dataset", "B", "batch", "decoder", "item_id", "composition", "prompt_tokens", "new_tokens", "steps",
           "S", "step_tokens", "accepted", "batch_new_tokens", "batch_forwards", "batch_decode_s", "batch_wall_s",
           "batch_tokens_per_s", "matches_hf_greedy", "lookahead", "max_new_tokens", "threads", "load_avg")
LATENCY_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "unknown")


def decoder_entries(names: Sequence[str]) -> list[dict]:
    """The harness ``decoders`` list of ``names`` (the baseline is the job's ``baseline``)."""
    entries = []
    for name in names:
        if name == BASELINE:
            continue
        config = DECODERS[name]
        entries.append({"use": "greedy", "name": name} if config is None else {**core_entry(config), "name": name})
    return entries


def job_config(args: argparse.Namespace, dataset: str, batch_size: int, count: int, names: Sequence[str]):
    """The harness job of one (dataset, B): ``count`` first turns in batches of ``batch_size``."""
    overrides = [
        *model_overrides(args.model), "model.dtype=float32", "device=cpu", f"experiment={dataset}",
        f"experiment.max_new_tokens={args.max_new_tokens}", "experiment.stop_strings=[]", "experiment.score=false",
        "dataset.turns=1", "dataset.source=local", f"dataset.order={args.order}", f"dataset.limit={count}",
        f"seed={args.seed}", "decoding.temperature=0", "baseline=hf_greedy", f"batch_size={batch_size}", "warmup=1",
        f"threads={args.threads}", f"results_file={Path(args.out).resolve() / 'jobs' / f'{dataset}_B{batch_size}.csv'}",
    ]
    if args.data_root is not None:
        overrides.append(f"data_root={args.data_root}")
    return compose_job(overrides, decoder_entries(names))


def measure_costs(model: object, batch_sizes: Sequence[int], out: Path, repeats: int) -> None:
    """t(B, k) of ``model`` for every B, into ``<out>/latency_batch.csv`` (kept: a rerun reuses it)."""
    path = out / "latency_batch.csv"
    if path.exists():
        return
    rows = []
    for B in tqdm(batch_sizes, desc="t(B, k)"):
        rows += cm.measure_latency(model, LATENCY_SIZES, kv_length=256, repeats=repeats, batch=B).to_rows()
    pd.DataFrame(rows).to_csv(path, index=False)


def load_costs(path: Path) -> dict[int, cm.CostModel]:
    df = pd.read_csv(path)
    return {int(B): cm.CostModel.from_rows(group.to_dict("records")) for B, group in df.groupby("batch")}


def run(args: argparse.Namespace) -> Path:
    import torch

    from experiments.job import runner
    from experiments.config.settings import plan

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    names = [BASELINE, *[d for d in args.decoders if d != BASELINE]]
    unknown = set(names) - set(DECODERS)
    if unknown:
        raise ValueError(f"unknown decoders {sorted(unknown)}; choose from {list(DECODERS)}")
    jobs = {}
    for dataset in args.datasets:
        for B in args.batch_sizes:
            count = min(min(args.batches, max(1, args.prompts // B)) * B, args.prompts)
            jobs[dataset, B] = (job_config(args, dataset, B, min(B, count), names),
                                job_config(args, dataset, B, count, names))
    items = {dataset: [item.item_id for item in plan(job_config(args, dataset, 1, args.prompts, names))[2]]
             for dataset in args.datasets}     # every config is checked before anything loads
    meta = {"model": args.model, "cpu": cpu_model(), "threads": args.threads, "max_new_tokens": args.max_new_tokens,
            "torch": torch.__version__, "decoders": names, "batch_sizes": args.batch_sizes, "order": args.order,
            "seed": args.seed, "items": items}
    (out / "meta.json").write_text(json.dumps(meta, indent=1))

    def measure(job: runner.Job) -> None:            # with the first job's model, not a second load
        measure_costs(job.model, args.batch_sizes, out, args.latency_repeats)

    for first in (True, False):                      # one batch at every B first: a whole curve early
        for (dataset, B), (one, whole) in jobs.items():
            runner.run(one if first else whole, on_start=measure)
            torch.set_num_threads(args.threads)
    if not (out / "latency_batch.csv").exists():     # every job had resumed: nothing loaded a model
        from experiments.models import loader as model_loader

        measure_costs(model_loader.load_model(args.model, dtype="float32", device="cpu")[0], args.batch_sizes, out,
                      args.latency_repeats)
    report(out)
    return out


def bench_rows(out: Path) -> pd.DataFrame:
    """The jobs' harness rows in this benchmark's columns (:data:`COLUMNS`), one per sequence per decoder."""
    df = harness_report.load_results([Path(out) / "jobs"])
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


# ---------------------------------------------------------------------------------------------
# Report


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Per dataset, decoder and B: tokens/s (sum of tokens / sum of decode time over the batches),
    the speedup over hf_greedy on the same batches, mean per-sequence S, identical outputs."""
    batches = df.drop_duplicates(["dataset", "B", "batch", "decoder"])
    agg = batches.groupby(["dataset", "decoder", "B"]).agg(
        batches=("batch", "count"), new_tokens=("batch_new_tokens", "sum"), decode_s=("batch_decode_s", "sum"))
    agg["tokens_per_s"] = agg["new_tokens"] / agg["decode_s"]
    seq = df.groupby(["dataset", "decoder", "B"]).agg(
        S=("S", lambda s: pd.to_numeric(s, errors="coerce").mean()), identical=("matches_hf_greedy", "mean"))
    table = agg.join(seq).reset_index()
    base = table[table.decoder == BASELINE].set_index(["dataset", "B"])["tokens_per_s"]
    table["speedup"] = table["tokens_per_s"] / [base[(d, b)] for d, b in zip(table.dataset, table.B)]
    return table


def predictions(df: pd.DataFrame, costs: dict[int, cm.CostModel]) -> pd.DataFrame:
    """Per batch and core decoder: the measured speedup over core greedy and the cost model's
    prediction from the batch's own per-step records and t(B, k)."""
    rows = []
    core = df[df.decoder != BASELINE]
    for (dataset, B, index), group in core.groupby(["dataset", "B", "batch"]):
        greedy = group[group.decoder == "core_greedy"]
        if greedy.empty:
            continue
        for name, runs in group.groupby("decoder"):
            if name == "core_greedy":
                continue
            steps = [json.loads(s) for s in runs.step_tokens]
            accepted = [json.loads(a) for a in runs.accepted]
            rows.append({"dataset": dataset, "B": B, "batch": index, "decoder": name,
                         "predicted": cm.predict_batch(costs, DECODERS[name], steps, accepted),
                         "measured": greedy.batch_decode_s.iloc[0] / runs.batch_decode_s.iloc[0]})
    table = pd.DataFrame(rows)
    return table.groupby(["dataset", "decoder", "B"])[["predicted", "measured"]].median().reset_index()


def auto_choices(df: pd.DataFrame, costs: dict[int, cm.CostModel], summary: pd.DataFrame) -> pd.DataFrame:
    """``auto`` per batch size: calibrated on the B = 1 runs (each sequence's per-step record), the
    pick per B, against the decoder measured fastest at that B."""
    rows = []
    for dataset, group in df[df.B == df.B.min()].groupby("dataset"):
        calibration = {name: (DECODERS[name], [(json.loads(r.step_tokens), json.loads(r.accepted))
                                               for r in runs.itertuples()])
                       for name, runs in group.groupby("decoder") if name not in (BASELINE, "core_greedy")}
        for B in sorted(df[df.dataset == dataset].B.unique()):
            pick, predicted = cm.choose_for_batch(costs, calibration, int(B))
            measured = summary[(summary.dataset == dataset) & (summary.B == B)].set_index("decoder")["speedup"]
            pick_measured = measured.get("core_greedy" if pick == "greedy" else pick)
            rows.append({"dataset": dataset, "B": B, "auto_pick": pick, "predicted": predicted[pick],
                         "pick_measured": pick_measured, "best_measured": measured.idxmax(),
                         "best_speedup": measured.max()})
    return pd.DataFrame(rows)


def stops_paying(summary: pd.DataFrame) -> pd.DataFrame:
    """Per dataset and draft decoder: the smallest B from which its speedup stays below 1."""
    rows = []
    for (dataset, name), group in summary[~summary.decoder.isin([BASELINE, "core_greedy"])].groupby(["dataset", "decoder"]):
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
    this session has no access to; ``cost.measure_latency(model, batch=B)`` on the device measures the real curve."""
    sizes = tuple(sorted(set(LATENCY_SIZES) | {64, 128}))
    read = params * bytes_per_param / bandwidth
    return {B: cm.CostModel(sizes, tuple(max(read, 2 * params * B * k / flops) for k in sizes), device="roofline",
                            batch=B) for B in batch_sizes}


def project_roofline(df: pd.DataFrame, costs: dict[int, cm.CostModel]) -> pd.DataFrame:
    """Projected speedup over batched greedy per dataset, draft decoder and B, for batches made of
    every measured sequence's per-step record (B = 1 runs and batch runs alike, each sequence once)
    taken in turn: acceptance from the real model, step times from ``costs``."""
    rows = []
    seqs = df[df.step_tokens.notna() & ~df.decoder.isin([BASELINE, "core_greedy"])].drop_duplicates(
        ["dataset", "decoder", "item_id"])
    for (dataset, name), group in seqs.groupby(["dataset", "decoder"]):
        records = [(json.loads(r.step_tokens), json.loads(r.accepted)) for r in group.itertuples()]
        for B in sorted(costs):
            batch = [records[b % len(records)] for b in range(B)]
            rows.append({"dataset": dataset, "decoder": name, "B": B, "sequences": len(records),
                         "projected": cm.predict_batch(costs, DECODERS[name], [r[0] for r in batch], [r[1] for r in batch])})
    return pd.DataFrame(rows)


def report(out: Path) -> str:
    out = Path(out)
    df = bench_rows(out)
    df.to_csv(out / "rows.csv", index=False)
    meta = json.loads((out / "meta.json").read_text()) if (out / "meta.json").exists() else {}
    costs = load_costs(out / "latency_batch.csv")
    summary = summarize(df)
    summary.to_csv(out / "summary.csv", index=False)
    png = plot(summary, out / "speedup_vs_batch.png", meta.get("model", ""))
    predicted = predictions(df, costs)
    autos = auto_choices(df, costs, summary)
    t1 = {B: c.seconds[0] for B, c in costs.items()}
    latency = pd.DataFrame([{"B": B, "k": k, "t_ms": s * 1e3, "t/t(B,1)": s / t1[B], "per_seq_token_ms": s * 1e3 / (B * k)}
                            for B, c in sorted(costs.items()) for k, s in zip(c.tokens, c.seconds)])
    wide = summary.pivot_table(index=["dataset", "decoder"], columns="B", values="speedup").reset_index()
    wide.columns = [f"B={c}" if isinstance(c, (int, float)) and not isinstance(c, bool) else c for c in wide.columns]
    throughput = summary.pivot_table(index=["dataset", "decoder"], columns="B", values="tokens_per_s").reset_index()
    throughput.columns = [f"B={c}" if not isinstance(c, str) else c for c in throughput.columns]
    text = "\n\n".join([
        f"# Throughput against batch size: {meta.get('model', '')}",
        f"CPU: {meta.get('cpu', '?')}, threads={meta.get('threads', '?')}, {meta.get('max_new_tokens', '?')} new tokens, "
        "fp32, shared machine (load average per row in rows.csv): ratios, not absolute speeds, are the result. "
        f"Prompts ({meta.get('order', '?')} order): " + "; ".join(f"{d}: {' '.join(ids)}" for d, ids in
                                                                  meta.get("items", {}).items()),
        "## Speedup over batched `generate` greedy at the same B (tokens/s ratio)", markdown(wide),
        "## Tokens/s (whole batch)", markdown(throughput),
        "## Per decoder: full table (S = mean per-sequence step compression; identical = share of rows "
        "token-identical to hf_greedy)", markdown(summary),
        "## Where lookahead stops paying", markdown(stops_paying(summary)),
        "## Cost model: predicted (from t(B, k) and each batch's per-step records) vs measured speedup over core greedy",
        markdown(predicted),
        "## auto per batch size (calibrated on the B = 1 sequences)", markdown(autos),
        "## t(B, k): one batched forward, 256-token cache", markdown(latency),
        f"![speedup against B]({png.name})",
    ])
    (out / "summary.md").write_text(text + "\n")
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run")
    go.add_argument("--model", default="smollm2_135m")
    go.add_argument("--datasets", nargs="+", default=["mtbench", "humaneval"])
    go.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    go.add_argument("--batches", type=int, default=2, help="batches per (dataset, B), at most prompts // B")
    go.add_argument("--prompts", type=int, default=16, help="prompts per dataset (the first ones in --order)")
    go.add_argument("--order", choices=("spread", "file"), default="spread",
                    help="spread: round-robin over categories, seeded shuffle within (the harness's dataset.order)")
    go.add_argument("--seed", type=int, default=0, help="the spread order's shuffle")
    go.add_argument("--max-new-tokens", type=int, default=128)
    go.add_argument("--threads", type=int, default=1)
    go.add_argument("--decoders", nargs="+", default=list(DECODERS))
    go.add_argument("--latency-repeats", type=int, default=3)
    go.add_argument("--data-root", default=None)
    go.add_argument("--out", default="results/batch")
    rep = sub.add_parser("report")
    rep.add_argument("--out", default="results/batch")
    roof = sub.add_parser("roofline", help="project onto assumed hardware (no measurement): see roofline_costs")
    roof.add_argument("--out", default="results/batch")
    roof.add_argument("--params", type=float, default=6.74e9, help="parameters (default Llama-2-7B)")
    roof.add_argument("--bandwidth", type=float, default=4.8e12, help="bytes/s (default H200 HBM3e)")
    roof.add_argument("--flops", type=float, default=0.5 * 989e12, help="FLOP/s (default half of H200 dense fp16)")
    roof.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64, 128])
    args = parser.parse_args(argv)
    if args.command == "run":
        print(f"wrote {run(args)}")
    elif args.command == "report":
        print(report(Path(args.out)))
    else:
        out = Path(args.out)
        table = project_roofline(bench_rows(out),
                                 roofline_costs(args.params, args.bandwidth, args.flops, args.batch_sizes))
        wide = table.pivot_table(index=["dataset", "decoder"], columns="B", values="projected").reset_index()
        wide.columns = [f"B={c}" if not isinstance(c, str) else c for c in wide.columns]
        text = (f"# Roofline projection (ASSUMED hardware, not measured): {args.params:.3g} params, fp16, "
                f"{args.bandwidth:.3g} B/s, {args.flops:.3g} FLOP/s\n\nSpeedup over batched greedy, acceptance "
                f"from the measured sequences in rows.csv:\n\n{markdown(wide)}\n")
        (out / "roofline.md").write_text(text)
        print(text)


if __name__ == "__main__":
    main()

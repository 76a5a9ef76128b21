"""Lookahead parallelism on one machine: a cost model of a step split over P ranks, the step-time
table of the harness's runs, and a projection to more devices.

    bash scripts/runs/parallel/cpu.sh                     # harness jobs: P=1 (1 and 2 threads), P=2
    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 -m experiments.tools.parallel \\
        out=results/parallel/cpu/measured.json            # latency curves, all-gather cost, re-feed vs copy
    python -m experiments.reporting.parallel report results/parallel/cpu
    python -m experiments.reporting.parallel project results/parallel/cpu/measured.json \\
        results/scaling/mtbench results/scaling/humaneval --out results/parallel/cpu

The cost model of a step split over P ranks (``lookahead_core.parallel.ShardedLM``):

    t_step(P) = t(fed_max, owned_max) + host + c(P, logit bytes) + c(P, KV bytes)

where ``t`` is the device's latency curve (tokens fed, logit rows kept), ``fed_max`` the most rows
any rank feeds under the split (:func:`rank_load`, the same LPT split the core uses), ``owned_max``
the most logit rows a rank owns, ``host`` the loop's own time per step, and ``c`` an all-gather of
the given bytes per rank: ``(P - 1) * (alpha + bytes / beta)`` (a ring all-gather; ``alpha`` and
``beta`` fitted from the measured all-gathers at P = 2). Each rank holds a full replica of the
model and the committed KV cache: P ranks take P times the memory of one. What the model is fed
(the curves and all-gathers of ``measured.json``) comes from ``experiments/tools/parallel.py``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

SETUPS = {"p1_t1": (1, 1), "p1_t2": (1, 2), "p2_t1": (2, 1)}   # results sub-folder: (ranks, threads per rank)


# ---------------------------------------------------------------------------------------------
# The model of a split step


def rank_load(window: int, ngram: int, candidates: int, ranks: int) -> tuple[int, int]:
    """(most rows a rank feeds, most logit rows a rank owns) of a warmed-up linear step of a
    ``window``-column, ``ngram`` window with ``candidates`` branches, split over ``ranks``."""
    from lookahead_core.layout import chains, step_layout
    from lookahead_core.parallel import shard_rows

    layout = step_layout(window, ngram - 1, chains(candidates, ngram - 1))
    if ranks == 1:
        return int(layout.visible.shape[0]), int(layout.logit_rows.numel())
    shards = shard_rows(layout.visible, layout.logit_rows, ranks)
    owned = [shards.owner.count(r) for r in range(ranks)]
    return max(len(rows) for rows in shards.fed), max(owned)


@dataclass(frozen=True)
class AllGather:
    """Seconds of an all-gather of ``b`` bytes per rank between two ranks: ``alpha + b / beta``; a
    ring over P ranks takes P - 1 such rounds (the assumption behind any P > 2)."""

    alpha: float          # seconds per round
    beta: float           # bytes per second

    def seconds(self, ranks: int, nbytes: float) -> float:
        return 0.0 if ranks == 1 else (ranks - 1) * (self.alpha + nbytes / self.beta)

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]]) -> AllGather:
        """Least squares through (bytes, seconds) measured at P = 2."""
        sizes, seconds = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
        slope, intercept = np.polyfit(sizes, seconds, 1)
        return cls(alpha=max(float(intercept), 0.0), beta=1.0 / max(float(slope), 1e-18))


def step_seconds(curve, comm: AllGather, window: int, ngram: int, candidates: int, ranks: int, vocab: int,
                 kv_bytes_per_token: int, accepted: float, host: float = 0.0, dtype_bytes: int = 4) -> float:
    """Predicted seconds of one step: the slowest rank's forward, the loop's host time, the
    all-gather of the owned logit rows (padded to the rank that owns most) and of the accepted
    tokens' KV (those a rank did not feed: at most all of them)."""
    fed, owned = rank_load(window, ngram, candidates, ranks)
    compute = curve.latency(fed, owned)
    logits = comm.seconds(ranks, owned * vocab * dtype_bytes)
    kv = comm.seconds(ranks, accepted * kv_bytes_per_token) if ranks > 1 else 0.0
    return compute + host + logits + kv


# ---------------------------------------------------------------------------------------------
# report: the harness rows of scripts/runs/parallel/cpu.sh


def load_setups(root: Path) -> pd.DataFrame:
    from experiments.reporting.report import find_csvs, load_results

    frames = []
    for setup, (ranks, threads) in SETUPS.items():
        folder = root / setup
        if folder.is_dir() and find_csvs([folder]):
            rows = load_results([folder])
            frames.append(rows.assign(setup=setup, P=ranks, threads_per_rank=threads))
    if not frames:
        raise SystemExit(f"no rows under {root}/{{{','.join(SETUPS)}}}: run scripts/runs/parallel/cpu.sh first")
    return pd.concat(frames, ignore_index=True)


def step_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per set, setup and decoder (items every setup finished only): tokens/s, the speedup over
    the same job's greedy (ratio of sums), S, and a step's time split into compute (the model's
    forwards on rank 0), communication (rank 0's time in collectives, waiting for the slower rank
    included) and the rest (the loop's host work)."""
    done = rows.groupby(["experiment", "item_id"]).setup.nunique()
    common = done[done == rows.setup.nunique()].index
    rows = rows.set_index(["experiment", "item_id"]).loc[common].reset_index()
    out = []
    for (experiment, setup), job in rows.groupby(["experiment", "setup"]):
        base = job[job.baseline.astype(bool)]
        base_tps = base.new_tokens.sum() / base.decode_s.sum()
        for decoder, group in job.groupby("decoder", sort=False):
            steps = group.steps.sum()
            comm = group.comm_s.fillna(0).sum()
            out.append({
                "experiment": experiment, "setup": setup, "P": int(group.P.iloc[0]),
                "threads": int(group.threads_per_rank.iloc[0]), "decoder": decoder,
                "W": group.W.iloc[0], "N": group.N.iloc[0], "items": group.item_id.nunique(),
                "tok_s": group.new_tokens.sum() / group.decode_s.sum(),
                "speedup": group.new_tokens.sum() / group.decode_s.sum() / base_tps,
                "S": (group.new_tokens.sum() - len(group)) / steps,
                "step_ms": 1e3 * group.decode_s.sum() / steps,
                "compute_ms": 1e3 * group.model_s.sum() / steps,
                "comm_ms": 1e3 * comm / steps,
                "other_ms": 1e3 * (group.decode_s.sum() - group.model_s.sum() - comm) / steps,
                "fed_mean": float(np.mean([np.mean(json.loads(s)["fed"]) for s in group.step_log.dropna()]))
                if group.step_log.notna().any() else 1.0,
            })
    return pd.DataFrame(out)


def predicted(table: pd.DataFrame, measured: dict) -> pd.DataFrame:
    """The cost model's step time beside the measured one, per row of :func:`step_table` (greedy:
    one token fed; a lookahead step: the mean number of candidates its steps fed, the accepted
    tokens' KV at the measured S)."""
    from lookahead_core import LookaheadConfig
    from lookahead_core.cost.curve import CostModel

    curves = {"p1_t1": "curve_alone", "p1_t2": "curve_two_threads", "p2_t1": "curve_both"}
    comm = AllGather(**measured["all_gather_fit"])
    out = []
    for row in table.itertuples():
        curve = CostModel.from_rows(measured[curves[row.setup]])
        if pd.isna(row.W):
            seconds = curve.latency(1, 1)
        else:
            window, ngram = int(row.W), int(row.N)
            layout_rows = LookaheadConfig(window=window, ngram=ngram, guess=window).window_rows
            candidates = max(0, round((row.fed_mean - layout_rows) / (ngram - 1)))
            seconds = step_seconds(curve, comm, window, ngram, min(candidates, window), row.P, measured["vocab"],
                                   measured["kv_bytes_per_token"], row.S)
        out.append(1e3 * seconds)
    table = table.assign(predicted_ms=out, model_error=[p / m - 1 for p, m in zip(out, table.step_ms)])
    # The same step's time relative to one process on one thread, measured and predicted: what the
    # model is for (a curve of fastest rounds reads low in absolute terms; the ratios cancel that).
    one = table[table.setup == "p1_t1"].set_index(["experiment", "decoder"])
    keys = list(zip(table.experiment, table.decoder))
    return table.assign(ratio=[m / one.step_ms.get(k, float("nan")) for m, k in zip(table.step_ms, keys)],
                        predicted_ratio=[p / one.predicted_ms.get(k, float("nan")) for p, k in zip(table.predicted_ms, keys)])


def report(root: Path) -> Path:
    from experiments.reporting.tables import markdown

    table = step_table(load_setups(root))
    measured_path = root / "measured.json"
    if measured_path.is_file():
        table = predicted(table, json.loads(measured_path.read_text()))
    table.to_csv(root / "table.csv", index=False)
    shown = table.copy()
    for column in ("tok_s", "step_ms", "compute_ms", "comm_ms", "other_ms", "predicted_ms", "fed_mean"):
        if column in shown:
            shown[column] = shown[column].map(lambda v: f"{v:.1f}")
    for column in ("speedup", "S", "model_error", "ratio", "predicted_ratio"):
        if column in shown:
            shown[column] = shown[column].map(lambda v: f"{v:+.0%}" if column == "model_error" else f"{v:.2f}")
    text = markdown(shown)
    (root / "table.md").write_text(text + "\n")
    figure = plot_split(table, root / "step_split.png")
    print(text)
    print(f"wrote {root / 'table.csv'}, {root / 'table.md'}, {figure}")
    return root / "table.csv"


def plot_split(table: pd.DataFrame, path: Path) -> Path:
    """Per set: each lookahead decoder's step time in the three setups, split into compute,
    communication and the rest (stacked bars)."""
    sets = sorted(table.experiment.unique())
    fig = Figure(figsize=(5.5 * len(sets), 3.8))
    for i, experiment in enumerate(sets):
        ax = fig.add_subplot(1, len(sets), i + 1)
        rows = table[(table.experiment == experiment) & table.W.notna()]
        labels = [f"W{int(r.W)}\n{r.setup}" for r in rows.itertuples()]
        x = np.arange(len(rows))
        bottom = np.zeros(len(rows))
        for column, colour in (("compute_ms", "tab:blue"), ("comm_ms", "tab:red"), ("other_ms", "tab:gray")):
            ax.bar(x, rows[column], bottom=bottom, color=colour, label=column.removesuffix("_ms"))
            bottom += rows[column].to_numpy()
        for xi, (top, speedup) in enumerate(zip(bottom, rows.speedup)):
            ax.text(xi, top, f"{speedup:.2f}x", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(x, labels, fontsize=7)
        ax.set_ylabel("ms per step")
        ax.set_title(f"{experiment}: step time (speedup over greedy on top)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


# ---------------------------------------------------------------------------------------------
# project: P = 1 .. 8 from one device's curve and the scaling sweep's S


def project(measured: dict, scaling_rows: pd.DataFrame, curve_name: str, ranks: Sequence[int]) -> pd.DataFrame:
    """A projection, not a measurement: for each P, every linear setup of the scaling sweep (W, N,
    its measured S) costed on ``curve_name`` split over P ranks, and the fastest per set and P.
    Assumes every rank computes at the curve's speed (one device each), the ring all-gather model
    fitted at P = 2, every step with all G candidates, and no other load. Only the rows of the model
    whose curve was measured are costed; each dtype the sweep ran it in is its own setup."""
    from lookahead_core.cost.curve import CostModel

    curve = CostModel.from_rows(measured[curve_name])
    comm = AllGather(**measured["all_gather_fit"])
    scaling_rows = scaling_rows[scaling_rows.model == measured["model"]]   # another model's S means nothing here
    linear = scaling_rows[~scaling_rows.decoder.str.startswith("tree") & scaling_rows.W.notna()]
    base = scaling_rows[scaling_rows.baseline.astype(bool)]
    greedy = curve.latency(1, 1) + curve.host_seconds
    out = []
    for (experiment, model, dtype, decoder), group in linear.groupby(["experiment", "model", "dtype", "decoder"]):
        paired = group.item_id.isin(base[(base.experiment == experiment) & (base.dtype == dtype)].item_id)
        group = group[paired]
        if group.empty:
            continue
        window, ngram = int(group.W.iloc[0]), int(group.N.iloc[0])
        s = (group.new_tokens.sum() - len(group)) / group.steps.sum()
        for p in ranks:
            if p > window + window:                    # more ranks than pieces: not a valid split
                continue
            seconds = step_seconds(curve, comm, window, ngram, window, p, measured["vocab"],
                                   measured["kv_bytes_per_token"], s, curve.host_seconds,
                                   dtype_bytes=2 if measured.get("dtype") == "float16" else 4)
            out.append({"experiment": experiment, "model": model, "dtype": dtype, "decoder": decoder,
                        "W": window, "N": ngram, "S": s, "P": p, "step_ms": 1e3 * seconds, "speedup": s * greedy / seconds})
    table = pd.DataFrame(out)
    if table.empty:
        return table
    best = table.loc[table.groupby(["experiment", "model", "dtype", "P"]).speedup.idxmax()]
    return best.sort_values(["experiment", "model", "dtype", "P"]).reset_index(drop=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("report", help="the step-time table of scripts/runs/parallel/cpu.sh's rows")
    r.add_argument("root", type=Path)
    j = sub.add_parser("project", help="P = 1..8 from a measured curve and the scaling sweep's S (a projection)")
    j.add_argument("measured", type=Path)
    j.add_argument("scaling", type=Path, nargs="+")
    j.add_argument("--curve", default="curve_alone")
    j.add_argument("--ranks", type=int, nargs="+", default=list(range(1, 9)))
    j.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "report":
        report(args.root)
    else:
        from experiments.reporting.report import load_results

        table = project(json.loads(args.measured.read_text()), load_results(args.scaling), args.curve, args.ranks)
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"projection_{args.curve}.csv"
        table.to_csv(path, index=False)
        print(table.to_string(index=False))
        print(f"a projection (not measured): wrote {path}")


if __name__ == "__main__":
    main()

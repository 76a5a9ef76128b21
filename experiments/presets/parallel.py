"""Lookahead parallelism on one machine: where a split step's time goes, a cost model for P ranks,
and a projection to more devices.

    bash scripts/runs/parallel/cpu.sh                     # harness jobs: P=1 (1 and 2 threads), P=2
    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 -m experiments.presets.parallel \\
        measure --out results/parallel/cpu/measured.json  # latency curves, all-gather cost, re-feed vs copy
    python -m experiments.presets.parallel report results/parallel/cpu
    python -m experiments.presets.parallel project results/parallel/cpu/measured.json \\
        results/scaling/mtbench results/scaling/humaneval --out results/parallel/cpu

The cost model of a step split over P ranks (``lookahead_core.parallel.ShardedLM``):

    t_step(P) = t(fed_max, owned_max) + host + c(P, logit bytes) + c(P, KV bytes)

where ``t`` is the device's latency curve (tokens fed, logit rows kept), ``fed_max`` the most rows
any rank feeds under the split (:func:`rank_load`, the same LPT split the core uses), ``owned_max``
the most logit rows a rank owns, ``host`` the loop's own time per step, and ``c`` an all-gather of
the given bytes per rank: ``(P - 1) * (alpha + bytes / beta)`` (a ring all-gather; ``alpha`` and
``beta`` fitted from the measured all-gathers at P = 2). Each rank holds a full replica of the
model and the committed KV cache: P ranks take P times the memory of one.

``measure`` runs under torchrun with two ranks of one thread each and writes, from rank 0: the
latency curve with the other core idle, with both cores computing at once (as P = 2 runs) and with
two threads; the all-gather time against bytes; and, for the accepted tokens' KV, the two ways to
make it consistent on every rank: copy it from the rank that fed it (an all-gather of its rows) or
re-feed those tokens with the next step (``t(k + a) - t(k)`` on that rank).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

SETUPS = {"p1_t1": (1, 1), "p1_t2": (1, 2), "p2_t1": (2, 1)}   # results sub-folder: (ranks, threads per rank)
CURVE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)


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
# measure: under torchrun, two ranks


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


def measure(out: Path, model_name: str, kv_length: int, repeats: int, device: str = "cpu",
            backend: str | None = None) -> None:
    import torch
    import torch.distributed as dist

    from experiments.models.loader import load_model
    from lookahead_core import CausalLM, parallel
    from lookahead_core.cost.curve import measure_latency
    from lookahead_core.layout import causal_layout
    from lookahead_core.model_io import Feed, truncate_kv

    cuda = device.startswith("cuda")
    backend = backend or ("nccl" if cuda else "gloo")          # the job's: nccl on GPUs
    parallel.init(backend, timeout_s=600)
    rank, ranks = dist.get_rank(), dist.get_world_size()
    if ranks != 2:
        raise SystemExit("measure runs on two ranks: torchrun --nproc-per-node 2 -m experiments.presets.parallel measure")
    torch.set_num_threads(1)
    # nccl: each rank on its own GPU (LOCAL_RANK), the all-gathers between them. gloo on a GPU (one
    # GPU for both ranks): the curve is rank 0's alone, the all-gathers go through host memory.
    if backend == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    elif cuda and ":" not in device:
        device = "cuda:0"                       # not cuda:LOCAL_RANK: both ranks on the one GPU
    dtype = "float16" if cuda else "float32"
    model, _ = load_model(model_name, dtype=dtype, device=device)
    lm = CausalLM(model)
    record: dict = {"model": model_name, "device": device, "backend": backend, "dtype": dtype, "kv_length": kv_length,
                    "vocab": model.config.vocab_size, "kv_bytes_per_token": kv_bytes_per_token(model.config, 2 if cuda else 4),
                    "torch": torch.__version__}

    def save() -> None:
        if rank == 0:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(record, indent=1))

    def curve(label: str) -> None:
        started = time.perf_counter()
        cost = measure_latency(lm, CURVE_SIZES, kv_length=kv_length, repeats=repeats)
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


# ---------------------------------------------------------------------------------------------
# report: the harness rows of scripts/runs/parallel/cpu.sh


def load_setups(root: Path) -> pd.DataFrame:
    from experiments.reporting.report import load_results

    frames = []
    for setup, (ranks, threads) in SETUPS.items():
        folder = root / setup
        if folder.is_dir() and list(folder.rglob("*.csv")):
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
    m = sub.add_parser("measure", help="under torchrun, 2 ranks: curves, all-gather cost, re-feed vs copy")
    m.add_argument("--model", default="smollm2_135m")
    m.add_argument("--kv-length", type=int, default=256)
    m.add_argument("--repeats", type=int, default=5)
    m.add_argument("--device", default="cpu", help="cpu, or cuda (each rank its GPU, LOCAL_RANK)")
    m.add_argument("--backend", choices=["gloo", "nccl"], help="default: nccl on cuda, gloo on cpu; "
                   "gloo on cuda: both ranks on one GPU, all-gathers through host memory")
    m.add_argument("--out", type=Path, default=Path("results/parallel/cpu/measured.json"))
    r = sub.add_parser("report", help="the step-time table of scripts/runs/parallel/cpu.sh's rows")
    r.add_argument("root", type=Path)
    j = sub.add_parser("project", help="P = 1..8 from a measured curve and the scaling sweep's S (a projection)")
    j.add_argument("measured", type=Path)
    j.add_argument("scaling", type=Path, nargs="+")
    j.add_argument("--curve", default="curve_alone")
    j.add_argument("--ranks", type=int, nargs="+", default=list(range(1, 9)))
    j.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "measure":
        measure(args.out, args.model, args.kv_length, args.repeats, args.device, args.backend)
    elif args.command == "report":
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

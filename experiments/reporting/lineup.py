"""A lineup's views: the decoder table of one results folder, and the goals across many folders.

A lineup (``conf/suite/``) runs every decoder on the same first turns in one ``run.py`` job against
transformers' greedy (``hf_greedy``); its rows go under the job's ``results_dir``. These views read
the rows of a folder (every results file under it, ``rows.csv`` of the former benchmark preset
included) and write their tables and plots into that folder::

    python run.py suite=paper experiment=mtbench model=smollm2_135m dataset.limit=20 \\
        experiment.max_new_tokens=128 threads=1 device=cpu results_dir=results/lineup/smollm2_mtbench
    python -m experiments.reporting.lineup table results/lineup/smollm2_mtbench
    python -m experiments.reporting.lineup table results/lineup/qwen_mbpp \\
        --calibration results/lineup/qwen_mbpp_auto
    python -m experiments.reporting.lineup collect results/lineup

``table``: ``summary.md``/``summary.csv``/``speedup.png`` (one row per decoder, the baseline first),
the draft acceptance and reliability of token trees, and where the folder holds an ``auto`` decoder's
calibration record (``<results file>.auto.json``), or ``--calibration`` names another run's record
(or its folder) on the same items, the cost model's predicted against measured speedup of every core
decoder (``predicted_vs_measured.*``). ``collect``: one row per subfolder with an ``auto`` decoder,
against transformers, with the goals of ``conf/goals.yaml`` checked (``goals.*``), and every token
tree beside the linear branches of the same (N, W, G) and pool (``trees.*``).

Method (the harness's): the model is loaded once; after an untimed warm-up of every decoder, each
item is decoded by every decoder back to back, in an order rotated by one per item. Forward hooks
time every decoder alike: ``decode_s`` = wall clock - the first forward (the prefill), ``steps`` =
forwards - 1, ``overhead_frac`` = share of ``decode_s`` outside the model. ``dataset.every=K``
takes every K-th item (spread over a dataset's categories, e.g. MT-Bench's 8 blocks of 10).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from matplotlib.figure import Figure

from experiments.data.datasets import repo_root
from experiments.reporting import report
from experiments.reporting.drafts import draft_acceptance, draft_reliability, plot_reliability
from experiments.reporting.tables import cell, markdown
from experiments.rows.store import sidecar
from experiments.config.labels import config_label
from lookahead_core.config import LookaheadConfig

HF_GREEDY, CORE_GREEDY = "hf_greedy", "core_greedy"

# The paper's linear lookahead: every other LookaheadConfig field (token trees, the draft sources,
# budgets, costs) extends it.
LINEAR_FIELDS: tuple[str, ...] = ("window", "ngram", "guess", "prompt_pool", "pool_only", "keep_pool", "seed")


def linear_twin(config: LookaheadConfig) -> LookaheadConfig:
    """The paper's linear branches at ``config``'s (N, W, G) and pool: only the linear fields, every
    other field (sources, budget, costs, ...) at its default."""
    return LookaheadConfig(**{name: getattr(config, name) for name in LINEAR_FIELDS})


# ---------------------------------------------------------------------------------------------
# One folder: the decoder table


def load_rows(folder: str | Path) -> pd.DataFrame:
    """Every row of the results files under ``folder`` (empty when it has none)."""
    files = report.find_csvs([folder])
    return report.load_results(files) if files else pd.DataFrame()


def auto_records(folder: str | Path) -> list[Path]:
    """The calibration records of the ``auto`` decoders of ``folder``'s results files: each file's
    ``<stem>.auto.json`` beside it (``rows.auto.json`` beside the preset's ``rows.csv``)."""
    records = (sidecar(path, ".auto.json") for path in report.find_csvs([folder]))
    return [record for record in records if record.is_file()]


def _config_from_row(row) -> Any:
    """The core config a row ran (its ``params``), or None (greedy, transformers)."""
    return report.row_config(row["params"]) if row["family"] == "core" else None


def speedup_vs_core(df: pd.DataFrame) -> pd.Series:
    """Per decoder, the ratio of summed decode time of ``core_greedy`` to its own on the same items
    (the harness's summary against ``core_greedy``)."""
    return report.summarize(report.one_setup(df), baseline=CORE_GREEDY).set_index("decoder")["speedup"]


def summarize(df: pd.DataFrame, baseline: str = HF_GREEDY) -> pd.DataFrame:
    """One row per decoder (the baseline first): the harness's summary (experiments.reporting.report) with
    the config's label, N/W/G and the ratio of summed decode time against ``core_greedy``."""
    df = report.one_setup(df)
    rows = report.summarize(df, with_baseline=True).to_dict("records")
    has_core = (df["decoder"] == CORE_GREEDY).any()
    vs_core = speedup_vs_core(df) if has_core else None
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
        if first["family"] == "core" and has_core:
            row["speedup_vs_core"] = vs_core.get(row["decoder"], 1.0)     # core_greedy: itself
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
    measured = speedup_vs_core(df)
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
        out.append({
            "decoder": name, "config": label, "calibration": calib["status"] if calib is not None else "not run",
            "S_calibration": calib["S"] if calibrated else float("nan"),
            "S_measured": accepted_total / group["steps"].sum(),
            "step_tokens_calibration": calib["step_tokens_mean"] if calibrated else float("nan"),
            "step_tokens_measured": group["step_tokens_mean"].mean(),
            "predicted_calibration": calib["predicted_speedup"] if calibrated else float("nan"),
            "predicted_oracle_S": cost.predict_steps(config, step_tokens, accepted, host_seconds=host),
            "best_cut": cost.best_cut(committed, host_seconds=host),
            "measured": measured[name],
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


def calibration_record(path: str | Path) -> Path:
    """``path`` itself, or for a folder its one ``auto`` calibration record (:func:`auto_records`)."""
    path = Path(path)
    if not path.is_dir():
        return path
    records = auto_records(path)
    if len(records) != 1:
        raise SystemExit(f"--calibration {path}: expected one auto calibration record (<results file>.auto.json) "
                         f"under it, found {len(records)}{': ' if records else ''}{', '.join(map(str, records))}; "
                         "name the record itself")
    return records[0]


def write_table(folder: str | Path, calibration_path: str | Path | None = None) -> str:
    """``summary.md``/``summary.csv``/``speedup.png`` in ``folder`` and, if calibrated,
    ``predicted_vs_measured.*`` (with the record's own ``latency.csv``/``calibration.csv``).

    ``calibration_path``: the ``auto`` calibration record of another run on the same prompts (or
    that run's folder), for a folder whose lineup has no ``auto`` decoder: its latency curve
    predicts this folder's configs from their measured S."""
    folder = Path(folder)
    df = load_rows(folder)
    if df.empty:
        return "(no rows yet)"
    title = " / ".join("+".join(dict.fromkeys(df[key].astype(str))) for key in ("model", "dataset"))
    table = summarize(df)
    table.to_csv(folder / "summary.csv", index=False)
    plot_speedups(table, folder / "speedup.png", title)
    sections = [summary_markdown(table, title), _method_note(df)]
    drafts = draft_acceptance(df)
    if not drafts.empty:
        drafts.to_csv(folder / "draft_acceptance.csv", index=False)
        sections.append("#### Draft nodes per source and depth (fed; tried = the walk reached the parent; "
                        "accepted)\n\n" + markdown(drafts, floatfmt=".3f"))
    reliability = draft_reliability(df)
    if not reliability.empty:
        reliability.to_csv(folder / "draft_reliability.csv", index=False)
        plot_reliability(reliability, folder / "reliability.png", title)
        sections.append("#### Draft estimates per source: predicted against observed acceptance, by decile of "
                        "the prediction (reliability.png)\n\n" + markdown(reliability, floatfmt=".3f"))
    own = auto_records(folder)
    if calibration_path is None and len(own) == 1:
        calibration_path = own[0]
    elif calibration_path is None and own:
        sections.append(f"(The cost model's view is left out: {len(own)} auto records here "
                        f"({', '.join(p.name for p in own)}); name one with --calibration.)")
    if calibration_path is not None:
        calibration_path = calibration_record(calibration_path)
        calibration = json.loads(calibration_path.read_text())
        heading = "#### Cost model: predicted vs measured speedup over core greedy"
        if any(calibration_path.resolve() == record.resolve() for record in own):
            from experiments.decoders import autotune

            autotune.write_tables(calibration, folder)
            sections.append(calibration["markdown"])
        else:
            heading += f" (latency curve and host times of {calibration_path})"
        pvm = predicted_vs_measured(df, calibration)
        if not pvm.empty:
            pvm.to_csv(folder / "predicted_vs_measured.csv", index=False)
            plot_predicted(pvm, folder / "predicted_vs_measured.png", title)
            sections.append(heading + "\n\n" + markdown(pvm, floatfmt=".2f"))
    text = "\n\n".join(sections) + "\n"
    (folder / "summary.md").write_text(text, encoding="utf-8")
    return text


def _method_note(df: pd.DataFrame) -> str:
    repeats = int(df["repeats"].max()) if df["repeats"].notna().any() else 1
    return (
        f"{df['item_id'].nunique()} prompts x {df['decoder'].nunique()} decoders, max {int(df['max_new_tokens'].iloc[0])} "
        f"new tokens, {int(df['threads'].iloc[0]) if df['threads'].notna().any() else '?'} torch thread(s), "
        f"{repeats} repeat(s), load average {df['load_avg'].min():.1f}-{df['load_avg'].max():.1f} "
        f"during the run; torch {df['torch'].iloc[0]}, transformers {df['transformers'].iloc[0]}. "
        "tok/s and speedups use decode_s = wall - prefill forward (hooks time it for every decoder); "
        "'speedup e2e' includes the prefill; 'vs core greedy' is the ratio of summed decode_s against "
        "core_greedy; 'overhead' = share of decode_s outside the model's forward. "
        "S = tokens after the first / forwards after the prefill."
    )


# ---------------------------------------------------------------------------------------------
# Many folders: the project's goals, token trees against linear branches


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


def load_runs(root: str | Path) -> list[tuple[str, pd.DataFrame, pd.DataFrame]]:
    """Every subfolder of ``root`` with rows (a lineup's ``results_dir``): (its name, its rows,
    ``summarize`` by decoder)."""
    runs = []
    for folder in sorted(path for path in Path(root).iterdir() if path.is_dir() and not path.name.startswith(".")):
        df = load_rows(folder)
        if not df.empty:
            runs.append((folder.name, df, summarize(df).set_index("decoder")))
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


def write_collection(root: str | Path) -> str:
    """``goals.md``/``goals.csv``/``goals.png`` in ``root``: every run folder's auto against HF;
    ``trees.md``/``trees.csv``: token trees against linear branches at the same (N, W, G)."""
    root = Path(root)
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


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m experiments.reporting.lineup", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    table = commands.add_parser("table", help="the decoder table of each folder, written into it")
    table.add_argument("folders", nargs="+", type=Path, help="a lineup's results_dir (its rows, in any subfolder)")
    table.add_argument("--calibration", type=Path, default=None,
                       help="the auto calibration record (<results file>.auto.json) of a run on the same items, "
                            "or that run's folder, for a lineup without auto")
    gather = commands.add_parser("collect", help="goals.* and trees.* over the lineup folders under a root")
    gather.add_argument("root", type=Path, help="a folder whose subfolders are lineups' results_dir")
    args = parser.parse_args(argv)
    if args.command == "collect":
        print(write_collection(args.root))
        return
    for folder in args.folders:
        print(write_table(folder, args.calibration))


if __name__ == "__main__":
    main()

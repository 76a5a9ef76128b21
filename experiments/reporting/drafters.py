"""Trained drafters (Medusa heads, EAGLE) against the training-free token tree, as one table over result folders.

    python -m experiments.reporting.drafters results/medusa      # writes results/medusa/table.md
    python -m experiments.reporting.drafters results/eagle

Per model and set: every decoder's S (mean tokens committed per step, what EAGLE's papers call the
mean accepted tokens), tokens fed per step, the share of its decode time in a drafter's own forwards
(``draft_s``) and speedup over the jobs' baseline (``generate`` greedy in ``scripts/runs/medusa`` and
``scripts/runs/eagle``), named by its role in the comparison; then the trained sources' acceptance
per depth (Medusa's per head); where each step's time goes (the base's forward, the drafter, the host,
in greedy steps: which cost holds a decoder back); a labelled flat-curve projection. The drafters themselves:
``python -m experiments.tools.medusa|eagle model=<name> show=true``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from experiments.reporting import report
from experiments.reporting.drafts import draft_acceptance
from experiments.reporting.tables import cell, markdown


def label(row: pd.Series) -> str:
    """A row's decoder as the benchmarks name it: a core config's label (``pool_N4G0_tree_md7_d4``,
    ``greedy``), prompt lookup's ``hf_pld_k<k>``, else the decoder's name."""
    from experiments.config.labels import config_label

    if row["family"] == "core" and not str(row["decoder"]).startswith("auto"):
        return config_label(report.row_config(row["params"]))
    if not pd.isna(row["prompt_lookup"]):
        return f"hf_pld_k{int(row['prompt_lookup'])}"
    return row["decoder"]


def role(label: str) -> str:
    """What a benchmarked decoder is, in the comparison of trained drafters."""
    if label.startswith("auto"):
        return {"auto": "auto (default)", "auto_training_free": "auto, training-free"}.get(label, label)
    if "_eg" in label:
        return "EAGLE + training-free tree" if ("sfx" in label or "rc" in label) else "EAGLE alone"
    if "_md" in label:
        return "Medusa + training-free tree" if ("sfx" in label or "rc" in label) else "Medusa heads alone"
    if label.startswith("pool_") and "tree" in label:
        return "training-free tree"
    if label.startswith("hf_pld_k"):
        return f"prompt lookup k={label[len('hf_pld_k'):]}"
    return {"hf_greedy": "generate greedy", "greedy": "core greedy"}.get(label, label)


def summary(df: pd.DataFrame) -> list[dict]:
    """One model and set's rows: the baseline's summary row, then each decoder's against it (the
    harness's :func:`experiments.reporting.report.summarize`, rows of several jobs pooled)."""
    df = report.one_setup(df)
    rows = report.summarize(df, with_baseline=True).to_dict("records")
    baseline = set(df.loc[df["baseline"].fillna(False).astype(bool), "decoder"])
    rows = [{**row, "speedup": 1.0, "speedup_median": 1.0, "matches_greedy": 1.0} if row["decoder"] in baseline
            else row for row in rows]
    labels = labels_of(df)
    return [{**row, "label": labels[row["decoder"]]} for row in rows]


def draft_share(df: pd.DataFrame) -> dict[str, float]:
    """Each decoder's seconds in a drafter's own forwards over its decode seconds, summed over rows
    (decoders without a drafter: absent)."""
    if "draft_s" not in df:
        return {}
    sums = df.groupby("decoder")[["draft_s", "decode_s"]].sum()
    return {d: r["draft_s"] / r["decode_s"] for d, r in sums.iterrows() if r["draft_s"] > 0 and r["decode_s"] > 0}


def time_per_step(df: pd.DataFrame) -> list[dict]:
    """Where each core decoder's step goes, measured, in units of the baseline's decode seconds per
    token (one greedy step): the base model's forward (``model_s``: what feeding the tree costs), a
    drafter's own forwards (``draft_s``) and the rest (host work: drafting from tables, the tree,
    acceptance), per step; with S, tokens committed per step, ``S / (forward + drafter + rest)`` is
    the decoder's speedup. Then a labelled projection, not a measurement: S / (1 + drafter), where a
    step costs one greedy step whatever it feeds (a GPU's flat curve at batch 1 for small trees,
    assumed) and the drafter costs the share of a base step it did here."""
    base = df[df["baseline"].fillna(False)]
    if not len(base) or "draft_s" not in df:
        return []
    token_s = base["decode_s"].sum() / base["new_tokens"].sum()
    out = []
    for decoder, rows in df[(df["family"] == "core") & ~df["baseline"].fillna(False)].groupby("decoder"):
        steps = rows["steps"].sum()
        forward, draft = rows["model_s"].sum() / steps / token_s, rows["draft_s"].fillna(0).sum() / steps / token_s
        rest = rows["decode_s"].sum() / steps / token_s - forward - draft
        s = rows["new_tokens"].sum() / steps
        out.append({"decoder": decoder, "S": s, "forward": forward, "drafter": draft, "rest": rest,
                    "speedup": s / (forward + draft + rest), "projected": s / (1 + draft)})
    return out


def labels_of(df: pd.DataFrame) -> dict[str, str]:
    """Each decoder of ``df`` -> its :func:`label`."""
    return {r["decoder"]: label(r) for _, r in df.drop_duplicates("decoder").iterrows()}


def collect(root: Path) -> str:
    """``root``'s result CSVs (``scripts/runs/medusa/bench.sh``, ``scripts/runs/eagle/bench.sh``) as
    one table: per model and set, every decoder's S, tokens fed per step, drafter's share and speedup
    over the baseline; then the trained sources' acceptance per depth. Written to ``root/table.md``."""
    speed, depths, costs, projected = [], {"medusa": [], "eagle": []}, [], []
    rows = report.load_results([root])
    for (model, experiment), df in rows.groupby(["model", "experiment"], sort=True):
        drafting = draft_share(df)
        for r in summary(df):
            speed.append({"model": model, "set": experiment, "decoder": role(r["label"]), "config": r["label"],
                          "prompts": r["rows"], "S": f"{r['S']:.2f}", "tokens/step": cell(r["tokens_per_step"], ".1f"),
                          "drafter's share": cell(drafting.get(r["decoder"]), ".0%"),
                          "speedup (sum)": f"{r['speedup']:.2f}x", "speedup (median)": f"{r['speedup_median']:.2f}x",
                          "outside the model": f"{100 * r['overhead']:.0f}%",
                          "equal to greedy": f"{r['matches_greedy']:.0%}"})
        labels = labels_of(df)
        for r in time_per_step(df):
            where = {"model": model, "set": experiment, "decoder": role(labels[r["decoder"]]), "S": f"{r['S']:.2f}"}
            costs.append({**where, **{k: f"{r[k]:.2f}" for k in ("forward", "drafter", "rest")},
                          "step": f"{r['forward'] + r['drafter'] + r['rest']:.2f}", "S / step": f"{r['speedup']:.2f}x"})
            projected.append({**where, "drafter per step (greedy steps, here)": f"{r['drafter']:.2f}",
                              "projected speedup": f"{r['projected']:.2f}x"})
        acceptance = draft_acceptance(df)
        if len(acceptance):
            for source, name in (("medusa", "head"), ("eagle", "depth")):
                for decoder, group in acceptance[acceptance["source"] == source].groupby("decoder"):
                    row = {"model": model, "set": experiment, "decoder": role(labels[decoder])}
                    for _, r in group.sort_values("depth").iterrows():
                        row[f"{name} {r['depth']}"] = (f"{r['acceptance']:.2f} ({r['accepted']}/{r['tried']})"
                                                       if r["tried"] else "-")
                    depths[source].append(row)
    text = "## Speed (ratio of summed decode time against the baseline, same run)\n\n"
    text += markdown(pd.DataFrame(speed, dtype=object)) if speed else "(no runs)\n"
    for source, what in (("medusa", "Medusa nodes: accepted / tried per head (depth)"),
                         ("eagle", "EAGLE nodes: accepted / tried per depth")):
        if depths[source]:
            text += f"\n\n## {what}, summed over prompts\n\n"
            text += markdown(pd.DataFrame(depths[source], dtype=object).fillna("-"))
    if costs:
        text += ("\n\n## Where a step's time goes, in greedy steps (the baseline's decode seconds per token): "
                 "the base model's forward over what the step feeds, the drafter's own forwards, the rest "
                 "(host work); S here is committed tokens over steps of all prompts together, S / step the "
                 "speedup\n\n")
        text += markdown(pd.DataFrame(costs, dtype=object))
    if projected and any(r["drafter per step (greedy steps, here)"] != "0.00" for r in projected):
        text += ("\n\n## A projection, not a measurement: flat step cost (a GPU at batch 1, assumed), the "
                 "drafter's share of a step as here: S / (1 + drafter per step)\n\n")
        text += markdown(pd.DataFrame(projected, dtype=object))
    text += "\n"
    (root / "table.md").write_text(text)
    return text


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path, help="a folder of result CSVs (searched recursively); table.md goes there")
    print(collect(parser.parse_args(argv).root))


if __name__ == "__main__":
    main()

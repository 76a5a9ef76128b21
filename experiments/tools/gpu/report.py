"""summary.md: the verdict, the pieces, and tables of (a), (b) and (c) (labelled a projection)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from experiments.reporting.tables import markdown as _markdown

if TYPE_CHECKING:
    from .record import Run


def markdown(rows: list[dict], columns: list[str]) -> str:
    """The harness's table writer, a missing value as ``-``."""
    return _markdown(rows, columns, missing="-")


PROJECTION_HEADING = "## (c) Projection, not a measurement"


def summary(run: Run) -> str:
    meta = run.meta
    tiny = meta.get("tiny")
    lines = [f"# GPU run: {meta.get('device')} ({'tiny shapes, a CPU smoke test' if tiny else 'random weights'})", "",
             f"torch {meta.get('torch')}, transformers {meta.get('transformers')}, commit {meta.get('commit')}, "
             f"started {meta.get('started')}; {run.elapsed():.0f} s so far"
             + (f" of a {run.budget:.0f} s budget" if run.budget else "") + ".", ""]
    planned = meta.get("checks_planned") or []
    ran = {f"{p['family']} {p['attention']}" for p in run.probes}
    refused = {p["piece"].removeprefix("(a) ") for p in run.pieces if p["status"] == "refused" and p["section"] == "a"}
    missing = sorted(set(planned) - ran - refused)
    verdict = "FAILED: " + "; ".join(run.failures) if run.failures else "no failure"
    lines += [f"**Correctness verdict: {verdict} ({len(ran & set(planned))} of {len(planned)} family x attention "
              f"checks ran{'; refused on this host: ' + ', '.join(sorted(refused)) if refused else ''}"
              f"{'; not run: ' + ', '.join(missing) if missing else ''}).**", ""]
    if run.refusals:
        lines += ["Refused on this host (the core refuses these before they decode; not failures):", ""] + \
            [f"- {n}" for n in run.refusals] + [""]
    if run.notes:
        lines += ["Skipped or degraded:", ""] + [f"- {n}" for n in run.notes] + [""]
    if run.pieces:
        lines += ["Pieces, in the order they ran (each section's under SDPA first, then flex_attention's):", "",
                  markdown(run.pieces, ["piece", "status", "seconds"]), ""]
    lines += ["## (a) Lossless in float32 (TF32 off), " + ("tiny shapes" if tiny else "2 layers, real widths"), "",
              "Every decoder's output against greedy on the same model and attention implementation: `equal` "
              "token-identical; `near_tie` left greedy where its top two logits were within float32's tolerance; "
              "`mismatch` left it at a confident token (a bug). `pool_used` decodes with a pool the decoder keeps "
              "(capacity G, keep_pool) holding the greedy text's n-grams: it must take fewer steps than greedy.", ""]
    if run.probes:
        lines += [markdown(run.probes, ["family", "attention", "passed", "max_diff", "tolerance"]), ""]
    if run.correctness:
        lines += [markdown(run.correctness, ["family", "attention", "decoder", "config", "sequences", "equal",
                                             "near_tie", "mismatch", "errors", "steps", "greedy_steps"]), ""]
    lines += ["## (b) Step time t(k), " + ("tiny shapes, float32" if tiny else "full depth, float16"), "",
              "`CausalLM.forward` of a causal chain of k tokens after a KV cache of `kv` tokens, wall clock with the "
              "model's device synchronized, fastest of the rounds (`cost.measure_latency`); every logit row kept.", ""]
    if run.curves:
        ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if any(r["tokens"] == k for r in run.latency)]
        table = []
        for c in run.curves:
            points = {r["tokens"]: r["seconds"] for r in run.latency
                      if (r["model"], r["attention"], r["kv_length"]) == (c["model"], c["attention"], c["kv_length"])}
            t1 = points.get(1)
            table.append({"model": c["model"], "attention": c["attention"], "kv": c["kv_length"],
                          "t(1) ms": 1e3 * t1 if t1 else None,
                          **{f"k={k}": points[k] / t1 for k in ks[1:] if k in points and t1},
                          "measured in s": c["seconds_to_measure"], "notes": "; ".join(c["warnings"]) or ""})
        lines += ["t(k)/t(1):", "", markdown(table, ["model", "attention", "kv", "t(1) ms", *[f"k={k}" for k in ks[1:]],
                                                     "measured in s", "notes"]), ""]
    if run.host:
        lines += ["Host cost per step (the loop's wall time minus its step forwards', `DecodeStats.model_seconds`: the core's `ForwardClock`, CUDA events on a GPU), "
                  "SDPA, pools pre-filled with the greedy continuation's n-grams so that steps accept drafts; "
                  "copies and syncs per step from the profiler's CUDA trace (a decode's minus its prefill's) and "
                  "`torch.cuda.set_sync_debug_mode` warnings (CUDA only: no such columns on the CPU):", "",
                  markdown(run.host, ["model", "decoder", "fed_per_step", "accepted_per_step", "ms_per_step",
                                      "forward_ms_per_step", "host_ms_per_step", "draft_ms_per_step", "h2d_per_step", "d2h_per_step",
                                      "syncs_per_step", "sync_warnings_per_step", "matches_greedy"]), ""]
    lines += [PROJECTION_HEADING, ""]
    lines += [
        "Not a measurement: no mission model was run, and random weights accept nothing of their own. Speedup "
        "over greedy = committed tokens x (t(1) + greedy's host time) / the sum over the CPU run's steps of "
        "(t(tokens fed) + the config's host time), summed over the items as the harness sums decode time. "
        "Assumptions:", "",
        "- S and the tokens fed per step come from the CPU rows named in each row (SmolLM2-135M in float32, "
        "Qwen2.5-Coder-0.5B in bfloat16 (scaling) or float32 (auto_stream); file, commits, rows). A 7B model's S "
        "differs from a 135M model's: results/scaling/README.md quotes S = 1.96 for LLaMA-2-7B-chat on MT-Bench "
        "at W15 N5 G15 where SmolLM2 commits less per step. The paper's 7B config is W15 N5 G15; the scaling grid's "
        "nearest point is W16 N5 G16.",
        "- `auto`'s steps were cut against the CPU's curve (a few tokens a step); on this device auto would price "
        "its tree with the flatter curve above, feed more and commit at least as much a step. The projection keeps "
        "the CPU's steps, so it understates auto's S here.",
        "- `eagle`: S and tokens fed per step of the EAGLE-3 drafters trained here for the offline models "
        "(results/eagle: alone, and with the training-free tree); a 7B model's own EAGLE drafter accepts more "
        "(EAGLE-2 commits 4.34 tokens a step on Spec-Bench with Vicuna-7B). Their host time is the (b) row of a "
        "random drafter at the shape's width, which grows every level (trained ones stop early): an upper bound.",
        "- t(k): random-weight models of each mission model's shape at full depth in float16 on this device, batch "
        "1, the curve at the KV length in the column; host time: the (b) measurement for the nearest config "
        "(the paper's W15 N5 G15, auto's tree, the EAGLE tree) on that shape, greedy's for the baseline. Prefill "
        "excluded.", ""]
    if run.projection:
        sdpa = [r for r in run.projection if r["attention"] == "sdpa" and r["kv_length"] == min(
            x["kv_length"] for x in run.projection)]
        shapes = list(dict.fromkeys(r["shape"] for r in sdpa))
        table = {}
        for r in sdpa:
            t = table.setdefault((r["config_from"], r["decoder"], r["S_from"]), {
                "config": r["config_from"], "decoder": r["decoder"], "S from (CPU)": r["S_from"], "S": r["S"],
                "fed/step": r["fed_per_step"]})
            value = r["projected_with_host"] if r["projected_with_host"] is not None else r["projected_forward_only"]
            t[f"{r['shape']}, projected"] = value
        lines += [f"SDPA, KV {sdpa[0]['kv_length'] if sdpa else '-'}, with host time where measured (projection.csv "
                  "has every curve, forward-only and with host):", "",
                  markdown(list(table.values()), ["config", "decoder", "S from (CPU)", "S", "fed/step",
                                                   *[f"{s}, projected" for s in shapes]]), ""]
    else:
        lines += ["(no curve measured yet)", ""]
    lines += ["## What this run does not show", "",
              "- Any mission model's acceptance: the weights are random; S is the CPU's small models'.",
              "- Quality or the real models' numerics: float16 near-ties of a 7B model are not exercised.",
              "- Lookahead parallelism over several GPUs, batch sizes above 3, prefill time, and sampling.", ""]
    return "\n".join(lines)


"""``decoding=auto``'s calibration table: the core's :class:`~lookahead_core.cost.ChoiceReport` rows,
rendered by the harness's table writer, the predicted fastest first."""

from __future__ import annotations

from experiments.reporting.tables import cell, markdown


def calibration_markdown(report) -> str:
    """The report's one-line summary, then one row per calibrated config."""
    rows = sorted(report.rows(), key=lambda r: -(r["predicted_speedup"] or 0.0))
    table = [{
        "config": r["decoder"], "status": r["status"], "S": cell(r["S"], ".2f"),
        "tokens/step": cell(r["step_tokens_mean"], ".1f"), "host ms/step": f"{r['host_ms_per_step']:.2f}",
        "upper bound": f"{r['upper_bound']:.2f}", "predicted": cell(r["predicted_speedup"], ".2f"),
        "measured (calib.)": cell(r["calibration_measured_speedup"], ".2f"),
    } for r in rows]
    return report.summary() + "\n\n" + markdown(table)

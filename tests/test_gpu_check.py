"""scripts/gpu_check.py, the prepared GPU correctness check, runs end to end on tiny shapes on the CPU."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from experiments.data.datasets import repo_root


def test_gpu_check_tiny_runs_on_cpu(tmp_path: Path):
    spec = importlib.util.spec_from_file_location("gpu_check", repo_root() / "scripts" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    threads = torch.get_num_threads()
    try:
        status = gpu_check.main(["--tiny", "--device", "cpu", "--out", str(tmp_path), "--new-tokens", "12"])
    finally:
        torch.set_num_threads(threads)
    report = json.loads((tmp_path / "check.json").read_text())
    assert status == 0 and report["failed"] == []
    assert set(report["dtypes"]) == {"float32", "float16", "bfloat16"}
    assert set(report["flex_attention"]) == {"float32", "float16"}
    for dtype, result in [*report["dtypes"].items(), *report["flex_attention"].items()]:
        assert result["probe"]["passed"] and result["probe"]["max_diff"] <= result["probe"]["tolerance"]
        rows = {row["decoder"]: row for row in result["decoders"]}
        assert set(rows) == {"greedy", *gpu_check.CONFIGS}
        for name in gpu_check.CONFIGS:
            assert rows[name]["equal"] + rows[name]["near_tie"] + rows[name]["mismatch"] == 2
            assert rows[name]["host_ms_per_step"] > 0 and rows[name]["steps"] > 0
    assert all(row["equal"] == 2 for row in report["dtypes"]["float32"]["decoders"][1:])
    assert all(row["equal"] == 2 for row in report["flex_attention"]["float32"]["decoders"][1:])
    summary = (tmp_path / "summary.md").read_text()
    assert "## bfloat16" in summary and "## flex_attention float16" in summary

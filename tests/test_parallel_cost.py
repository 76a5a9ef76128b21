"""The cost model of lookahead parallelism (experiments/reporting/parallel.py) on hand-made inputs:
the split's load, the all-gather fit, a step's predicted time and the P = 1..8 projection; and its
measurements (experiments/tools/parallel.py) under torchrun."""

from __future__ import annotations

import pandas as pd
import pytest

from experiments.reporting.parallel import AllGather, project, rank_load, step_seconds
from lookahead_core.cost.curve import CostModel
from lookahead_core.layout import chains, step_layout


def test_chains_are_linear_branches() -> None:
    assert chains(2, 3) == (-1, 0, 1, -1, 3, 4)


@pytest.mark.parametrize("window, ngram, candidates", [(7, 5, 7), (15, 5, 15), (31, 5, 31), (4, 3, 0)])
def test_two_ranks_share_a_step(window: int, ngram: int, candidates: int) -> None:
    layout = step_layout(window, ngram - 1, chains(candidates, ngram - 1))
    rows, logits = rank_load(window, ngram, candidates, 1)
    assert (rows, logits) == (layout.visible.shape[0], layout.logit_rows.numel())
    fed, owned = rank_load(window, ngram, candidates, 2)
    assert rows / 2 <= fed < rows                    # each rank feeds about half, the shared rows twice
    assert logits / 2 <= owned <= logits / 2 + ngram  # the owned rows balance to within one column
    assert rank_load(window, ngram, candidates, 3)[0] <= fed


def test_the_all_gather_fit_recovers_its_line() -> None:
    comm = AllGather.fit([(b, 2e-4 + b / 3e9) for b in (1e4, 1e5, 1e6, 1e7)])
    assert comm.alpha == pytest.approx(2e-4, rel=1e-6) and comm.beta == pytest.approx(3e9, rel=1e-6)
    assert comm.seconds(1, 1e6) == 0.0
    assert comm.seconds(4, 1e6) == pytest.approx(3 * (2e-4 + 1e6 / 3e9))


def linear_curve(per_token: float, flat_until: int = 0) -> CostModel:
    sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    return CostModel(sizes, tuple(1e-3 * (1 + per_token * max(k - flat_until, 0)) for k in sizes))


def test_a_step_costs_the_slowest_rank_plus_the_gathers() -> None:
    curve, comm = linear_curve(0.1), AllGather(alpha=1e-4, beta=1e9)
    fed, owned = rank_load(15, 5, 15, 2)
    expected = curve.latency(fed) + 5e-4 + (1e-4 + owned * 1000 * 4 / 1e9) + (1e-4 + 2.0 * 512 / 1e9)
    got = step_seconds(curve, comm, 15, 5, 15, 2, vocab=1000, kv_bytes_per_token=512, accepted=2.0, host=5e-4)
    assert got == pytest.approx(expected)
    alone = step_seconds(curve, comm, 15, 5, 15, 1, vocab=1000, kv_bytes_per_token=512, accepted=2.0, host=5e-4)
    assert alone == pytest.approx(curve.latency(rank_load(15, 5, 15, 1)[0]) + 5e-4)


def scaling_rows() -> pd.DataFrame:
    """One item: greedy, and linear branches whose S grows with W (as the scaling law says)."""
    rows = [{"experiment": "mtbench", "model": "m", "dtype": "float32", "decoder": "greedy", "W": None, "N": None,
             "baseline": True, "item_id": "1", "new_tokens": 129, "steps": 128}]
    for window, s in ((2, 1.2), (8, 1.6), (32, 2.0)):
        rows.append({"experiment": "mtbench", "model": "m", "dtype": "float32", "decoder": f"w{window}_n5",
                     "W": window, "N": 5, "baseline": False, "item_id": "1", "new_tokens": 129, "steps": round(128 / s)})
    rows.append({**rows[-1], "decoder": "tree_b249_n5"})           # trees are not linear setups: left out
    return pd.DataFrame(rows)


def gpu_record(alpha: float = 1e-6, beta: float = 1e12) -> dict:
    """A ``measure`` record of model "m" (scaling_rows' model): a GPU-like curve, flat up to 64 tokens,
    and an all-gather of latency ``alpha`` and bandwidth ``beta``."""
    return {"model": "m", "curve_gpu": linear_curve(0.02, flat_until=64).to_rows(), "vocab": 1000,
            "kv_bytes_per_token": 512, "all_gather_fit": {"alpha": alpha, "beta": beta}}


def test_more_ranks_afford_a_wider_window_on_a_flat_curve() -> None:
    """On a GPU-like curve (flat up to 64 tokens), one rank picks a mid window and more ranks the widest."""
    measured = gpu_record()
    table = project(measured, scaling_rows(), "curve_gpu", [1, 2, 4, 8])
    assert list(table.P) == [1, 2, 4, 8]
    assert table.decoder.iloc[0] != "w32_n5" and table.decoder.iloc[-1] == "w32_n5"
    assert table.speedup.iloc[-1] > 1.2 * table.speedup.iloc[0]
    assert not table.decoder.str.startswith("tree").any()


def test_a_model_run_in_two_dtypes_is_projected_per_dtype() -> None:
    """The sweep runs a model in float32 and bfloat16 under the same decoder names: never pooled."""
    measured = gpu_record()
    rows = scaling_rows()
    bf16 = rows.assign(dtype="bfloat16", steps=rows.steps.where(rows.baseline, 64))   # S 2.0 at every W
    table = project(measured, pd.concat([rows, bf16], ignore_index=True), "curve_gpu", [1])
    assert sorted(table.dtype) == ["bfloat16", "float32"]
    by_dtype = table.set_index("dtype")
    assert by_dtype.loc["bfloat16", "S"] == pytest.approx(128 / 64)
    assert by_dtype.loc["float32", "S"] < 2.0


def test_only_the_measured_models_rows_are_projected() -> None:
    measured = gpu_record()
    rows = scaling_rows()
    other = rows.assign(model="other")
    table = project(measured, pd.concat([rows, other], ignore_index=True), "curve_gpu", [1, 2])
    assert set(table.model) == {"m"} and len(table) == 2


def test_costly_communication_makes_more_ranks_slower() -> None:
    measured = gpu_record(alpha=5e-3, beta=1e9)
    table = project(measured, scaling_rows(), "curve_gpu", [1, 2, 4, 8])
    assert table.speedup.iloc[-1] < table.speedup.iloc[0]


def test_measure_writes_every_piece_on_two_ranks(tmp_path) -> None:
    """``measure`` under torchrun (two gloo ranks, a tiny model): curves, all-gathers, re-feed and copy."""
    import json
    import os
    import socket
    import subprocess
    import sys

    from experiments.data.datasets import repo_root

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "measured.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(port), "-m", "experiments.tools.parallel", "model=tiny_llama",
               "kv_length=16", "repeats=1", f"out={out}"]
    done = subprocess.run(command, cwd=repo_root(), capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(out.read_text())
    for curve in ("curve_alone", "curve_two_threads", "curve_both"):
        assert [r["tokens"] for r in CostModel.from_rows(record[curve]).to_rows()][-1] == 256
    assert len(record["all_gather"]) == 15 and record["all_gather_fit"]["beta"] > 0
    assert [(r["W"], r["accepted"]) for r in record["refeed_vs_copy"]] == [(w, a) for w in (7, 15, 31) for a in (1, 2, 3, 4)]
    assert all(r["copy_s"] > 0 for r in record["refeed_vs_copy"])


@pytest.mark.parametrize("override, key", [("kv_lenght=16", "kv_lenght"), ("backend=mpi", "backend"),
                                           ("repeats=0", "repeats"), ("sizes=[0,4]", "sizes"),
                                           ("model.linear=auto", "model.linear")])
def test_a_bad_measure_config_is_refused_in_one_line_naming_the_key(override: str, key: str) -> None:
    """Before torch loads, on the command line the ranks parse: one line, exit 2."""
    import subprocess
    import sys

    from experiments.data.datasets import repo_root

    done = subprocess.run([sys.executable, "-m", "experiments.tools.parallel", override], cwd=repo_root(),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"error: {key}: ") and done.stderr.count("\n") == 1, done.stderr

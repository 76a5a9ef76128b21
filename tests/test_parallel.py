"""Lookahead parallelism (lookahead_core/parallel.py): a step's rows split over P gloo processes on
the CPU give exactly the tokens of one process, greedy and sampled, for the window, the prompt
pool, token trees and batches; a rank that dies makes the others stop with an error naming it.

The P processes are started as torchrun starts them (``RANK``, ``WORLD_SIZE``, ``MASTER_*``), each
running tests/parallel_worker.py; the reference decodes run here, in one process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from experiments.models.tiny import tiny_random_model
from lookahead_core import CausalLM
from lookahead_core.parallel import Shards, shard_rows
from lookahead_core.layout import chains, step_layout

WORKER = Path(__file__).resolve().parent / "parallel_worker.py"
sys.path.insert(0, str(WORKER.parent))
import parallel_worker  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(ranks: int, out: Path, *args: str, timeout: float = 240, hung: int | None = None) -> list[dict]:
    """Run the worker on ``ranks`` processes; their results by rank (rank ``hung`` is killed once
    the others have ended)."""
    port = str(free_port())
    procs = []
    for rank in range(ranks):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(out), *args], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = {r: p.communicate(timeout=timeout)[0] for r, p in enumerate(procs) if r != hung}
    if hung is not None:
        procs[hung].kill()
        logs[hung] = procs[hung].communicate()[0]
    results = []
    for rank, proc in enumerate(procs):
        path = out if rank == 0 else Path(f"{out}.{rank}")
        results.append(json.loads(path.read_text()) if path.exists() else {"rank": rank, "returncode": proc.returncode,
                                                                            "log": logs[rank][-2000:]})
    return results


@pytest.fixture(scope="module")
def reference() -> dict:
    """Every case decoded in this process, by the plain loop."""
    lm = CausalLM(tiny_random_model("llama", seed=1))
    return {case: parallel_worker.run(case, lm) for case in parallel_worker.CASES}


@pytest.mark.parametrize("ranks", [2, 3])
def test_p_processes_give_the_tokens_of_one(ranks: int, reference: dict, tmp_path: Path) -> None:
    results = launch(ranks, tmp_path / "out.json")
    for result in results:
        assert "error" not in result and "log" not in result, result
        assert result["ranks"] == ranks
        for case, expected in reference.items():
            got = result["cases"][case]
            assert got["tokens"] == expected["tokens"], f"P={ranks} rank {result['rank']} {case}"
            assert got["S"] == expected["S"], f"P={ranks} rank {result['rank']} {case}: other steps"
            assert got["comm_s"] > 0
    assert max(reference[c]["S"] for c in ("window_pool", "tree", "tree_budget")) > 1.2, \
        "no case accepted drafts: the test would not see a wrong commit"


def test_a_killed_rank_stops_the_others_with_an_error_naming_it(tmp_path: Path) -> None:
    started = time.perf_counter()
    results = launch(3, tmp_path / "out.json", "--kill-at-step", "5", "--kill-rank", "1", "--timeout", "30")
    elapsed = time.perf_counter() - started
    assert results[1].get("returncode") == -9                     # SIGKILL: it wrote nothing
    for rank in (0, 2):
        error = results[rank].get("error", "")
        assert "rank 1 is gone" in error and f"rank {rank} of 3" in error, results[rank]
    assert elapsed < 30 + 30, f"the survivors took {elapsed:.0f} s: they waited past the timeout"


def test_the_split_feeds_every_row_with_its_closure_and_balances_the_ranks() -> None:
    layout = step_layout(7, 4, chains(7, 4), False)          # W7 N5 window + 7 linear candidates of 4
    for ranks in (2, 3, 4):
        plan = shard_rows(layout.visible, layout.logit_rows, ranks)
        assert len(plan.fed) == ranks and all(rows[0] == 0 for rows in plan.fed)
        for row, owner in zip(layout.logit_rows.tolist(), plan.owner):
            fed = set(plan.fed[owner])
            assert set(layout.visible[row].nonzero().flatten().tolist()) <= fed      # its closure is there
        loads = [len(rows) for rows in plan.fed]
        assert max(loads) < layout.size * 0.75, (ranks, loads, layout.size)          # each feeds well under all
        assert sum(loads) >= layout.size                                            # every row somewhere
    chain = shard_rows(None, torch.arange(5), 3)
    assert chain == Shards((), (0, 0, 0, 0, 0))                                      # a chain: not split


def test_a_hung_rank_is_named_by_the_others_after_the_timeout(tmp_path: Path) -> None:
    started = time.perf_counter()
    results = launch(3, tmp_path / "out.json", "--kill-at-step", "4", "--kill-rank", "2", "--hang",
                     "--timeout", "8", hung=2)
    elapsed = time.perf_counter() - started
    for rank in (0, 1):
        error = results[rank].get("error", "")
        assert "rank 2 did not reach this collective within the timeout" in error, results[rank]
    assert elapsed < 8 * 4 + 20, f"the survivors took {elapsed:.0f} s"

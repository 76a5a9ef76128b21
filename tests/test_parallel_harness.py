"""Lookahead parallelism through the harness: ``torchrun --nproc-per-node P run.py ...`` writes
each row once (rank 0), with the ranks and the time in collectives; a rerun resumes; a bad setup
fails before any model loads, naming the key; a rank that dies ends the job with no partial item."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from experiments.config.errors import ConfigError
from experiments.config.schema import register_configs
from experiments.config.settings import plan, to_settings
from experiments.data.datasets import repo_root

from conftest import DATA_ROOT

register_configs()
LOOKAHEAD = "{use:lookahead,window:3,ngram:3,guess:3}"
JOB = ["model=tiny_llama", "threads=1", "warmup=0", "experiment=mtbench", "dataset.turns=1",
       "experiment.max_new_tokens=24", f"data_root={DATA_ROOT}"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(ranks: int, *overrides: str, env: dict | None = None, timeout: float = 300):
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "run.py", *JOB, *overrides]
    return subprocess.run(command, cwd=repo_root(), capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def rows(results: Path) -> pd.DataFrame:
    files = list(results.rglob("*.csv"))
    assert len(files) == 1, files
    return pd.read_csv(files[0])


def test_a_torchrun_launch_writes_each_row_once_and_resumes(tmp_path: Path) -> None:
    results = tmp_path / "raw"
    args = ("dataset.limit=2", f"results_dir={results}", f"decoders=[{LOOKAHEAD},hf_greedy]")
    done = torchrun(2, *args)
    assert done.returncode == 0, done.stderr[-3000:]
    df = rows(results)
    assert len(df) == 2 * 3 and not df.duplicated(["item_id", "turn", "decoder"]).any()
    sharded = df[df.decoder == "lookahead"]
    assert (sharded.lp_ranks == 2).all() and (sharded.comm_s > 0).all()
    assert (sharded.comm_s < sharded.decode_s).all()
    assert sharded.matches_greedy.all()                       # the split steps give greedy's tokens
    whole = df[df.decoder != "lookahead"]                     # the baseline and generate run whole on each rank
    assert (whole.lp_ranks == 1).all() and whole.comm_s.isna().all()
    assert "lookahead parallelism over 2 ranks, gloo" in done.stdout
    again = torchrun(2, *args)                                # every item done: nothing decodes, nothing is added
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 of 2 items already in" in again.stdout
    assert len(rows(results)) == 6


@pytest.mark.parametrize("fault", ["die", "hang"])
def test_a_rank_that_dies_or_hangs_ends_the_job_with_whole_items_only(tmp_path: Path, fault: str) -> None:
    """Rank 1 exits abruptly, or stops answering, in its 30th split forward (during the second
    item): the job ends within the timeout, naming rank 1, with the first item's rows whole and
    none of the second's; a rerun decodes only the second."""
    results = tmp_path / "raw"
    args = ("dataset.limit=2", f"results_dir={results}", f"decoders=[{LOOKAHEAD}]", "parallel.timeout_s=15")
    started = time.monotonic()
    tests = str(Path(__file__).parent)
    done = torchrun(2, *args, "plugins=[lp_fault]",
                    env={"LP_FAULT": fault, "LP_FAULT_RANK": "1", "LP_FAULT_AT": "30", "PYTHONPATH": tests})
    assert done.returncode != 0
    assert time.monotonic() - started < 150
    said = done.stdout + done.stderr
    if fault == "die":   # torchrun's agent stops the others and names the root cause
        assert re.search(r"rank 1 is gone|Root Cause[\s\S]*rank\s+: 1 ", said), said[-3000:]
    else:                # rank 0's collective times out and names the rank that never came
        assert "rank 1 did not reach this collective within the timeout" in said, said[-3000:]
    df = rows(results)
    assert df.item_id.nunique() == 1 and len(df) == 2     # item one's baseline and lookahead rows, nothing more
    again = torchrun(2, *args)
    assert again.returncode == 0, again.stderr[-3000:]
    df = rows(results)
    assert df.item_id.nunique() == 2 and len(df) == 4 and not df.duplicated(["item_id", "decoder"]).any()


def settings_under(monkeypatch, ranks: int, *overrides: str):
    monkeypatch.setenv("WORLD_SIZE", str(ranks))
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        return compose("config", overrides=[*JOB, "dataset.limit=1", *overrides])


@pytest.mark.parametrize("overrides, message", [
    ((f"decoders=[{LOOKAHEAD}]",), "parallel: 7 ranks (WORLD_SIZE) but decoder lookahead splits a step into at most 6 pieces"),
    (("decoders=[hf_greedy,hf_pld]",), "parallel: 7 ranks (WORLD_SIZE) but no decoder of this job"),
    (("decoders=[auto]",), "decoders: auto (kind auto) does not run under lookahead parallelism"),
    ((f"decoders=[{LOOKAHEAD}]", "parallel.backend=smoke"), "parallel.backend must be null or one of"),
    ((f"decoders=[{LOOKAHEAD}]", "parallel.timeout_s=0"), "parallel.timeout_s must be > 0"),
])
def test_a_bad_parallel_setup_fails_before_any_model_loads(monkeypatch, overrides, message) -> None:
    cfg = settings_under(monkeypatch, 7, *overrides)
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        to_settings(cfg)


@pytest.mark.parametrize("backend, message", [
    ("nccl", "parallel.backend: nccl needs CUDA tensors"),
    ("mpi", "parallel.backend: backend 'mpi' is not available in this torch build"),
])
def test_a_backend_this_machine_lacks_is_refused_before_the_model_loads(monkeypatch, backend, message) -> None:
    import torch
    import torch.distributed as dist

    if backend == "nccl" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA: nccl is fine here")
    if backend == "mpi" and dist.is_mpi_available():
        pytest.skip("this torch has MPI")
    cfg = settings_under(monkeypatch, 2, f"decoders=[{LOOKAHEAD}]", f"parallel.backend={backend}", "device=cpu")
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        plan(cfg)


def test_one_process_keeps_its_results_file(monkeypatch) -> None:
    """Without torchrun (or WORLD_SIZE=1) the parallel settings leave the file name alone; P ranks
    get a file of their own."""
    one = to_settings(settings_under(monkeypatch, 1, f"decoders=[{LOOKAHEAD}]"))
    two = to_settings(settings_under(monkeypatch, 2, f"decoders=[{LOOKAHEAD}]"))
    monkeypatch.delenv("WORLD_SIZE")
    plain = to_settings(settings_under(monkeypatch, 1, f"decoders=[{LOOKAHEAD}]"))
    assert one.ranks == 1 and two.ranks == 2
    assert one.fingerprint() == plain.fingerprint() != two.fingerprint()


def test_a_torchrun_batch_job_splits_decode_batch(tmp_path: Path) -> None:
    """``batch_size=2`` under two ranks: ``decode_batch``'s steps are split, every row equals greedy."""
    results = tmp_path / "raw"
    done = torchrun(2, "dataset.limit=2", "batch_size=2", f"results_dir={results}",
                    "decoders=[{use:lookahead,window:3,ngram:3,guess:3,prompt_pool:true}]")
    assert done.returncode == 0, done.stderr[-3000:]
    df = rows(results)
    sharded = df[df.decoder == "lookahead"]
    assert len(df) == 4 and (sharded.lp_ranks == 2).all() and (sharded.batch_size == 2).all()
    assert sharded.matches_greedy.all() and (sharded.comm_s > 0).all()

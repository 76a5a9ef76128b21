"""Lookahead parallelism over nccl, checked on a CPU (issue 45, findings 1, 2 and 4): ``torch.cuda``
and ``torch.distributed`` are faked where a GPU would be needed.

- each rank takes the GPU ``LOCAL_RANK`` (``set_device``, ``device_id=``), and a model on another
  GPU is refused;
- no collective carries a tensor off the backend's device (the ranks' process ids go through the
  rendezvous store);
- ``comm_seconds`` runs until a collective completes (nccl's are asynchronous), not until it is
  enqueued, and excludes the forward's kernels still running when it starts;
- a collective that never completes raises ParallelError naming the rank, within our timeout
  (nccl's watchdog would abort the process instead);
- ``agree`` goes through the store: rank 0 may be busy (scoring, writing rows) for longer than the
  collective timeout;
- the cost model's ``measure`` uses the job's backend (nccl on GPUs), its all-gathers on the device."""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from experiments.models.tiny import tiny_random_model
from lookahead_core import parallel
from lookahead_core.parallel import ParallelError, ShardedLM

HOST = zlib.crc32(socket.gethostname().encode())
REPO = Path(__file__).resolve().parents[1]


class Work:
    """An async collective's work that completes ``after`` seconds from its start (never: None)."""

    def __init__(self, after: float | None) -> None:
        self.done_at = None if after is None else time.perf_counter() + after

    def is_completed(self) -> bool:
        return self.done_at is not None and time.perf_counter() >= self.done_at

    def wait(self, timeout=None) -> bool:
        return True


@pytest.fixture
def world(monkeypatch):
    """This process as rank 0 of two over nccl, its model on cuda:0; rank 1 (faked) has joined."""
    store = dist.HashStore()
    store.set_timeout(datetime.timedelta(seconds=5))
    store.set("peer/1", f"{os.getpid()} {HOST}")
    store.set("calls/1", "1")
    state = SimpleNamespace(store=store, rank=0, gathers=[], syncs=[], sync_s=0.0)
    monkeypatch.setattr(parallel, "_STORE", store)
    monkeypatch.setattr(parallel, "_TIMEOUT_S", 60.0, raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda group=None: state.rank)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(ShardedLM, "device", property(lambda self: torch.device("cuda", 0)))

    def synchronize(device=None):
        state.syncs.append(device)
        time.sleep(state.sync_s)

    def nccl_only(tensor_list, tensor, group=None, async_op=False):      # nccl has no CPU tensors
        state.gathers.append(tensor.device)
        if tensor.device.type != "cuda":
            raise RuntimeError(f"No backend type associated with device type {tensor.device.type}")
        return Work(0)

    def broadcast(tensor, src=0, group=None, async_op=False):
        raise RuntimeError(f"broadcast of a tensor on {tensor.device}: agree must not need a collective")

    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(dist, "all_gather", nccl_only)
    monkeypatch.setattr(dist, "broadcast", broadcast)
    return state


@pytest.fixture(scope="module")
def model():
    return tiny_random_model("llama", seed=1)


# -- finding 1: each rank its own GPU ---------------------------------------------------------

@pytest.fixture
def torchrun_env(monkeypatch):
    """torchrun's variables for rank 1 of 2, two GPUs; init's process group and store recorded."""
    calls = SimpleNamespace(set_device=[], init=[])
    for key, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29999"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.set_device.append(device))
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "TCPStore", lambda *args, **kwargs: dist.HashStore())
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kwargs: calls.init.append((backend, kwargs)))
    monkeypatch.setattr(parallel, "_STORE", None)
    monkeypatch.setattr(parallel, "_TIMEOUT_S", 60.0, raising=False)
    return calls


def test_each_rank_takes_the_gpu_of_its_local_rank(torchrun_env) -> None:
    parallel.init(timeout_s=30)
    assert [torch.device(d) for d in torchrun_env.set_device] == [torch.device("cuda", 1)]
    (backend, kwargs), = torchrun_env.init
    assert backend == "nccl" and kwargs["device_id"] == torch.device("cuda", 1)
    assert kwargs["timeout"] > datetime.timedelta(seconds=30)       # nccl's watchdog after our own timeout
    assert parallel._TIMEOUT_S == 30


def test_more_ranks_than_gpus_is_refused_naming_the_local_rank(torchrun_env, monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "2")
    with pytest.raises(ParallelError, match="rank 1 is LOCAL_RANK 2, but this host has 2 GPU"):
        parallel.init(timeout_s=30)
    assert not torchrun_env.init


def test_a_model_on_another_gpu_than_the_ranks_is_refused(world, model, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    with pytest.raises(ParallelError, match=r"model is on cuda:0, but this rank's GPU is cuda:1"):
        ShardedLM(model)


# -- finding 2: no CPU tensor in an nccl collective ---------------------------------------------

def test_sharded_init_sends_no_cpu_tensor_over_nccl(world, model) -> None:
    lm = ShardedLM(model)
    assert world.gathers == []                                      # no collective at all: the store
    assert lm._peers == [(os.getpid(), HOST)] * 2


def test_a_rank_that_never_starts_its_model_is_named(world, model, monkeypatch) -> None:
    world.store.delete_key("peer/1")
    monkeypatch.setattr(parallel, "WAIT_S", 0.2, raising=False)
    with pytest.raises(ParallelError, match="rank 0 of 2: rank 1 did not start its model within 0.2 s"):
        ShardedLM(model)


# -- finding 4: time and timeouts of asynchronous collectives ------------------------------------

def test_comm_seconds_run_until_the_collective_completes(world, model, monkeypatch) -> None:
    monkeypatch.setattr(dist, "all_gather", lambda parts, mine, group=None, async_op=False: Work(0.3))
    lm = ShardedLM(model)
    lm.comm_seconds = 0.0
    world.sync_s = 1.0                            # the forward's kernels still running: model time, not comm
    lm._gather([torch.ones(4)], [1, 1], torch.zeros(1, 4))
    assert 0.3 <= lm.comm_seconds < 1.0, lm.comm_seconds
    assert world.syncs == [torch.device("cuda", 0)]                 # the model's device, before the clock


def test_a_collective_that_never_completes_names_the_rank_within_our_timeout(world, model, monkeypatch) -> None:
    monkeypatch.setattr(parallel, "_TIMEOUT_S", 0.5, raising=False)       # init(timeout_s=0.5)
    monkeypatch.setattr(dist, "all_gather", lambda parts, mine, group=None, async_op=False: Work(None))
    lm = ShardedLM(model)
    started = time.perf_counter()
    with pytest.raises(ParallelError, match="rank 0 of 2, step 0: all_gather \\(logits\\) failed: rank 1 did not "
                                            "reach this collective within the timeout"):
        lm._gather([torch.ones(4)], [1, 1], torch.zeros(1, 4))
    assert 0.5 <= time.perf_counter() - started < 5
    assert lm.comm_seconds >= 0.5


def test_agree_needs_no_collective(world, monkeypatch) -> None:
    monkeypatch.setattr(parallel, "_agreed", 0, raising=False)
    assert parallel.agree([3, 1, 4], "the batches left to decode") == [3, 1, 4]     # rank 0: no wait
    monkeypatch.setattr(parallel, "_agreed", 0, raising=False)
    world.rank = 1
    assert parallel.agree([], "the batches left to decode") == [3, 1, 4]
    with pytest.raises(ParallelError, match="rank 1 of 2: rank 0 did not send the time budget's verdict within 0.2 s"):
        parallel.agree([], "the time budget's verdict", wait_s=0.2)


AGREE = textwrap.dedent("""
    import json, os, sys, time
    sys.path.insert(0, {repo!r})
    from lookahead_core import parallel
    parallel.init("gloo", timeout_s=2)
    if os.environ["RANK"] == "0":
        time.sleep(5)                          # scoring, writing rows: longer than the collective timeout
    first = parallel.agree([3, 1, 4] if os.environ["RANK"] == "0" else [], "the batches left to decode")
    second = parallel.agree([0], "the time budget's verdict")
    print(json.dumps([first, second]))
""")


def test_agree_outlasts_a_rank_0_busy_longer_than_the_collective_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = AGREE.format(repo=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", script], text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r),
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "OMP_NUM_THREADS": "1"})
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    for proc, (out, err) in zip(procs, outs):
        assert proc.returncode == 0, err[-2000:]
        assert json.loads(out.strip().splitlines()[-1]) == [[3, 1, 4], [0]]


# -- finding 4: the cost model measures the job's backend ----------------------------------------

def test_measure_uses_nccl_on_gpus_and_gloo_on_cpus(monkeypatch, tmp_path) -> None:
    from experiments.tools import app
    from experiments.tools import parallel as tool

    class Stop(Exception):
        pass

    backends = []

    def init(backend=None, timeout_s=60.0):
        backends.append(backend)
        raise Stop

    monkeypatch.setattr(parallel, "init", init)
    for device in ("cuda", "cpu"):
        with pytest.raises(Stop):
            tool.measure(app.settings("parallel", [f"out={tmp_path / 'measured.json'}", "model=tiny_llama", "kv_length=16",
                                                   "repeats=1", f"device={device}"], tool.check))
    assert backends == ["nccl", "gloo"]
    with pytest.raises(Stop):
        tool.measure(app.settings("parallel", [f"out={tmp_path / 'measured.json'}", "model=tiny_llama", "kv_length=16",
                                               "repeats=1", "device=cuda", "backend=gloo"], tool.check))
    assert backends == ["nccl", "gloo", "gloo"]


def test_measured_all_gathers_stay_on_the_device_under_nccl(monkeypatch) -> None:
    from experiments.tools.parallel import all_gather_seconds

    sent = []
    monkeypatch.setattr(dist, "barrier", lambda group=None: None)
    monkeypatch.setattr(dist, "all_gather", lambda parts, mine, group=None, async_op=False:
                        sent.append([mine.device, *(p.device for p in parts)]))
    mine = torch.zeros(16, device="meta")        # stands for cuda:LOCAL_RANK: no copy through host memory
    assert all_gather_seconds(mine, 2, "nccl") >= 0
    assert sent == [[torch.device("meta")] * 3]

"""Lookahead Parallelism: one step's rows spread over the ranks of a ``torch.distributed`` group.

Every rank holds a full replica of the model and the whole committed KV cache (the memory cost:
P replicas). A step that branches (window columns, tree nodes) is split: every logit row the loop
needs gets one owner rank, and each rank feeds the rows it owns plus the rows they see (their
closure under the step's mask: the input token, a window column's lower levels, a node's
ancestors), so a row may be fed on two ranks but its logits are taken from one. Rows that form a
plain causal chain (the prefill, greedy and one-candidate steps) are fed on every rank: each must
hold their KV. After the forward the owners' logits rows are all-gathered, so the decode loop
verifies, advances its window and updates its sources on every rank from the same tensor:
every rank makes the same decisions with no further exchange, sampling included (the same
generator draws the same numbers on every rank). After verification the accepted rows' KV is
copied from the rank that computed it to the ranks that did not (one all-gather), so every
rank's cache stays the same committed prefix.

The collectives are ``all_gather``s of tensors on the model's device, which must be the backend's:
under nccl each rank takes the GPU ``LOCAL_RANK`` (:func:`init`). Each is waited for, at most the
timeout, by polling its work: a collective that fails (a peer died) or does not complete in time
raises :class:`ParallelError` naming the rank that is gone, or those that did not reach it, never a
hang (nccl's own watchdog, which would abort the process, is set to fire later). ``comm_seconds``
runs from when this rank's inputs are ready (its device synchronized) to when the result is. What
is not a tensor (the ranks' process ids, :func:`agree`'s values) goes through the rendezvous store.

The partition (:func:`shard_rows`) is a pure function of the step's mask, the same on every
rank: logit rows by decreasing closure size, each to the rank whose fed rows would then be
fewest (longest-processing-time first), ties to the rank that needs fewer new rows, then the
lower rank.
"""

from __future__ import annotations

import datetime
import os
import socket
import time
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .model_io import CausalLM, Feed, commit_kv, to_device


class ParallelError(RuntimeError):
    """A rank of the group failed, or did not answer a collective within the timeout."""


@dataclass(frozen=True)
class Shards:
    """One feed's rows per rank and the owner of each of its logit rows."""

    fed: tuple[tuple[int, ...], ...]     # per rank: the feed's rows it feeds, sorted (row 0 always)
    owner: tuple[int, ...]               # per logit row (in ``logit_rows`` order): the rank whose logits count

    def local(self, rank: int, row: int) -> int | None:
        """Where ``row`` of the feed sits among ``rank``'s fed rows (None: not fed there)."""
        rows = self.fed[rank]
        lo, hi = 0, len(rows)
        while lo < hi:
            mid = (lo + hi) // 2
            if rows[mid] < row:
                lo = mid + 1
            else:
                hi = mid
        return lo if lo < len(rows) and rows[lo] == row else None

    def source(self, row: int) -> int | None:
        """The lowest rank that fed ``row`` (None: none did)."""
        return next((r for r in range(len(self.fed)) if self.local(r, row) is not None), None)


def shard_rows(visible: torch.Tensor | None, logit_rows: torch.Tensor, ranks: int) -> Shards:
    """Split a feed over ``ranks`` (``visible``: (q, q) bool, each row's closure under the step's
    mask). A causal chain (``visible`` None) is not split: ``fed`` is empty (every rank feeds
    every row) and rank 0 owns every logit row."""
    rows = logit_rows.tolist()
    if visible is None:
        return Shards((), tuple(0 for _ in rows))
    q = visible.shape[0]
    fed = torch.zeros(ranks, q, dtype=torch.bool)
    fed[:, 0] = True
    sizes = visible[rows].sum(1).tolist()
    for index in sorted(range(len(rows)), key=lambda i: (-sizes[i], rows[i])):
        row = rows[index]
        if bool(fed[:, row].any()):
            continue                              # an ancestor of a row placed before: fed already
        merged = fed | visible[row]
        load, new = merged.sum(1).tolist(), (merged & ~fed).sum(1).tolist()
        rank = min(range(ranks), key=lambda r: (load[r], new[r], r))
        fed[rank] = merged[rank]
    owner = tuple(int(fed[:, row].nonzero()[0]) for row in rows)
    return Shards(tuple(tuple(fed[r].nonzero().flatten().tolist()) for r in range(ranks)), owner)


def _sub_feed(feed: Feed, rows: tuple[int, ...], logit_rows: list[int]) -> Feed:
    """The part of ``feed`` one rank feeds: ``rows`` (sorted), logits of ``logit_rows`` (local indices)."""
    index = torch.tensor(rows)
    offsets = feed.offsets[index]
    visible = feed.visible[index][:, index]
    chain = bool(torch.equal(offsets, torch.arange(len(rows)))) and \
        bool(torch.equal(visible, torch.ones(len(rows), len(rows), dtype=torch.bool).tril()))
    return Feed([feed.tokens[r] for r in rows], offsets, None if chain else visible, feed.position,
                torch.tensor(sorted(set(logit_rows) | {0})))


class ShardedLM(CausalLM):
    """A :class:`CausalLM` whose branching steps are split over the ranks of ``group`` (default:
    the world group, which must be initialised: :func:`init`). Decode with it as with a
    ``CausalLM``, on every rank, with the same arguments: every rank returns the same tokens.

    ``comm_seconds`` adds up the time spent in collectives (the loop reports it per decode); each
    waits at most ``timeout_s`` (default: :func:`init`'s)."""

    sharded = True

    def __init__(self, model: torch.nn.Module, group=None, drafters: dict | None = None,
                 timeout_s: float | None = None) -> None:
        super().__init__(model, drafters)
        if not dist.is_initialized() or _STORE is None:
            raise ParallelError("lookahead parallelism needs the process group of lookahead_core.parallel.init "
                                "(under torchrun)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.ranks = dist.get_world_size(group)
        self.timeout_s = timeout_s or _TIMEOUT_S
        self._last: tuple[int, list[Shards]] | None = None
        self.comm_seconds = 0.0
        self._step = 0
        self.store = _STORE
        if dist.get_backend(group) == "nccl" and self.device != torch.device("cuda", torch.cuda.current_device()):
            raise ParallelError(f"lookahead parallelism, rank {self.rank}: the model is on {self.device}, but this "
                                f"rank's GPU is cuda:{torch.cuda.current_device()} (LOCAL_RANK): load it there")
        self._beat("init")
        self.store.set(f"peer/{self.rank}", f"{os.getpid()} {zlib.crc32(socket.gethostname().encode())}")
        self._peers = [tuple(map(int, _read(f"peer/{r}", f"rank {r} did not start its model", WAIT_S).split()))
                       for r in range(self.ranks)]

    # -- the forward -------------------------------------------------------------------------

    def forward_batch(self, cache, feeds: list[Feed], hidden: bool = False):
        self._step += 1
        plans = [shard_rows(f.visible, f.logit_rows, self.ranks) for f in feeds]
        self._last = (cache.get_seq_length(), plans)
        if all(not plan.fed for plan in plans):              # causal chains: every rank feeds all
            outs = super().forward_batch(cache, feeds, hidden)
            return self._share(outs, feeds, plans, hidden)
        local = []
        for f, plan in zip(feeds, plans):
            if not plan.fed:
                local.append(f)
                continue
            mine = [plan.local(self.rank, row) for row, owner in zip(f.logit_rows.tolist(), plan.owner)
                    if owner == self.rank]
            local.append(_sub_feed(f, plan.fed[self.rank], mine))
        outs = super().forward_batch(cache, local, hidden)
        return self._share(outs, feeds, plans, hidden, local)

    def _share(self, outs, feeds: list[Feed], plans: list[Shards], hidden: bool, local: list[Feed] | None = None):
        """Every feed's logits (and hidden states) of its logit rows, each row from its owner."""
        logits = [o[0] for o in outs] if hidden else list(outs)
        states = [o[1] for o in outs] if hidden else None
        picks: list[tuple[int, int, int]] = []          # (feed, logit index, rank) in the canonical order
        mine_rows: list[torch.Tensor] = []
        mine_states: list[torch.Tensor] = []
        for b, (f, plan) in enumerate(zip(feeds, plans)):
            sub = local[b] if local is not None else f
            sub_rows = sub.logit_rows.tolist()
            for j, (row, owner) in enumerate(zip(f.logit_rows.tolist(), plan.owner)):
                picks.append((b, j, owner))
                if owner != self.rank:
                    continue
                at = sub_rows.index(plan.local(self.rank, row) if plan.fed else row)
                mine_rows.append(logits[b][at])
                if hidden:
                    mine_states.append(states[b][at])
        counts = [sum(1 for *_, r in picks if r == rank) for rank in range(self.ranks)]
        gathered = self._gather(mine_rows, counts, logits[0])
        gathered_states = self._gather(mine_states, counts, states[0]) if hidden else None
        taken = [0] * self.ranks
        rows_of: list[list[torch.Tensor]] = [[] for _ in feeds]
        states_of: list[list[torch.Tensor]] = [[] for _ in feeds]
        for b, _, rank in picks:
            rows_of[b].append(gathered[rank][taken[rank]])
            if hidden:
                states_of[b].append(gathered_states[rank][taken[rank]])
            taken[rank] += 1
        out = [torch.stack(r) for r in rows_of]
        return [(lg, torch.stack(s)) for lg, s in zip(out, states_of)] if hidden else out

    def _gather(self, rows: list[torch.Tensor], counts: list[int], like: torch.Tensor) -> list[torch.Tensor]:
        """All-gather each rank's ``rows`` (``counts[r]`` of them on rank r), padded to the most."""
        width = like.shape[-1]
        most = max(counts)
        mine = torch.zeros(most, width, dtype=like.dtype, device=like.device)
        if rows:
            mine[: len(rows)] = torch.stack(rows)
        parts = [torch.empty_like(mine) for _ in range(self.ranks)]
        self._collective("all_gather (logits)", lambda: dist.all_gather(parts, mine, group=self.group, async_op=True))
        return parts

    # -- the commit ---------------------------------------------------------------------------

    def commit(self, cache, past: int, keep_rows: list[list[int]], valid: list[int] | None = None,
               also: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Keep each sequence's accepted rows (rows of the last forward's feeds, relative to
        ``past``) on every rank: rows this rank fed move down as in :func:`commit_kv`; a row some
        rank did not feed is sent by the lowest rank that did (one all-gather for the step)."""
        last_past, plans = self._last
        if last_past != past:
            raise ValueError(f"commit after a forward at {last_past}, not {past}")
        if all(not plan.fed for plan in plans):
            return commit_kv(cache, past, keep_rows, valid, also, self.device)
        valid = valid if valid is not None else [past] * len(keep_rows)
        moves: list[tuple[int, int, int]] = []             # (sequence, destination slot, local slot)
        copies: list[tuple[int, int, int, int]] = []       # (sequence, destination, source rank, its slot)
        for b, (rows, plan, start) in enumerate(zip(keep_rows, plans, valid)):
            for i, row in enumerate(rows):
                here = plan.local(self.rank, row) if plan.fed else row
                if here is not None:
                    moves.append((b, start + i, past + here))
                if plan.fed and any(plan.local(r, row) is None for r in range(self.ranks)):
                    source = plan.source(row)
                    copies.append((b, start + i, source, past + plan.local(source, row)))
        moved = {(b, dst) for b, dst, _ in moves}
        fresh = [i for i, (b, dst, _, _) in enumerate(copies) if (b, dst) not in moved]   # rows this rank lacks
        received = self._exchange_kv(cache, copies, fresh) if copies else None
        device = cache.layers[0].keys.device             # index tensors: made once, not per layer
        if moves:
            row, dst, src = (torch.tensor(x, device=device) for x in zip(*moves))
        if fresh:
            into, slot = (torch.tensor(x, device=device) for x in zip(*[copies[i][:2] for i in fresh]))
        new_len = max(start + len(rows) for start, rows in zip(valid, keep_rows))
        for n, layer in enumerate(cache.layers):
            keys, values = layer.keys, layer.values
            if keys.shape[2] < new_len:               # this rank fed fewer rows than were accepted
                pad = new_len - keys.shape[2]
                keys = torch.cat([keys, keys.new_zeros(*keys.shape[:2], pad, keys.shape[3])], 2)
                values = torch.cat([values, values.new_zeros(*values.shape[:2], pad, values.shape[3])], 2)
            if moves:
                moved_k, moved_v = keys[row, :, src], values[row, :, src]      # read all before writing
                keys[row, :, dst], values[row, :, dst] = moved_k, moved_v
            if fresh:
                keys[into, :, slot], values[into, :, slot] = received[n]
            layer.keys, layer.values = keys[..., :new_len, :], values[..., :new_len, :]
        return to_device(also, self.device) if also else {}

    def _exchange_kv(self, cache, copies: list[tuple[int, int, int, int]], wanted: list[int]):
        """Per layer, ``(keys, values)`` ((n, H, D) each) of the ``wanted`` entries of ``copies``, each
        sent by its source rank: one all-gather of every layer's rows, padded to the rank that sends most."""
        most = max(sum(1 for c in copies if c[2] == r) for r in range(self.ranks))
        device = cache.layers[0].keys.device
        mine = [(b, slot) for b, _, source, slot in copies if source == self.rank]
        if mine:
            b, slot = (torch.tensor(x, device=device) for x in zip(*mine))
        shapes, flat = [], []
        for layer in cache.layers:
            for kv in (layer.keys, layer.values):
                part = kv.new_zeros(most, kv.shape[1], kv.shape[3])
                if mine:
                    part[: len(mine)] = kv[b, :, slot]
                shapes.append(part.shape)
                flat.append(part.flatten())
        payload = torch.cat(flat)
        parts = [torch.empty_like(payload) for _ in range(self.ranks)]
        self._collective("all_gather (accepted rows' KV)",
                         lambda: dist.all_gather(parts, payload, group=self.group, async_op=True))
        if not wanted:
            return None
        # the i-th copy is its source's k-th sent row, k = the copies before it from that source
        picks = [(copies[i][2], sum(1 for c in copies[:i] if c[2] == copies[i][2])) for i in wanted]
        source, k = (torch.tensor(x, device=device) for x in zip(*picks))
        gathered, out, at = torch.stack(parts), [], 0
        for shape in shapes:
            out.append(gathered[:, at:at + shape.numel()].reshape(self.ranks, *shape)[source, k])
            at += shape.numel()
        return list(zip(out[0::2], out[1::2]))

    # -- faults -------------------------------------------------------------------------------

    def _beat(self, what: str) -> None:
        """Say, in the store, how many collectives this rank has entered."""
        self._calls = getattr(self, "_calls", 0) + 1
        self.store.set(f"calls/{self.rank}", str(self._calls))

    def _collective(self, what: str, run) -> None:
        """Start ``run`` (an ``async_op`` collective: it returns its work) and wait, polling, until it
        completes or ``timeout_s`` has passed; the time from this rank's inputs being ready (its device
        synchronized: the forward's kernels are not communication) to the result adds to ``comm_seconds``."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        started = time.perf_counter()
        self._beat(what)
        try:
            work, pause = run(), 1e-5
            while not work.is_completed():
                if time.perf_counter() - started > self.timeout_s:
                    raise TimeoutError(f"not complete after {self.timeout_s:g} s")
                time.sleep(pause)
                pause = min(2 * pause, 1e-3)
            work.wait()                      # raises the collective's error; nccl: the stream waits on it
        except (RuntimeError, TimeoutError, dist.DistError) as error:
            raise ParallelError(f"lookahead parallelism, rank {self.rank} of {self.ranks}, step {self._step}: "
                                f"{what} failed: {self._culprits()} ({error})") from error
        finally:
            self.comm_seconds += time.perf_counter() - started

    def _culprits(self) -> str:
        """Which peers are gone (same host: their process has exited), else who did not answer."""
        host = zlib.crc32(socket.gethostname().encode())
        gone = [r for r, (pid, h) in enumerate(self._peers) if r != self.rank and h == host and not _alive(pid)]
        if gone:
            return "rank " + ", ".join(map(str, gone)) + (" is" if len(gone) == 1 else " are") + " gone"
        try:
            calls = {r: int(self.store.get(f"calls/{r}")) for r in range(self.ranks)}
            behind = [r for r, n in calls.items() if n < self._calls]
        except (RuntimeError, ValueError, dist.DistError):
            behind = []                                 # the store's host is gone too
        if behind:
            return "rank " + ", ".join(map(str, behind)) + " did not reach this collective within the timeout"
        others = [r for r in range(self.ranks) if r != self.rank]
        return ("rank " + ", ".join(map(str, others)) + " did not answer within the timeout (alive, or on "
                "another host)")


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, exited but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


_STORE = None           # the rendezvous store init() joined: the ranks' process ids and steps, agree()'s values
_TIMEOUT_S = 60.0       # init()'s timeout_s: how long a collective may take
NCCL_GRACE_S = 60.0     # nccl's watchdog (which aborts the process) fires this much after our timeout
WAIT_S = 1800.0         # how long a rank waits, outside collectives, for another: a model's load, and
                        # rank 0's scoring (sandboxed code) and writing of rows between batches (agree)


def init(backend: str | None = None, timeout_s: float = 60.0) -> None:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``/``PORT``): ``gloo`` on CPUs, ``nccl`` when CUDA is available (or ``backend``).
    Under nccl each rank takes the GPU ``LOCAL_RANK`` (``torch.cuda.set_device``; the group is bound
    to it): load the model there. Every collective waits at most ``timeout_s`` (nccl's watchdog
    ``NCCL_GRACE_S`` later). The rendezvous store (torchrun's agent's, else rank 0's) is kept for the
    ranks' process ids and step counters and :func:`agree`."""
    global _STORE, _TIMEOUT_S
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    check_backend(backend)
    if dist.is_initialized():
        return
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise ParallelError(f"lookahead parallelism: {', '.join(missing)} not set: launch with torchrun "
                            "(torchrun --nproc-per-node P run.py ...)")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = None
    if backend == "nccl":
        local, gpus = int(os.environ.get("LOCAL_RANK", rank)), torch.cuda.device_count()
        if local >= gpus:
            raise ParallelError(f"lookahead parallelism over nccl: rank {rank} is LOCAL_RANK {local}, but this host "
                                f"has {gpus} GPU(s): launch at most {gpus} processes per host, one per GPU")
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=timeout_s)
    host = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, is_master=host,
                          timeout=timeout)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")     # a restarted job's keys are its own
    _STORE, _TIMEOUT_S = dist.PrefixStore(f"lookahead_parallel/{attempt}/", store), timeout_s
    watchdog = timeout + datetime.timedelta(seconds=NCCL_GRACE_S if backend == "nccl" else 0)
    dist.init_process_group(backend, store=dist.PrefixStore(f"group/{attempt}/", store), rank=rank, world_size=world,
                            timeout=watchdog, device_id=device)


def rank() -> int:
    """This process's rank in the world group (0 when none is initialised)."""
    return dist.get_rank() if dist.is_initialized() else 0


def _read(key: str, failure: str, wait_s: float) -> str:
    """The store's ``key``, once set (at most ``wait_s``); else ParallelError saying ``failure``."""
    try:
        _STORE.wait([key], datetime.timedelta(seconds=wait_s))
        return _STORE.get(key).decode()
    except (RuntimeError, dist.DistError) as error:
        raise ParallelError(f"lookahead parallelism, rank {rank()} of {dist.get_world_size()}: {failure} within "
                            f"{wait_s:g} s ({error})") from error


_agreed = 0             # agree() calls so far: the key of the next


def agree(values: list[int], what: str, wait_s: float = WAIT_S) -> list[int]:
    """Rank 0's ``values`` on every rank, so that every rank takes the same decisions from what only
    rank 0 knows (a job's finished items, its time budget). Through the rendezvous store, not a
    collective: rank 0 does not wait; the others wait for it at most ``wait_s`` (rank 0 scores items
    and writes rows between batches, which no collective timeout bounds), then raise ParallelError."""
    global _agreed
    if _STORE is None:
        raise ParallelError("lookahead parallelism: agree needs lookahead_core.parallel.init")
    _agreed += 1
    key = f"agree/{_agreed}"
    if rank() == 0:
        _STORE.set(key, " ".join(map(str, values)))
        return list(values)
    return [int(v) for v in _read(key, f"rank 0 did not send {what}", wait_s).split()]


def check_backend(backend: str) -> None:
    """Raise ``ValueError`` if ``backend`` is not built into this torch."""
    available = {"gloo": dist.is_gloo_available, "nccl": dist.is_nccl_available, "mpi": dist.is_mpi_available}
    if backend not in available:
        raise ValueError(f"backend {backend!r} is not one of {sorted(available)}")
    if not dist.is_available() or not available[backend]():
        raise ValueError(f"backend {backend!r} is not available in this torch build ({torch.__version__})")

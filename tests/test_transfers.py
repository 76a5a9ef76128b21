"""Host<->device transfers a decode step makes, counted on the CPU as if the model ran on a GPU.

``DeviceSim`` (a ``TorchFunctionMode``) tags the model's parameters and buffers, and every tensor
computed from them or created with an explicit ``device=``, as *device* tensors; every other tensor
lives on the *host*. It counts what would cross between the two on an accelerator: a host tensor
moved or created on the device (``.to(device)``, ``torch.tensor(data, device=...)``), a host tensor
of more than one element used in an op on device tensors (an implicit copy, e.g. indexing a device
tensor with a host index), and a device tensor read by the host (``tolist``, ``item``, ``cpu``,
``bool``...) or an op that makes the host wait for its result size (``nonzero``, ``unique``, boolean
indexing). A step must make at most ``MAX_PER_STEP`` transfers whatever the number of layers
(issue 45: the KV commit moved its indices to the device once per layer, 3 x 32 on a 7B).

On a real GPU the same count is taken with ``torch.cuda.set_sync_debug_mode`` by the GPU command
(``scripts/gpu_run.py``).
"""

from __future__ import annotations

import weakref

import pytest
import torch
from torch.overrides import TorchFunctionMode

from experiments.models.loader import tiny_random_model
from lookahead_core import CausalLM, DecodeLimits, DecodeState, LookaheadConfig, NGramPool, decode, decode_batch
from lookahead_core import decoder as decoder_module
from lookahead_core.capability import probe
from lookahead_core.model_io import CausalLM as CausalLMClass

MAX_PER_STEP = 4

_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__bool__,
          torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}
_SIZE_SYNCS = {torch.nonzero, torch.Tensor.nonzero, torch.unique, torch.Tensor.unique, torch.masked_select,
               torch.Tensor.masked_select, torch.argwhere}
_COPIES_DATA = {torch.tensor, torch.as_tensor}


def _tensors(value, out):
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors(v, out)
    return out


def _names_device(value) -> bool:
    return isinstance(value, (torch.device, str)) and str(value).split(":")[0] in ("cpu", "cuda")


class DeviceSim(TorchFunctionMode):
    """Counts the host<->device transfers the code would make with ``model`` on an accelerator."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.ids: dict[int, weakref.ref] = {}      # id -> the device tensor (tensors compare by value)
        self.transfers: list[str] = []
        for t in (*model.parameters(), *model.buffers()):
            self.add(t)

    def add(self, t: torch.Tensor) -> None:
        self.ids[id(t)] = weakref.ref(t, lambda _, key=id(t): self.ids.pop(key, None))

    def on_device(self, t: torch.Tensor) -> bool:
        ref = self.ids.get(id(t))
        return ref is not None and ref() is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors(list(args), []) + _tensors(kwargs, [])
        device_in = any(self.on_device(t) for t in inputs)
        name = getattr(func, "__qualname__", getattr(func, "__name__", str(func)))
        if func in _READS and args and isinstance(args[0], torch.Tensor) and self.on_device(args[0]):
            self.transfers.append(f"device->host {name}")
        if func in _SIZE_SYNCS and device_in:
            self.transfers.append(f"device->host (result size) {name}")
        out = func(*args, **kwargs)
        if func is torch.Tensor.cpu and out is args[0]:
            out = out.clone()             # on a GPU a copy to the host is a new tensor; here it is its input
        to_device = False
        if func in (torch.Tensor.to, torch.Tensor.cuda):
            target = [a for a in args[1:] if _names_device(a) or isinstance(a, torch.Tensor)]
            target += [kwargs["device"]] if "device" in kwargs else []
            moves = func is torch.Tensor.cuda or (
                bool(target) and not (isinstance(target[0], torch.Tensor) and not self.on_device(target[0])))
            to_device = moves or self.on_device(args[0])         # .to(dtype) stays where it is
            if moves and not self.on_device(args[0]):
                if out is args[0]:
                    out = out.clone()     # on a GPU the copy is a new tensor; the host one stays on the host
                if args[0].numel():
                    self.transfers.append(f"host->device {name}")
        elif kwargs.get("device") is not None and _names_device(kwargs["device"]):
            to_device = True                      # a factory on the device: a kernel, no copy ...
            if func in _COPIES_DATA and not (isinstance(args[0], torch.Tensor) and self.on_device(args[0])):
                if torch.as_tensor(args[0]).numel():             # ... unless it carries host data
                    self.transfers.append(f"host->device {name}")
        elif device_in:
            to_device = True
            host = [t for t in inputs if not self.on_device(t) and t.dim() > 0]   # 0-d: passed as scalars
            if func is torch.Tensor.__getitem__ and any(t.dtype == torch.bool for t in inputs[1:]):
                self.transfers.append(f"device->host (result size) boolean index {name}")
            self.transfers += [f"host->device implicit {name}"] * len(host)
        if to_device and func not in _READS:
            for t in _tensors(out if not hasattr(out, "to_tuple") else out.to_tuple(), []):
                self.add(t)
        return out


def step_transfers(model, run) -> list[int]:
    """The transfers of every step of ``run(lm)``: counted from one forward to the next, so a step's
    count holds its verification, KV commit, draft planning and the forward's inputs."""
    lm = CausalLM(model)
    probe(lm)                       # the capability probe's forwards, once per model: not a decode step
    sim = DeviceSim(model)
    marks: list[int] = []
    forward = CausalLMClass.forward_batch

    def marked(self, cache, feeds, hidden=False):
        marks.append(len(sim.transfers))
        return forward(self, cache, feeds, hidden)

    CausalLMClass.forward_batch = marked
    try:
        with sim:
            run(lm)
    finally:
        CausalLMClass.forward_batch = forward
    marks.append(len(sim.transfers))
    steps = [b - a for a, b in zip(marks[1:-1], marks[2:])]   # from the first decoding step's inputs on
    assert steps, "the decode took no step"
    step_transfers.last = sim.transfers
    return steps


PROMPT = [5, 17, 3, 99, 42, 7, 5, 17, 3, 99, 8, 61, 23, 5, 17]


def greedy_text(model, n=40) -> list[int]:
    return decode(model, PROMPT, None, DecodeLimits(max_new_tokens=n)).tokens


def true_pool(model, config: LookaheadConfig) -> DecodeState:
    """A pool holding the greedy continuation's n-grams: steps accept several tokens, so the KV
    commit moves rows (the path that copied its indices once per layer)."""
    pool = NGramPool(config.ngram, config.guess)
    pool.add_from_sequence(PROMPT[-1:] + greedy_text(model))
    return DecodeState.with_pool(pool)


CONFIGS = {
    "greedy": None,
    "lookahead_w4_n3_g4_pool": LookaheadConfig(window=4, ngram=3, guess=4, prompt_pool=True),
    "pool_only_n4_g4": LookaheadConfig(window=1, ngram=4, guess=4, pool_only=True),
    "tree_suffix": LookaheadConfig(window=3, ngram=3, guess=3, tree=True, sources={"suffix": 2}, budget=24),
    "recycle": LookaheadConfig(window=1, ngram=4, guess=0, pool_only=False, sources={"recycle": 4}, tree=True,
                               budget=16),
}


@pytest.mark.parametrize("layers", [2, 6])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_a_step_makes_at_most_four_transfers_whatever_the_layers(name, layers):
    model = tiny_random_model("llama", num_hidden_layers=layers)
    config = CONFIGS[name]
    state = true_pool(model, config) if config is not None and config.guess else None
    limits = DecodeLimits(max_new_tokens=32)
    out = {}

    def run(lm):
        out["o"] = decode(lm, PROMPT, config, limits, state=state)

    steps = step_transfers(model, run)
    detail = step_transfers.last
    assert max(steps) <= MAX_PER_STEP, f"{name}, {layers} layers: per step {steps}; {detail[:40]}"
    if config is not None and config.guess:
        assert max(out["o"].stats.accepted) > 1, "no step accepted a draft: the KV commit's moves were not exercised"


def test_a_batch_step_makes_at_most_four_transfers():
    model = tiny_random_model("mistral", num_hidden_layers=4, sliding_window=8)
    config = LookaheadConfig(window=4, ngram=3, guess=4, prompt_pool=True)
    prompts = [PROMPT, PROMPT[3:] + [9, 9], PROMPT[:9]]
    steps = step_transfers(model, lambda lm: decode_batch(lm, prompts, config, DecodeLimits(max_new_tokens=24)))
    assert max(steps) <= MAX_PER_STEP, (steps, step_transfers.last[:40])


def test_the_count_has_teeth_a_per_layer_index_copy_is_seen(monkeypatch):
    """The KV commit as it was before issue 45 (its indices moved to the device inside the layer
    loop) makes 3 transfers per layer on a step that accepts drafts: the counter must see them."""
    from lookahead_core import model_io

    def per_layer_commit(cache, past, keep_rows, valid=None):
        valid = valid if valid is not None else [past] * len(keep_rows)
        moves = [(b, start + i, past + r) for b, (start, rows) in enumerate(zip(valid, keep_rows))
                 for i, r in enumerate(rows) if start + i != past + r]
        new_len = max(start + len(rows) for start, rows in zip(valid, keep_rows))
        if moves:
            row, dst, src = torch.tensor(moves).T
        for layer in cache.layers:
            if moves:
                device = layer.keys.device
                r, d, s = row.to(device), dst.to(device), src.to(device)
                layer.keys[r, :, d] = layer.keys[r, :, s]
                layer.values[r, :, d] = layer.values[r, :, s]
            layer.keys = layer.keys[..., :new_len, :]
            layer.values = layer.values[..., :new_len, :]

    monkeypatch.setattr(model_io, "commit_kv", per_layer_commit)
    model = tiny_random_model("llama", num_hidden_layers=6)
    config = CONFIGS["lookahead_w4_n3_g4_pool"]
    state = true_pool(model, config)
    steps = step_transfers(model, lambda lm: decode(lm, PROMPT, config, DecodeLimits(max_new_tokens=32),
                                                    state=state))
    assert max(steps) >= 3 * 6


def test_the_count_has_teeth_indexing_device_logits_with_a_host_index_is_seen():
    model = tiny_random_model("llama")
    sim = DeviceSim(model)
    with sim:
        logits = model(torch.tensor([[1, 2, 3]], device="cpu")).logits[0]
        logits[torch.tensor([0, 2])].argmax(-1).tolist()
    assert any("implicit" in t for t in sim.transfers) and any("tolist" in t for t in sim.transfers), sim.transfers


class _FakeEvent:
    """Stands in for ``torch.cuda.Event`` on the CPU: the time is the count of recorded events."""

    clock = 0
    synchronized: list = []

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.at = None

    def record(self, stream=None):
        _FakeEvent.clock += 1
        self.at = _FakeEvent.clock

    def synchronize(self):
        _FakeEvent.synchronized.append(self)

    def elapsed_time(self, end):
        return float(end.at - self.at) * 1e3          # ms


def test_the_forward_clock_never_synchronizes_a_step_on_a_gpu(monkeypatch):
    """On a GPU the core times forwards with CUDA events: no ``torch.cuda.synchronize`` per step (it
    made every user of ``decode`` wait for the device every step, timing or not), and the spans'
    total is read once, waiting for the last end event only."""
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    synchronized = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synchronized.append(device))
    _FakeEvent.synchronized = []
    clock = decoder_module.ForwardClock(torch.device("cuda:1"))
    spans = []
    for _ in range(5):
        with clock.span() as span:
            _FakeEvent.clock += 2                     # the forward's work between the events
        spans.append(span)
    assert synchronized == [] and _FakeEvent.synchronized == []
    assert clock.seconds(spans) == pytest.approx(5 * 3.0)
    assert _FakeEvent.synchronized == [spans[-1][1]] and synchronized == []


def test_decode_records_model_time_on_the_cpu():
    model = tiny_random_model("llama")
    stats = decode(model, PROMPT, LookaheadConfig(window=3, ngram=3, guess=3), DecodeLimits(max_new_tokens=8)).stats
    assert 0 < stats.model_seconds <= stats.decode_seconds and stats.prefill_seconds > 0


def test_the_harness_forward_meter_times_with_events_not_synchronize(monkeypatch):
    """The harness's forward hooks on a GPU record CUDA events (the same clock as the core's); they
    called ``torch.cuda.synchronize()`` twice a forward, on the default device whatever the model's."""
    from experiments.job.runner import ForwardMeter

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    synchronized = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synchronized.append(device))
    model = tiny_random_model("llama")
    meter = ForwardMeter(model)
    meter._clock = decoder_module.ForwardClock(torch.device("cuda:1"))     # as for a model on cuda:1
    _FakeEvent.synchronized = []
    try:
        for _ in range(3):
            model(torch.tensor([[1, 2, 3]]))
        assert synchronized == [] and _FakeEvent.synchronized == []
        assert len(meter.durations) == 3 and all(d > 0 for d in meter.durations)
    finally:
        meter.close()

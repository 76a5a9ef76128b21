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

import contextlib
import time
import weakref
from dataclasses import replace
from unittest import mock

import pytest
import torch
from torch.overrides import TorchFunctionMode

from experiments.models.tiny import tiny_random_model
from lookahead_core import (CausalLM, DecodeLimits, DecodeState, LookaheadConfig, NGramPool, SamplingConfig, decode,
                            decode_batch)
from lookahead_core import decoder as decoder_module
from lookahead_core.capability import probe
from lookahead_core.decoder import ForwardClock
from lookahead_core.model_io import CausalLM as CausalLMClass

MAX_PER_STEP = 4

_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.__bool__,
          torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__}
_SIZE_SYNCS = {torch.nonzero, torch.Tensor.nonzero, torch.unique, torch.Tensor.unique, torch.masked_select,
               torch.Tensor.masked_select, torch.argwhere}
_COPIES_DATA = {torch.tensor, torch.as_tensor}
# Comparisons whose answer is a Python value: the host waits for the device's result.
_HOST_ANSWERS = {torch.equal, torch.Tensor.equal, torch.allclose, torch.Tensor.allclose, torch.is_nonzero,
                 torch.Tensor.is_nonzero, torch.Tensor.__contains__, torch.Tensor.__array__, torch.Tensor.__complex__}
_REPEATS = {torch.repeat_interleave, torch.Tensor.repeat_interleave}   # with device repeats: a result size


def tensors_in(value, out):
    """Every tensor in ``value`` (nested lists, tuples and dicts), appended to ``out``."""
    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            tensors_in(v, out)
    elif isinstance(value, dict):
        for v in value.values():
            tensors_in(v, out)
    return out


def _names_device(value) -> bool:
    return isinstance(value, (torch.device, str)) and str(value).split(":")[0] in ("cpu", "cuda")


class DeviceSim(TorchFunctionMode):
    """Counts the host<->device transfers the code would make with ``modules`` (the model and any
    drafters) on an accelerator, and the host's explicit waits for the device: while it is on, the
    core's clocks take their CUDA path (``ForwardClock``: events recorded, read at the end) with
    stand-in events and streams, and ``torch.cuda.synchronize`` and every event's or stream's
    ``synchronize`` count as a transfer."""

    def __init__(self, *modules: torch.nn.Module) -> None:
        super().__init__()
        self.ids: dict[int, weakref.ref] = {}      # id -> the device tensor (tensors compare by value)
        self.transfers: list[str] = []
        for module in modules:
            for t in (*module.parameters(), *module.buffers()):
                self.add(t)
        self._patches = contextlib.ExitStack()

    def __enter__(self):
        sim, patch = self, self._patches.enter_context

        class Event:                        # torch.cuda.Event: recorded on the host's clock, waited for counted
            def __init__(self, enable_timing=False, blocking=False, interprocess=False):
                self.at = None

            def record(self, stream=None):
                self.at = time.perf_counter()

            def synchronize(self):
                sim.transfers.append("explicit Event.synchronize")

            def query(self):
                return True

            def elapsed_time(self, end):
                return (end.at - self.at) * 1e3

        class Stream:
            def synchronize(self):
                sim.transfers.append("explicit Stream.synchronize")

            def wait_event(self, event):
                pass

            def record_event(self, event=None):
                event = event or Event()
                event.record(self)
                return event

        patch(mock.patch.object(torch.cuda, "Event", Event))
        patch(mock.patch.object(torch.cuda, "Stream", Stream))
        patch(mock.patch.object(torch.cuda, "current_stream", lambda device=None: Stream()))
        patch(mock.patch.object(torch.cuda, "default_stream", lambda device=None: Stream()))
        patch(mock.patch.object(torch.cuda, "synchronize",
                                lambda device=None: sim.transfers.append("explicit torch.cuda.synchronize")))
        clock_init = ForwardClock.__init__

        def on_gpu(clock, device):
            clock_init(clock, device)
            clock.cuda = True                       # the clock a model on a GPU gets

        patch(mock.patch.object(ForwardClock, "__init__", on_gpu))
        return super().__enter__()

    def __exit__(self, *exc):
        self._patches.close()
        return super().__exit__(*exc)

    def add(self, t: torch.Tensor) -> None:
        self.ids[id(t)] = weakref.ref(t, lambda _, key=id(t): self.ids.pop(key, None))

    def on_device(self, t: torch.Tensor) -> bool:
        ref = self.ids.get(id(t))
        return ref is not None and ref() is t

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = tensors_in(list(args), []) + tensors_in(kwargs, [])
        device_in = any(self.on_device(t) for t in inputs)
        name = getattr(func, "__qualname__", getattr(func, "__name__", str(func)))
        if func in _READS and args and isinstance(args[0], torch.Tensor) and self.on_device(args[0]):
            self.transfers.append(f"device->host {name}")
        if func in _HOST_ANSWERS and device_in:
            self.transfers.append(f"device->host (a host answer) {name}")
        if func in _SIZE_SYNCS and device_in:
            self.transfers.append(f"device->host (result size) {name}")
        if func in _REPEATS and "output_size" not in kwargs and any(
                self.on_device(r) for r in [*args[1:2], kwargs.get("repeats")] if isinstance(r, torch.Tensor)):
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
            for t in tensors_in(out if not hasattr(out, "to_tuple") else out.to_tuple(), []):
                self.add(t)
        return out


def step_transfers(model, run, drafters: dict | None = None) -> list[int]:
    """The transfers of every step of ``run(lm)`` (``lm``: ``model`` with ``drafters``, all on the
    simulated device): counted from one forward to the next, so a step's count holds its
    verification, KV commit, the sources' learning and drafting (a drafter's forwards included)
    and the forward's inputs. What the decode's end does (it reads the clocks) is counted apart:
    ``step_transfers.end``."""
    lm = CausalLM(model, drafters=drafters)
    probe(lm)                       # the capability probe's forwards, once per model: not a decode step
    sim = DeviceSim(model, *(drafters or {}).values())
    for t in tensors_in(list(vars(lm.flex).values()) if lm.flex is not None else [], []):
        sim.add(t)                  # flex_attention's mask buffers: made on the device with the model
    marks: list[int] = []
    forward, read_clocks = CausalLMClass.forward_batch, decoder_module._read_clocks
    end: list[int] = []

    def marked(self, cache, feeds, hidden=False):
        marks.append(len(sim.transfers))
        return forward(self, cache, feeds, hidden)

    def at_end(seqs, clock):
        end.append(len(sim.transfers))
        read_clocks(seqs, clock)

    CausalLMClass.forward_batch = marked
    decoder_module._read_clocks = at_end
    try:
        with sim:
            run(lm)
    finally:
        CausalLMClass.forward_batch, decoder_module._read_clocks = forward, read_clocks
    marks.append(end[-1])
    steps = [b - a for a, b in zip(marks[1:-1], marks[2:])]   # from the first decoding step's inputs on
    assert steps, "the decode took no step"
    step_transfers.last = sim.transfers
    step_transfers.end = sim.transfers[end[-1]:]       # the decode's end: the clocks read, once each
    worst = max(range(len(steps)), key=steps.__getitem__)
    step_transfers.worst = sim.transfers[marks[1 + worst]:marks[2 + worst]]   # what the busiest step did
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


def medusa_heads(model) -> dict:
    from test_medusa import heads_for

    return {"medusa": heads_for(model, 0, 0.0)}        # identity blocks: drafts accepted where the text repeats


def eagle_drafter(model) -> dict:
    from test_eagle import drafter_for

    return {"eagle": drafter_for(model, "repeat")}


def eagle3_drafter(model) -> dict:
    from test_eagle3 import eagle3_for

    return {"eagle": eagle3_for(model, "repeat")}


TREE = CONFIGS["tree_suffix"]
DRAFTED = LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, depth=6, sources={"medusa": 12})
EAGLE = LookaheadConfig(window=1, ngram=4, guess=0, pool_only=True, tree=True, depth=6, sources={"eagle": 16})
SAMPLED = SamplingConfig(temperature=1.0, seed=0)
# name: (config, drafters for the model, sampling, attention)
DECODERS = {
    "medusa": (DRAFTED, medusa_heads, None, "sdpa"),
    "eagle": (EAGLE, eagle_drafter, None, "sdpa"),
    "eagle3": (EAGLE, eagle3_drafter, None, "sdpa"),
    "eagle_mixed": (replace(EAGLE, guess=4, budget=24, sources={"eagle": 8, "suffix": 2, "recycle": 4}),
                    eagle_drafter, None, "sdpa"),
    "sampling_lookahead": (CONFIGS["lookahead_w4_n3_g4_pool"], None, SAMPLED, "sdpa"),
    "sampling_tree": (TREE, None, SAMPLED, "sdpa"),
    "sampling_eagle": (EAGLE, eagle_drafter, SAMPLED, "sdpa"),
    "flex_lookahead": (CONFIGS["lookahead_w4_n3_g4_pool"], None, None, "flex_attention"),
    "flex_tree": (TREE, None, None, "flex_attention"),
}


@pytest.fixture
def uncompiled():
    """flex_attention uncompiled (torch's own eager path), not transformers' compiled kernel: the count
    is of the transfers around the kernel, not of its code (torch's compiled CPU flex kernel is
    wrong on hosts without AVX-512)."""
    from torch.nn.attention import flex_attention as flex_module
    from transformers.integrations import flex_attention as integration

    flex_attention = flex_module.flex_attention

    def eager(query, key, value, training=False, **kwargs):
        return flex_attention(query, key, value, **kwargs)

    with mock.patch.object(integration, "compile_friendly_flex_attention", eager), \
            mock.patch.object(flex_module, "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG", True):
        yield


@pytest.mark.parametrize("name", list(DECODERS))
def test_every_decoder_makes_at_most_four_transfers_a_step(name, uncompiled):
    """Trained drafters (their forwards and reads included), sampling and flex_attention keep the
    greedy decoders' bound."""
    config, drafters, sampling, attention = DECODERS[name]
    model = tiny_random_model("llama", num_hidden_layers=4, attn_implementation=attention)
    drafters = drafters(model) if drafters is not None else None
    state = true_pool(model, config) if config.guess else None
    out = {}

    def run(lm):
        out["o"] = decode(lm, PROMPT, config, DecodeLimits(max_new_tokens=32), sampling, state=state)

    steps = step_transfers(model, run, drafters)
    assert max(steps) <= MAX_PER_STEP, f"{name}: per step {steps}; {step_transfers.worst}"
    assert max(out["o"].stats.accepted) > 1, "no step accepted a draft: the step's longest path was not exercised"
    end = step_transfers.end             # the decode's end: one wait per clock (the model's, a drafter's)
    assert len(end) <= 2 and all(t == "explicit Event.synchronize" for t in end), end
    assert out["o"].stats.model_seconds > 0


def test_the_count_has_teeth_a_per_row_read_and_a_synchronize_in_the_drafter_are_seen(monkeypatch):
    """EAGLE's tree growth as it was (each frontier row's children read on their own, the drafter's
    time taken after ``torch.cuda.synchronize``): the counter sees every read and the synchronize."""
    from lookahead_core.eagle import EagleSource

    grow, stop = EagleSource._grow_on_device, EagleSource._stop

    def per_row(self):
        tree = grow(self)
        for row in tree[1:].view(-1, 8):
            row.tolist()
        return tree

    def synchronized(self, span):
        torch.cuda.synchronize(self.drafter.device)
        stop(self, span)

    monkeypatch.setattr(EagleSource, "_grow_on_device", per_row)
    monkeypatch.setattr(EagleSource, "_stop", synchronized)
    model = tiny_random_model("llama", num_hidden_layers=4)
    steps = step_transfers(model, lambda lm: decode(lm, PROMPT, EAGLE, DecodeLimits(max_new_tokens=16)),
                           eagle_drafter(model))
    assert max(steps) > 5 * 8, steps                       # 5 levels of 8 rows and more
    assert step_transfers.worst.count("explicit torch.cuda.synchronize") == 2       # update's and launch's


def test_the_count_has_teeth_a_comparison_answered_to_the_host_is_seen():
    model = tiny_random_model("llama")
    sim = DeviceSim(model)
    with sim:
        logits = model(torch.tensor([[1, 2, 3]], device="cpu")).logits[0]
        torch.equal(logits[0], logits[1]), torch.allclose(logits[0], logits[1]), 5 in logits.argmax(-1)
        torch.cuda.current_stream().synchronize()
    assert [t for t in sim.transfers if "host answer" in t or "explicit" in t] == [
        "device->host (a host answer) _VariableFunctionsClass.equal",
        "device->host (a host answer) _VariableFunctionsClass.allclose",
        "device->host (a host answer) Tensor.__contains__", "explicit Stream.synchronize"], sim.transfers


BATCHED = {"lookahead": (CONFIGS["lookahead_w4_n3_g4_pool"], None, None), "eagle": (EAGLE, eagle_drafter, None),
           "sampling_tree": (TREE, None, SAMPLED)}


@pytest.mark.parametrize("name", list(BATCHED))
def test_a_batch_step_makes_at_most_four_transfers(name):
    config, drafters, sampling = BATCHED[name]
    model = tiny_random_model("mistral", num_hidden_layers=4, sliding_window=8)
    drafters = drafters(model) if drafters is not None else None
    prompts = [PROMPT, PROMPT[3:] + [9, 9], PROMPT[:9]]
    steps = step_transfers(model, lambda lm: decode_batch(lm, prompts, config, DecodeLimits(max_new_tokens=24),
                                                          sampling), drafters)
    assert max(steps) <= MAX_PER_STEP, (steps, step_transfers.worst)


def test_the_count_has_teeth_a_per_layer_index_copy_is_seen(monkeypatch):
    """The KV commit as it was before issue 45 (its indices moved to the device inside the layer
    loop) makes 3 transfers per layer on a step that accepts drafts: the counter must see them."""
    from lookahead_core import model_io

    def per_layer_commit(cache, past, keep_rows, valid=None, also=None, device=None):
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
        return {}

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

"""A model spread over two GPUs by a ``device_map`` (issue 58, item 6), on the CPU: every index the
core builds must be on the device of the tensor it indexes.

``TwoGPUs`` (a ``TorchFunctionMode``) puts tensors on fake GPUs: a tagged tensor reports
``cuda:0`` or ``cuda:1`` as its ``.device``, ``.to(device)`` and factories with ``device=`` tag
their result (the data stays on the CPU), an op's result is on its inputs' GPU, and an op whose
inputs are on two GPUs raises as CUDA does (a host tensor may meet either). ``spread`` places the
model as accelerate's ``device_map`` does, and as transformers records it (``hf_device_map``): the
embeddings and the first layers on cuda:0, the other layers, the final norm and the LM head on
cuda:1, each module's inputs moved to its GPU when it runs, the model's outputs moved back to the
GPU of its input (``io_same_device``). The LM head can be tied to the embeddings, as accelerate
places a tied head: on cuda:0 with them, while the hidden states it reads are on cuda:1.
"""

from __future__ import annotations

import functools
import pytest
import torch
from torch.overrides import TorchFunctionMode

from lookahead_core import CausalLM, DecodeLimits, LookaheadConfig, decode, decode_batch
from lookahead_core.model_io import Feed

from test_transfers import tensors_in
from tiny_families import tiny_family_model

PROMPT = [5, 17, 3, 99, 42, 7, 5, 17, 3, 99, 8, 61, 23, 5, 17]
GPUS = (torch.device("cuda", 0), torch.device("cuda", 1))


def _gpu(value) -> torch.device | None:
    """The fake GPU ``value`` names (None: the host, or not a device)."""
    if isinstance(value, (str, torch.device)) and str(value).startswith("cuda"):
        return torch.device(value)
    return None


class OnGPU(torch.Tensor):
    """A CPU tensor that says it is on the fake GPU ``gpu``."""

    __torch_function__ = torch._C._disabled_torch_function_impl      # TwoGPUs (a mode) sees every op first
    gpu: torch.device
    device = property(lambda self: self.gpu)
    is_cuda = property(lambda self: True)


class ParameterOnGPU(torch.nn.Parameter):
    """A parameter on a fake GPU (as :class:`OnGPU`)."""

    gpu: torch.device
    device = property(lambda self: self.gpu)
    is_cuda = property(lambda self: True)


def gpu_of(t: torch.Tensor) -> torch.device | None:
    return getattr(t, "gpu", None) if isinstance(t, (OnGPU, ParameterOnGPU)) else None


def on_gpu(t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """``t`` (the same data) tagged with ``device``; None: a host tensor."""
    if gpu_of(t) == device:
        return t
    if device is None:
        return t.as_subclass(torch.Tensor)
    out = t.as_subclass(OnGPU)
    out.gpu = device
    return out


def _placed(out, device):
    if isinstance(out, torch.Tensor):
        return on_gpu(out, device)
    if isinstance(out, (list, tuple)):
        items = [_placed(v, device) for v in out]
        return items if isinstance(out, list) else type(out)(items)
    return out


class TwoGPUs(TorchFunctionMode):
    """Ops on tensors of fake GPUs; an op mixing two GPUs fails (module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.mixed: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func in (torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.cpu):
            source = gpu_of(args[0])
            named = [a for a in args[1:] if isinstance(a, (str, torch.device, torch.Tensor))]
            named += [kwargs["device"]] if kwargs.get("device") is not None else []
            if func is torch.Tensor.cpu:
                target = None
            elif func is torch.Tensor.cuda:
                target = GPUS[0]
            elif named:
                target = gpu_of(named[0]) if isinstance(named[0], torch.Tensor) else _gpu(named[0])
            else:
                target = source                                   # .to(dtype): stays where it is
            real = [a for a in args[1:] if not isinstance(a, (str, torch.device, torch.Tensor))]
            kwargs.pop("device", None)
            out = args[0].to(*real, **kwargs) if func is torch.Tensor.to else args[0]
            if out is args[0] and target != source:
                out = out.clone()                                 # a copy to another device is a new tensor
            return on_gpu(out, target)
        target = _gpu(kwargs.get("device"))
        if target is not None:                                    # a factory on a GPU
            kwargs["device"] = "cpu"
        else:
            devices = list(dict.fromkeys(d for t in tensors_in([args, kwargs], []) if (d := gpu_of(t)) is not None))
            if len(devices) > 1:
                name = getattr(func, "__qualname__", str(func))
                self.mixed.append(name)
                raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                                   f"{devices[0]} and {devices[1]}! ({name})")
            target = devices[0] if devices else None
        out = func(*args, **kwargs)
        return out if target is None or func in (torch.Tensor.tolist, torch.Tensor.item) else _placed(out, target)


def _moved(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)) and not hasattr(value, "to_tuple"):
        return type(value)(_moved(v, device) for v in value)
    if isinstance(value, dict):
        for key in list(value):
            value[key] = _moved(value[key], device)
        return value
    return value


def _run_on(module: torch.nn.Module, device: torch.device, back: bool = False) -> None:
    """accelerate's AlignDevicesHook: the module's forward runs on ``device`` (its inputs moved there
    first); ``back``: its outputs are moved to its input's device (``io_same_device``)."""
    forward = module.forward

    @functools.wraps(forward)
    def on_device(*args, **kwargs):
        inputs = [t.device for t in tensors_in([args, kwargs], [])]
        out = forward(*_moved(list(args), device), **_moved(dict(kwargs), device))
        return _moved(out, inputs[0]) if back and inputs else out

    module.forward = on_device


def spread(model, first: int) -> dict[str, torch.device]:
    """Layers ``0 .. first - 1`` and the embeddings on cuda:0, the rest, the final norm and the LM
    head on cuda:1 (a head tied to the embeddings stays with them); hooks as accelerate's."""
    base = model.model
    placement = {"model.embed_tokens": GPUS[0], **{f"model.layers.{i}": GPUS[int(i >= first)]
                                                  for i in range(len(base.layers))},
                 "model.norm": GPUS[1], "model.rotary_emb": GPUS[1],
                 "lm_head": GPUS[0] if model.config.tie_word_embeddings else GPUS[1]}
    placed: dict[int, torch.nn.Parameter] = {}                # a tied weight is one parameter
    for name, device in placement.items():
        module = model.get_submodule(name)
        for owner in module.modules():
            for key, param in owner._parameters.items():
                if param is None:
                    continue
                if id(param) not in placed:
                    placed[id(param)] = torch.Tensor._make_subclass(ParameterOnGPU, param.detach(), False)
                    placed[id(param)].gpu = device
                owner._parameters[key] = placed[id(param)]
            for key, buffer in owner._buffers.items():
                if buffer is not None:
                    owner._buffers[key] = on_gpu(buffer, device)
        _run_on(module, device)
    _run_on(model, GPUS[0], back=True)
    model.hf_device_map = {name: device.index for name, device in placement.items()}
    return placement


@pytest.fixture
def no_cuda_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forward clock's CUDA events, which need a real GPU: a clock that reads nothing."""

    class Event:
        def __init__(self, **_):
            pass

        def record(self, *_):
            pass

        def synchronize(self):
            pass

        def elapsed_time(self, _):
            return 0.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *_: None)


@pytest.mark.parametrize("tied", [False, True], ids=["head-on-cuda1", "tied-head-on-cuda0"])
def test_decode_on_a_model_spread_over_two_gpus_equals_greedy(tied, no_cuda_timing):
    model = tiny_family_model("llama", num_hidden_layers=4, tie_word_embeddings=tied)
    greedy = decode(CausalLM(model), PROMPT, None, DecodeLimits(max_new_tokens=24)).tokens
    batch_greedy = [decode(CausalLM(model), p, None, DecodeLimits(max_new_tokens=16)).tokens
                    for p in (PROMPT, PROMPT[4:])]
    gpus = TwoGPUs()
    spread(model, first=2)
    config = LookaheadConfig(window=3, ngram=3, guess=3, prompt_pool=True, tree=True, sources={"suffix": 2},
                             budget=16)
    with gpus:
        lm = CausalLM(model)
        assert lm.device == GPUS[0] and lm.spread
        out = decode(lm, PROMPT, config, DecodeLimits(max_new_tokens=24))
        batch = decode_batch(lm, [PROMPT, PROMPT[4:]], config, DecodeLimits(max_new_tokens=16))
    assert out.tokens == greedy
    assert max(out.stats.accepted) > 1, "no step accepted a draft: the KV commit's moves were not exercised"
    assert [o.tokens for o in batch] == batch_greedy
    assert not gpus.mixed


def test_a_batch_forward_returns_each_feeds_rows_and_features_from_the_gpus(no_cuda_timing):
    """Two feeds of other lengths (the per-feed picks), with hidden states (their rows) of the
    last layer and an earlier one (EAGLE-3's): the same as on one device."""
    model = tiny_family_model("llama", num_hidden_layers=4)
    feeds = [Feed(PROMPT, torch.arange(len(PROMPT)), None, 0, torch.tensor([3, 14]), torch.tensor([0, 14])),
             Feed(PROMPT[:9], torch.arange(9), None, 0, torch.tensor([8]))]
    lm = CausalLM(model, drafters={"eagle3": type("Aux", (), {"aux_layers": (1,)})()})
    expected = lm.forward_batch(lm.new_cache(), feeds, hidden=True)
    gpus = TwoGPUs()
    spread(model, first=2)
    with gpus:
        lm = CausalLM(model, drafters={"eagle3": type("Aux", (), {"aux_layers": (1,)})()})
        got = lm.forward_batch(lm.new_cache(), feeds, hidden=True)
        assert all(lg.device == GPUS[0] for lg, _ in got)
    for (logits, states), (want_logits, want_states) in zip(got, expected):
        torch.testing.assert_close(on_gpu(logits, None), want_logits)
        torch.testing.assert_close(on_gpu(states, None), want_states)
    assert not gpus.mixed


def test_the_fake_gpus_fail_an_op_across_two_of_them():
    gpus = TwoGPUs()
    with gpus:
        a = torch.ones(3, device="cuda:0")
        b = torch.arange(3).to("cuda:1")
        assert a.device == GPUS[0] and b.device == GPUS[1] and (a + torch.ones(3)).device == GPUS[0]
        with pytest.raises(RuntimeError, match="two devices, cuda:1 and cuda:0"):
            torch.ones(3, 2, device="cuda:1")[:, a.long()]
        assert (b.to(a.device) + a).device == GPUS[0]

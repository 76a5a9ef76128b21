"""Linear layers for CPU decode steps of a few tokens: ``use_streaming_linear(model)``.

Lookahead pays when a step of k tokens costs about what a step of one does. On GPUs it does; on
CPUs with PyTorch's BLAS (MKL) it does not: from 4 activation rows on, sgemm leaves its
matrix-vector kernel for one that takes about twice as long on a layer's weights, although their
memory traffic, not the arithmetic, bounds such a product. ``stream_linear.cpp`` streams each
weight matrix once for up to 6 rows (twice for 7-12). On this project's 2-core Xeon a 6-token
forward of SmolLM2-135M or Qwen2.5-Coder-0.5B costs 1.7-2.2 one-token forwards with MKL and 1.1-1.3
with the kernel (``docs/cpu_kernels.md``).

``use_streaming_linear(model)`` replaces the model's ``nn.Linear`` modules (those it can serve:
float32 on the CPU, input features a multiple of 16) by :class:`StreamingLinear`, in place: the
same parameters (tied weights stay tied), the same state dict, an ``nn.Linear`` still; inputs of
more than ``MAX_ROWS`` rows, and any forward that needs gradients, go to ``torch.nn.functional.linear``
as before. Every decoder of a job runs on the same model, the baseline included.

Numerics: each output is the same float32 sum in the same order whatever the rows beside it, so
a token's logits do not depend on how many tokens the step feeds (MKL's do, at the last bits,
between its matrix-vector and matrix-matrix kernels); they differ from MKL's by float32 rounding.

The extension is compiled on first use (``torch.utils.cpp_extension``: a C++ compiler and ninja;
about 30 s, cached under ``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``) for CPUs with
AVX-512 (``torch.backends.cpu.get_cpu_capability()``). :func:`unavailable` says why it cannot
run on this machine; :func:`use_streaming_linear` raises :class:`KernelUnavailable` with that reason.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F

MAX_ROWS = 12                      # rows of x beyond which MKL's matrix-matrix kernel wins
_SOURCE = Path(__file__).with_name("stream_linear.cpp")
_extension = None
_failure: str | None = None
log = logging.getLogger(__name__)


class KernelUnavailable(RuntimeError):
    """The streaming kernel cannot run here (no AVX-512, no compiler, a failed build)."""


def unavailable() -> str | None:
    """Why the kernel cannot run on this machine, or None when it can (builds it the first time)."""
    global _extension, _failure
    if _extension is not None or _failure is not None:
        return _failure
    capability = torch.backends.cpu.get_cpu_capability()
    if capability != "AVX512":
        _failure = f"this CPU's vector capability is {capability}, the kernel needs AVX512"
    elif shutil.which("c++") is None and shutil.which("g++") is None:
        _failure = "no C++ compiler (c++ or g++) on PATH to build the kernel"
    else:
        try:
            from torch.utils.cpp_extension import load

            log.info("loading the streaming linear kernel (compiled on first use on this machine: about 30 s)")
            _extension = load(name="lookahead_stream_linear", sources=[str(_SOURCE)],
                              extra_cflags=["-O3", "-mavx512f", "-mfma", "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
        except (RuntimeError, OSError, ImportError) as error:   # no ninja, a compiler error, ...
            _failure = f"building {_SOURCE.name} failed: {str(error).strip().splitlines()[-1]}"
        else:
            _failure = _self_check()
            if _failure is not None:
                _extension = None
    return _failure


def _self_check() -> str | None:
    """The built kernel against ``F.linear`` on this CPU, at every row count it serves (as the
    attention backend is admitted: a kernel compiled here that computes wrong values is refused)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 48, generator=generator)
    bias = torch.randn(40, generator=generator)
    for rows in range(1, MAX_ROWS + 1):
        x = torch.randn(rows, 48, generator=generator)
        got, want = _extension.stream_linear(x, weight, bias), F.linear(x, weight, bias)
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            diff = float((got - want).abs().max())      # nan where the kernel gave NaN
            return (f"the kernel built on this CPU computes {rows}-row products {diff:.3g} away from "
                    f"torch.nn.functional.linear's")
    return None


def stream_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` through the kernel (x: (m, in) float32, contiguous; in % 16 == 0)."""
    reason = unavailable()
    if reason is not None:
        raise KernelUnavailable(reason)
    return _extension.stream_linear(x, weight, bias)


class StreamingLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose forward of at most ``MAX_ROWS`` rows runs the streaming kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features if self.in_features else 0
        if rows > MAX_ROWS or x.dtype != torch.float32 or x.device.type != "cpu" or (
                torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features).contiguous()
        return _extension.stream_linear(flat, self.weight, self.bias).reshape(*x.shape[:-1], self.out_features)

    @classmethod
    def serves(cls, module: torch.nn.Module) -> bool:
        """Whether ``module`` is a plain ``nn.Linear`` the kernel can take (float32, CPU,
        contiguous weight, input features a multiple of 16)."""
        w = module.weight if isinstance(module, torch.nn.Linear) else None
        return (type(module) is torch.nn.Linear and w.dtype == torch.float32 and w.device.type == "cpu"
                and w.is_contiguous() and module.in_features % 16 == 0
                and (module.bias is None or module.bias.is_contiguous()))



def use_streaming_linear(model: torch.nn.Module) -> int:
    """Replace, in place, every ``nn.Linear`` of ``model`` the kernel serves by a
    :class:`StreamingLinear` on the same parameters; returns how many. Raises
    :class:`KernelUnavailable` (with the reason) where the kernel cannot run."""
    reason = unavailable()
    if reason is not None:
        raise KernelUnavailable(reason)
    return _swap(model, StreamingLinear.serves, StreamingLinear)


def use_stock_linear(model: torch.nn.Module) -> int:
    """Put PyTorch's ``nn.Linear`` back, in place, wherever ``model`` runs a :class:`StreamingLinear`
    (the same parameters); returns how many."""
    return _swap(model, lambda child: isinstance(child, StreamingLinear), torch.nn.Linear)


def _swap(model: torch.nn.Module, which, cls: type[torch.nn.Linear]) -> int:
    """Replace every child module ``which`` selects by a ``cls`` holding its own parameters (no
    copy: tied weights stay tied); returns how many."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if which(child)]
    for parent, name, child in swaps:
        new = cls(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
        new.weight, new.bias = child.weight, child.bias
        new.train(child.training)
        setattr(parent, name, new)
    return len(swaps)


@contextmanager
def running(model: torch.nn.Module, kernel: str) -> Iterator[None]:
    """Within the block, ``model``'s linear layers run ``kernel`` (``stock`` or ``stream``); after
    it, what they ran before. Swapping modules costs no copy: both hold the same parameters. This
    is how one job measures both kernels on the same items (``model.linear=both``)."""
    if kernel not in ("stock", "stream"):
        raise ValueError(f"kernel must be stock or stream, got {kernel!r}")
    before = linear_kernel(model)
    if kernel != before:
        (use_streaming_linear if kernel == "stream" else use_stock_linear)(model)
    try:
        yield
    finally:
        if kernel != before:
            (use_streaming_linear if before == "stream" else use_stock_linear)(model)


def linear_kernel(model: torch.nn.Module) -> str:
    """``stream`` when any of ``model``'s linear layers runs the kernel, else ``stock``."""
    return "stream" if any(isinstance(m, StreamingLinear) for m in model.modules()) else "stock"

"""Linear layers for CPU decode steps of a few tokens: ``use_streaming_linear(model)``.

Lookahead pays when a step of k tokens costs about what a step of one does. On GPUs it does; on
CPUs with PyTorch's BLAS (MKL) it does not: from 4 activation rows on, sgemm leaves its
matrix-vector kernel for one that takes about twice as long on a layer's weights, although their
memory traffic, not the arithmetic, bounds such a product (on AVX2-only CPUs a second row already
costs most of a forward). ``stream_linear.cpp`` streams each weight matrix from memory once for a
few rows: one build per instruction set, AVX-512 (up to 6 rows a pass, 12 rows in all) and AVX2 +
FMA (every row it serves in one pass), ``docs/cpu_kernels.md``.

``use_streaming_linear(model)`` replaces the model's ``nn.Linear`` modules (those it can serve:
float32 on the CPU, input features a multiple of 16) by :class:`StreamingLinear`, in place: the
same parameters (tied weights stay tied), the same state dict, an ``nn.Linear`` still; inputs of
more rows than the ISA's ``MAX_ROWS``, and any forward that needs gradients, go to
``torch.nn.functional.linear`` as before. Every decoder of a job runs on the same model, the
baseline included.

Numerics: each output is the same float32 sum in the same order whatever the rows beside it, so
a token's logits do not depend on how many tokens the step feeds (MKL's do, at the last bits,
between its matrix-vector and matrix-matrix kernels); they differ from MKL's, and the two ISAs'
from each other, by float32 rounding.

The ISA is the one PyTorch dispatches to on this CPU (``torch.backends.cpu.get_cpu_capability()``,
which ``ATEN_CPU_CAPABILITY=avx2`` lowers on an AVX-512 host); functions take ``isa=`` to name
another the CPU runs (:func:`host_isas`: the tests check each). Each ISA's extension is compiled on
first use (``torch.utils.cpp_extension``: a C++ compiler and ninja; about 30 s, cached under
``$TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``). :func:`unavailable` says why it cannot
run on this machine; :func:`use_streaming_linear` raises :class:`KernelUnavailable` with that reason.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F

# Per ISA: the compiler flags, and the rows of x beyond which PyTorch's GEMM wins (measured on one
# host of each kind, docs/cpu_kernels.md). Listed best first.
FLAGS = {"avx512": ["-mavx512f", "-mfma"], "avx2": ["-mavx2", "-mfma"]}
MAX_ROWS = {"avx512": 12, "avx2": 32}
_CAPABILITY = {"AVX512": "avx512", "AVX2": "avx2"}       # torch's names for its vector capabilities
_SOURCE = Path(__file__).with_name("stream_linear.cpp")
_extensions: dict[str, ModuleType] = {}
_failures: dict[str, str] = {}
log = logging.getLogger(__name__)


class KernelUnavailable(RuntimeError):
    """The streaming kernel cannot run here (no AVX2, no compiler, a failed build)."""


def host_isas() -> tuple[str, ...]:
    """The instruction sets this CPU runs, of those the kernel is built for, best first (whatever
    ``ATEN_CPU_CAPABILITY`` says: AVX2 code runs on an AVX-512 CPU)."""
    runs = {"avx512": torch.cpu._is_avx512_supported(), "avx2": torch.cpu._is_avx2_supported()}
    return tuple(isa for isa in FLAGS if runs[isa])


def selected_isa() -> str | None:
    """The ISA the kernel runs by default: the one PyTorch dispatches to here, or None."""
    return _CAPABILITY.get(torch.backends.cpu.get_cpu_capability())


def unavailable(isa: str | None = None) -> str | None:
    """Why the kernel (for ``isa``, by default :func:`selected_isa`) cannot run on this machine, or
    None when it can (builds it the first time)."""
    if isa is None:
        isa = selected_isa()
        if isa is None:
            return (f"this CPU's vector capability is {torch.backends.cpu.get_cpu_capability()}, "
                    f"the kernel needs AVX512 or AVX2")
    if isa not in FLAGS:
        raise ValueError(f"isa must be one of {', '.join(FLAGS)}, got {isa!r}")
    if isa in _extensions or isa in _failures:
        return _failures.get(isa)
    if isa not in host_isas():
        _failures[isa] = f"this CPU does not run {isa.upper()} instructions"
    elif shutil.which("c++") is None and shutil.which("g++") is None:
        _failures[isa] = "no C++ compiler (c++ or g++) on PATH to build the kernel"
    else:
        try:
            from torch.utils.cpp_extension import load

            log.info("loading the %s streaming linear kernel (compiled on first use on this machine: about 30 s)", isa)
            extension = load(name=f"lookahead_stream_linear_{isa}", sources=[str(_SOURCE)],
                             extra_cflags=["-O3", *FLAGS[isa], "-fopenmp"], extra_ldflags=["-fopenmp"], verbose=False)
        except (RuntimeError, OSError, ImportError) as error:   # no ninja, a compiler error, ...
            _failures[isa] = f"building {_SOURCE.name} for {isa} failed: {str(error).strip().splitlines()[-1]}"
        else:
            failure = _self_check(extension, MAX_ROWS[isa])
            if failure is None:
                _extensions[isa] = extension
            else:
                _failures[isa] = f"{failure} ({isa})"
    return _failures.get(isa)


def _self_check(extension, max_rows: int) -> str | None:
    """The built kernel against ``F.linear`` on this CPU, at every row count it serves (as the
    attention backend is admitted: a kernel compiled here that computes wrong values is refused)."""
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 48, generator=generator)
    bias = torch.randn(40, generator=generator)
    for rows in range(1, max_rows + 1):
        x = torch.randn(rows, 48, generator=generator)
        got, want = extension.stream_linear(x, weight, bias), F.linear(x, weight, bias)
        if not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            diff = float((got - want).abs().max())      # nan where the kernel gave NaN
            return (f"the kernel built on this CPU computes {rows}-row products {diff:.3g} away from "
                    f"torch.nn.functional.linear's")
    return None


def _extension(isa: str | None) -> tuple[str, ModuleType]:
    """(isa, its built extension), or :class:`KernelUnavailable` with the reason."""
    reason = unavailable(isa)
    if reason is not None:
        raise KernelUnavailable(reason)
    isa = isa or selected_isa()
    return isa, _extensions[isa]


def stream_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  isa: str | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` through the kernel of ``isa`` (x: (m, in) float32, contiguous; in % 16 == 0)."""
    return _extension(isa)[1].stream_linear(x, weight, bias)


class StreamingLinear(torch.nn.Linear):
    """An ``nn.Linear`` whose forward of at most ``MAX_ROWS[isa]`` rows runs the streaming kernel
    of ``isa`` (set by :func:`use_streaming_linear`)."""

    isa: str

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features if self.in_features else 0
        if rows > MAX_ROWS[self.isa] or x.dtype != torch.float32 or x.device.type != "cpu" or (
                torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)):
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(rows, self.in_features).contiguous()
        return _extensions[self.isa].stream_linear(flat, self.weight, self.bias).reshape(*x.shape[:-1], self.out_features)

    @classmethod
    def serves(cls, module: torch.nn.Module) -> bool:
        """Whether ``module`` is a plain ``nn.Linear`` the kernel can take (float32, CPU,
        contiguous weight, input features a multiple of 16)."""
        w = module.weight if isinstance(module, torch.nn.Linear) else None
        return (type(module) is torch.nn.Linear and w.dtype == torch.float32 and w.device.type == "cpu"
                and w.is_contiguous() and module.in_features % 16 == 0
                and (module.bias is None or module.bias.is_contiguous()))


def use_streaming_linear(model: torch.nn.Module, isa: str | None = None) -> int:
    """Replace, in place, every ``nn.Linear`` of ``model`` the kernel serves by a
    :class:`StreamingLinear` of ``isa`` (by default :func:`selected_isa`) on the same parameters;
    returns how many. Raises :class:`KernelUnavailable` (with the reason) where it cannot run."""
    isa = _extension(isa)[0]
    swapped = _swap(model, StreamingLinear.serves, StreamingLinear)
    for module in swapped:
        module.isa = isa
    return len(swapped)


def use_stock_linear(model: torch.nn.Module) -> int:
    """Put PyTorch's ``nn.Linear`` back, in place, wherever ``model`` runs a :class:`StreamingLinear`
    (the same parameters); returns how many."""
    return len(_swap(model, lambda child: isinstance(child, StreamingLinear), torch.nn.Linear))


def _swap(model: torch.nn.Module, which, cls: type[torch.nn.Linear]) -> list[torch.nn.Linear]:
    """Replace every child module ``which`` selects by a ``cls`` holding its own parameters (no
    copy: tied weights stay tied); returns the new modules."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if which(child)]
    for parent, name, child in swaps:
        new = cls(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
        new.weight, new.bias = child.weight, child.bias
        new.train(child.training)
        setattr(parent, name, new)
    return [getattr(parent, name) for parent, name, _ in swaps]


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

"""Forward latency against tokens per forward with PyTorch's linear layers and with the streaming
kernel of every instruction set this CPU runs, interleaved in one process, on this machine:

    python scripts/kernel_curves.py --models smollm2_135m qwen25_coder_05b --out results/kernels/curves_<host>

Each model loads once; every round times a forward of k tokens (a causal chain, every logit row
kept, after a ``--kv``-token cache, cut back after each forward) for each linear kernel (``stock``,
then ``stream-<isa>`` for each ISA of ``lookahead_core.kernels.host_isas()`` that builds) and each
k, kernels and sizes in an order rotated per round, after one untimed round. Swapping the layers
costs no copy (``kernels.use_streaming_linear(model, isa)``). On a shared host a round's ratio
t(k) / t(1) is taken within the round, and the table shows each ratio's median over rounds.

``--parts`` rounds (after the timed ones, with module hooks that cost a little time themselves)
split a forward into the linear layers of the blocks, the LM head, attention (the attention
modules less their linear layers) and the rest (embedding, norms, MLP activations, the decode
loop's host work), in ms, so a curve that falls short can be traced to the part that holds it.

``--dtypes float32 bfloat16`` times the other dtype too (PyTorch's layers only: the kernel is
float32), each against its own dtype's one-token forward (results/scaling/README.md quotes it).

Writes ``curves.csv`` (one row per model, kernel, k and round: ms; and ``parts.csv`` with
``--parts``) and prints the tables results/kernels and docs/cpu_kernels.md show.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))       # the harness runs from the clone
from experiments.models.loader import load_model  # noqa: E402
from experiments.reporting.tables import markdown  # noqa: E402
from lookahead_core import kernels  # noqa: E402
from lookahead_core.capability import device_name  # noqa: E402
from lookahead_core.layout import causal_layout  # noqa: E402
from lookahead_core.model_io import CausalLM, Feed, truncate_kv  # noqa: E402

SIZES = (1, 2, 4, 6, 8, 12, 16, 32, 64)
PARTS = ("linears", "lm_head", "attention", "rest")


def kernel_names() -> list[str]:
    """``stock`` and ``stream-<isa>`` for each ISA this CPU runs whose kernel builds."""
    return ["stock"] + [f"stream-{isa}" for isa in kernels.host_isas() if kernels.unavailable(isa) is None]


def switch(model: torch.nn.Module, name: str) -> None:
    kernels.use_stock_linear(model)
    if name != "stock":
        kernels.use_streaming_linear(model, isa=name.split("-", 1)[1])


class Parts:
    """Module hooks that add each forward's time to its part (``PARTS``); ``rest`` is what is left."""

    def __init__(self, model: torch.nn.Module):
        self.ms: dict[str, float] = defaultdict(float)
        self.handles = []
        head = model.get_output_embeddings()
        for name, module in model.named_modules():
            if module is head:
                self._time(module, "lm_head")
            elif isinstance(module, torch.nn.Linear):
                self._time(module, "linears")
            elif name.endswith("self_attn"):
                self._time(module, "attention")

    def _time(self, module: torch.nn.Module, part: str) -> None:
        starts: list[float] = []
        self.handles.append(module.register_forward_pre_hook(lambda *_: starts.append(time.perf_counter())))

        def done(*_):
            self.ms[part] += 1000 * (time.perf_counter() - starts.pop())
        self.handles.append(module.register_forward_hook(done))

    def split(self, total_ms: float) -> dict[str, float]:
        """The parts of a forward of ``total_ms``: attention less its linear layers (timed inside it)."""
        parts = dict(self.ms)
        parts["attention"] = parts.get("attention", 0.0) - parts.pop("attention_linear", 0.0)
        parts["rest"] = total_ms - sum(parts.get(p, 0.0) for p in PARTS if p != "rest")
        self.ms.clear()
        return parts

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()


def _mark_attention_linears(model: torch.nn.Module, parts: Parts) -> None:
    """Linear layers inside attention modules also count towards ``attention_linear`` (subtracted)."""
    for name, module in model.named_modules():
        if name.endswith("self_attn"):
            for child in module.modules():
                if isinstance(child, torch.nn.Linear):
                    parts._time(child, "attention_linear")


def curves(model_name: str, dtype: str, sizes: tuple[int, ...], rounds: int, kv: int,
           parts_rounds: int) -> tuple[list, list]:
    model, _ = load_model(model_name, dtype=dtype)
    lm = CausalLM(model)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = lm.new_cache()
    prefix = torch.randint(0, vocab, (kv,), generator=gen).tolist()
    offsets, _ = causal_layout(kv)
    lm.forward_batch(cache, [Feed(prefix, offsets, None, 0, torch.tensor([kv - 1]))])
    names = kernel_names() if dtype == "float32" else ["stock"]     # the kernel is float32
    rows, part_rows = [], []

    def forward(k: int) -> float:
        tokens = torch.randint(0, vocab, (k,), generator=gen).tolist()
        start = time.perf_counter()
        lm.forward_batch(cache, [Feed(tokens, causal_layout(k)[0], None, kv, torch.arange(k))])
        elapsed = time.perf_counter() - start
        truncate_kv(cache, kv)
        return 1000 * elapsed

    with torch.no_grad():
        for index in range(rounds + 1):                 # round 0: untimed warm-up (builds, caches)
            for name in names[index % len(names):] + names[:index % len(names)]:
                switch(model, name)
                shift = index % len(sizes)
                for k in sizes[shift:] + sizes[:shift]:
                    ms = forward(k)
                    if index:
                        rows.append({"model": model_name, "dtype": dtype, "linear": name, "k": k, "round": index, "ms": ms})
        for index in range(parts_rounds):
            for name in names:
                switch(model, name)
                parts = Parts(model)
                _mark_attention_linears(model, parts)
                for k in sizes:
                    total = forward(k)
                    part_rows.append({"model": model_name, "dtype": dtype, "linear": name, "k": k, "round": index + 1,
                                      "ms": total, **parts.split(total)})
                parts.remove()
    return rows, part_rows


def ratio_table(table: pd.DataFrame) -> pd.DataFrame:
    """Per model, dtype and kernel: median t(1) in ms, t(1) / stock t(1), then the median over rounds
    of t(k) / t(1) (the same kernel's one-token forward in the same round) for each k."""
    one = table[table.k == 1].set_index(["model", "dtype", "linear", "round"]).ms
    stock = table[(table.k == 1) & (table.linear == "stock")].set_index(["model", "dtype", "round"]).ms
    table = table.assign(
        ratio=table.ms / one.loc[list(zip(table.model, table.dtype, table.linear, table["round"]))].values,
        vs_stock=table.ms / stock.loc[list(zip(table.model, table.dtype, table["round"]))].values)
    index = ["model", "dtype", "linear"]
    wide = table[table.k > 1].pivot_table(index=index, columns="k", values="ratio", aggfunc="median")
    ones = table[table.k == 1].groupby(index)
    wide.insert(0, "t(1) / stock t(1)", ones.vs_stock.median())
    wide.insert(0, "t(1) ms", ones.ms.median())
    return wide.round(2).reset_index()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2_135m", "qwen25_coder_05b"])
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--kv", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtypes", nargs="+", default=["float32"], help="others time PyTorch's layers only")
    parser.add_argument("--parts", type=int, default=0, help="rounds of the per-part split (0: none)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = tuple(sorted(set(args.sizes) | {1}))
    rows, part_rows = [], []
    for name in args.models:
        for dtype in args.dtypes:
            timed, parts = curves(name, dtype, sizes, args.rounds, args.kv, args.parts)
            rows += timed
            part_rows += parts
    host = dict(host=device_name("cpu"), isas="+".join(kernels.host_isas()), threads=args.threads,
                kv=args.kv, torch=torch.__version__)
    args.out.mkdir(parents=True, exist_ok=True)
    table = pd.DataFrame(rows)
    table.assign(**host).to_csv(args.out / "curves.csv", index=False, float_format="%.4g")
    print(markdown(ratio_table(table)))
    if part_rows:
        split = pd.DataFrame(part_rows)
        split.assign(**host).to_csv(args.out / "parts.csv", index=False, float_format="%.4g")
        medians = split.groupby(["model", "dtype", "linear", "k"])[["ms", *PARTS]].median().round(1).reset_index()
        print("\nms per forward, by part (medians over rounds):\n")
        print(markdown(medians))


if __name__ == "__main__":
    main()

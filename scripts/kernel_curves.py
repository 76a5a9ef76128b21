"""Forward latency against tokens per forward with PyTorch's linear layers and with the streaming
kernel (``model.linear=stock`` / ``stream``), on this machine:

    python scripts/kernel_curves.py --models smollm2_135m qwen25_coder_05b --threads 1 2 --out results/kernels

Each (model, threads) loads the model twice (stock, then stream) and times ``measure_latency``'s
causal-chain forwards of k = 1..32 tokens after a 512-token cache, every logit row kept, fastest of
``--repeats`` rounds after a warm-up (``lookahead_core.cost.measure_latency``). Writes
``curves.csv`` (one row per model, threads, kernel and k: ms, and the ratio to the stock one-token
forward of the same model and threads) and prints the table ``docs/cpu_kernels.md`` shows.

``--dtypes float32 bfloat16 --sizes 1 64 769`` times the other dtype too (PyTorch's layers only: the
kernel is float32), each against its own dtype's one-token forward; results/scaling/README.md quotes
it for Qwen2.5-Coder-0.5B (``--models qwen25_coder_05b --threads 1 --out results/kernels/dtypes``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))       # the harness runs from the clone
from experiments.models.loader import load_model  # noqa: E402
from lookahead_core.capability import device_name  # noqa: E402
from experiments.reporting.tables import markdown  # noqa: E402
from lookahead_core.cost.curve import measure_latency  # noqa: E402

SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 32)


def curves(model_name: str, threads: int, repeats: int, dtype: str = "float32",
           sizes: tuple[int, ...] = SIZES) -> list[dict]:
    torch.set_num_threads(threads)
    rows = []
    for linear in ("stock", "stream") if dtype == "float32" else ("stock",):
        model, _ = load_model(model_name, dtype=dtype, linear=linear)
        curve = measure_latency(model, sizes, kv_length=512, repeats=repeats, one_logit=False)
        rows += [{"model": model_name, "dtype": dtype, "threads": threads, "linear": linear, "k": k, "ms": 1000 * t}
                 for k, t in zip(curve.tokens, curve.seconds)]
    one = next(r["ms"] for r in rows if r["linear"] == "stock" and r["k"] == 1)
    for r in rows:
        r["x_stock_t1"] = r["ms"] / one
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2_135m", "qwen25_coder_05b"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", nargs="+", default=["float32"])
    parser.add_argument("--sizes", nargs="+", type=int, default=list(SIZES))
    parser.add_argument("--out", type=Path, default=Path("results/kernels"))
    args = parser.parse_args(argv)
    rows = [r for m in args.models for t in args.threads for d in args.dtypes
            for r in curves(m, t, args.repeats, d, tuple(args.sizes))]
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.assign(host=device_name("cpu"), torch=torch.__version__).to_csv(
        args.out / "curves.csv", index=False, float_format="%.4g")
    index = ["model", "dtype", "threads", "linear"]
    wide = table.pivot_table(index=index, columns="k", values="x_stock_t1").round(2)
    wide.insert(0, "t(1) ms", table[table.k == 1].set_index(index)["ms"].round(1))
    print(markdown(wide.reset_index()))


if __name__ == "__main__":
    main()

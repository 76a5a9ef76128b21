"""Project lookahead speedups for Llama-2-7B/13B-shaped models on a GPU, without any weights.

    python scripts/gpu_bench.py --out results/benchmark/gpu \\
        --acceptance results/benchmark/smollm2_mtbench/rows.csv results/benchmark/smollm2_humaneval/rows.csv
    python scripts/gpu_bench.py --tiny --out /tmp/gpu_bench_tiny     # CPU smoke test (tests run this)
    python scripts/gpu_bench.py --out results/batch/gpu --shapes 7b --batch-rows results/batch/rows.csv

Speedup = S x t_step(greedy) / t_step(W, N, G). S is a property of the model and the text and cannot
be measured with random weights, so it is read from ``--acceptance``: the rows of
``experiments.presets.benchmark`` run with a real model on the CPU (lossless decoding gives the same S on
any device, for that model). The step times are measured here, on random fp16 weights of the real
shapes, initialised on the device (no download):

1. forward latency against tokens per forward (1..256) after a 512-token KV cache, timed with CUDA
   events around the model's forward alone (inputs and mask prepared beforehand);
2. the same through ``CausalLM.forward`` (the core's path: mask built on the host and copied),
   wall clock with ``torch.cuda.synchronize``;
3. the decode loop of each config for a few dozen steps, with the n-gram pool pre-filled so every
   step carries G candidates (random weights accept nothing, so each step commits one token):
   ms per step, and the share spent outside the forward.

With ``--batch-rows`` (``experiments.presets.batch`` rows), also t(B, k) for each ``--batch-sizes`` and
the speedup over batched greedy per (dataset, decoder, B), from each batch's per-sequence step
records (``cost_model.predict_batch``).

With ``--flex-shapes`` (default: the first shape), the same weights are loaded again under
``attn_implementation="flex_attention"`` (the core's block masks instead of a dense mask): after an
untimed warm-up that compiles the kernels (``compile_s``), the core-path curve (2.) and the loop (3.)
again, beside SDPA's.

Projections printed and written per config: ``S * t(1)/t(k)`` with k the mean tokens per step of
the real-model run (forward only, events), and the same with the loop's measured host time per step
added to both sides. Results are written to ``--out`` as they are measured; runtime on an H200 is
about 2-4 minutes for both shapes.
"""

from __future__ import annotations

import argparse
import csv
import inspect
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lookahead_core import DecodeLimits, DecodeState, LookaheadConfig, NGramPool, decode  # noqa: E402
from lookahead_core import cost as cm  # noqa: E402
from lookahead_core.config import config_label  # noqa: E402
from lookahead_core.layout import causal_layout  # noqa: E402
from lookahead_core.model_io import CausalLM, truncate_kv  # noqa: E402

SHAPES: dict[str, dict] = {
    # Llama-2 dims (Touvron et al. 2023, the HF configs); MHA, no GQA at these sizes.
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000),
    "13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=40, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=128),
}
GPU_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128, 160, 192, 256)
TINY_SIZES = (1, 2, 4, 8, 16, 32, 64)
DEFAULT_CONFIGS = ((5, 15, 15), (5, 7, 7), (4, 5, 5), (3, 4, 4))   # (N, W, G)


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def build_model(shape: str, device: torch.device, dtype: torch.dtype, attention: str = "sdpa") -> torch.nn.Module:
    """Random weights of the real shape, allocated and initialised on ``device`` (the same weights for
    every ``attention`` implementation)."""
    config = LlamaConfig(**SHAPES[shape], max_position_embeddings=4096, rms_norm_eps=1e-5,
                         pad_token_id=0, bos_token_id=1, eos_token_id=None, tie_word_embeddings=False)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attention)
    return model.eval()


# ---------------------------------------------------------------------------------------------
# 1. Forward latency, model only, CUDA events


class Timer:
    """CUDA events on a GPU (device time of the enqueued work), perf_counter on the CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __enter__(self) -> Timer:
        if self.cuda:
            self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            self.start.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.end.record()
            torch.cuda.synchronize()
            self.seconds = self.start.elapsed_time(self.end) / 1e3
        else:
            self.seconds = time.perf_counter() - self.t0


@torch.inference_mode()
def forward_latency(model, sizes: Sequence[int], kv_length: int, repeats: int) -> list[dict]:
    """Median seconds of ``model(...)`` of k tokens after ``kv_length`` cached ones (every logit kept)."""
    device, dtype = model.device, model.dtype
    lm = CausalLM(model)
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    cache = lm.new_cache()
    prefix = torch.randint(0, vocab, (kv_length,), generator=gen).tolist()
    offsets, visible = causal_layout(kv_length)
    lm.forward(cache, prefix, offsets, visible, 0, torch.tensor([kv_length - 1]))
    inputs = {}
    for k in sizes:
        mask = torch.zeros(1, 1, k, kv_length + k, dtype=dtype, device=device)
        mask[0, 0, :, kv_length:].masked_fill_(~torch.ones(k, k, dtype=torch.bool, device=device).tril(),
                                               torch.finfo(dtype).min)
        inputs[k] = dict(input_ids=torch.randint(0, vocab, (1, k), generator=gen).to(device),
                         position_ids=torch.arange(kv_length, kv_length + k, device=device)[None],
                         attention_mask=mask)
    cache_kw = {("cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"): cache}
    times: dict[int, list[float]] = {k: [] for k in sizes}
    for round_index in range(repeats + 1):
        for k in sizes:
            with Timer(device) as timer:
                model(**inputs[k], use_cache=True, **cache_kw)
            truncate_kv(cache, kv_length)
            if round_index:
                times[k].append(timer.seconds)
    return [{"tokens": k, "seconds": statistics.median(times[k]), "ratio": statistics.median(times[k]) / statistics.median(times[sizes[0]])}
            for k in sizes]


# ---------------------------------------------------------------------------------------------
# 3. The decode loop, step time only


def prefilled_pool(ngram: int, guess: int, vocab: int, seed: int = 0) -> NGramPool:
    """A pool where every token has ``guess`` random continuations: every step verifies G candidates."""
    pool = NGramPool(ngram, guess)
    gen = torch.Generator().manual_seed(seed)
    grams = torch.randint(0, vocab, (vocab, guess, ngram - 1), generator=gen).tolist()
    for key, continuations in enumerate(grams):
        for continuation in continuations:
            pool.add((key, *continuation))
    return pool


def time_loop(model, config: LookaheadConfig | None, prompt: list[int], steps: int) -> dict:
    """Ms per step of ``config``'s decode loop; a config with Medusa heads gets random ones of the
    shape (their forward is part of the step's host time)."""
    vocab = model.config.vocab_size
    if config is not None and "medusa" in dict(config.sources):
        from lookahead_core.medusa import for_model

        model = CausalLM(model, drafters={"medusa": for_model(model, max(config.draft_depth, 1))})
    state = None
    if config is not None and config.guess:
        state = DecodeState.with_pool(prefilled_pool(config.ngram, config.guess, vocab))
    limits = DecodeLimits(max_new_tokens=steps + 1)
    decode(model, prompt, config, DecodeLimits(max_new_tokens=4), state=state)       # warm-up
    if state is not None:
        state = DecodeState.with_pool(prefilled_pool(config.ngram, config.guess, vocab))
    stats = decode(model, prompt, config, limits, state=state).stats
    return {
        "decoder": config_label(config), "steps": stats.steps,
        "tokens_per_step": statistics.fmean(stats.step_tokens) if stats.step_tokens else 1.0,
        "ms_per_step": 1e3 * stats.decode_seconds / stats.steps,
        "model_ms_per_step": 1e3 * stats.model_seconds / stats.steps,
        "host_ms_per_step": 1e3 * (stats.decode_seconds - stats.model_seconds) / stats.steps,
        "overhead_frac": stats.overhead_fraction,
    }


# ---------------------------------------------------------------------------------------------
# Acceptance from the CPU benchmark, and the projection


def read_acceptance(paths: Sequence[str]) -> list[dict]:
    """Per (dataset, decoder) of the core's lookahead rows: S and mean tokens per step."""
    groups: dict[tuple[str, str], dict] = {}
    for path in paths:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if row["family"] != "core" or not row["N"]:
                    continue
                key = (f"{row['model']}/{row['dataset']}", row["decoder"])
                g = groups.setdefault(key, {"source": key[0], "decoder": row["decoder"], "tokens": 0, "steps": 0,
                                            "step_tokens": [], "row": row})
                g["tokens"] += int(row["new_tokens"]) - 1
                g["steps"] += int(row["steps"])
                g["step_tokens"].append(float(row["step_tokens_mean"]))
    out = []
    for g in groups.values():
        row = g["row"]
        pool_only = row["pool_only"] == "True"
        fields = row.get("params") or row.get("lookahead")   # every field, token trees included (harness / issue-11 rows)
        if fields and fields != "null":
            config = LookaheadConfig(**json.loads(fields))
        else:
            config = LookaheadConfig(window=1 if pool_only else int(row["W"]), ngram=int(row["N"]),
                                     guess=int(row["G"]), prompt_pool=row["prompt_pool"] == "True", pool_only=pool_only)
        out.append({"source": g["source"], "decoder": g["decoder"], "config": config,
                    "S": g["tokens"] / g["steps"] if g["steps"] else 1.0,
                    "tokens_per_step": statistics.fmean(g["step_tokens"])})
    return out


def project(acceptance: list[dict], events: cm.CostModel, wall: cm.CostModel, loops: dict[str, dict]) -> list[dict]:
    greedy = loops.get("greedy")
    rows = []
    for a in acceptance:
        config, k = a["config"], a["tokens_per_step"]
        rows_kept = cm.logit_rows_for(config, round(k))
        host = loops.get(config_label(config), {}).get("host_ms_per_step", greedy["host_ms_per_step"] if greedy else 0.0) / 1e3
        host0 = greedy["host_ms_per_step"] / 1e3 if greedy else 0.0
        rows.append({
            "source": a["source"], "decoder": a["decoder"], "S": a["S"], "tokens_per_step": k,
            "t1_ms": 1e3 * events.latency(1), "tk_ms": 1e3 * events.latency(k),
            "projected_forward_only": a["S"] * events.latency(1) / events.latency(k),
            "projected_with_loop": a["S"] * (wall.latency(1, 1) + host0) / (wall.latency(k, rows_kept) + host),
        })
    return rows


def read_batch_records(paths: Sequence[str]) -> dict[tuple[str, str, int, int], dict]:
    """Per (dataset, decoder, B, batch) of ``experiments.presets.batch`` rows: the config and each
    sequence's per-step record (tokens fed, tokens committed), as measured with a real model."""
    batches: dict[tuple[str, str, int, int], dict] = {}
    for path in paths:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                if not row["step_tokens"]:
                    continue                              # transformers' generate keeps no record
                key = (row["dataset"], row["decoder"], int(row["B"]), int(row["batch"]))
                config = LookaheadConfig(**json.loads(row["lookahead"])) if row["lookahead"] else None
                b = batches.setdefault(key, {"config": config, "step_tokens": [], "accepted": []})
                b["step_tokens"].append(json.loads(row["step_tokens"]))
                b["accepted"].append(json.loads(row["accepted"]))
    return batches


def project_batches(batches: dict[tuple[str, str, int, int], dict], costs: dict[int, cm.CostModel]) -> list[dict]:
    """Projected speedup over batched greedy per (dataset, decoder, B): the median over the batches of
    ``cost_model.predict_batch`` with this device's t(B, k)."""
    groups: dict[tuple[str, str, int], list[float]] = {}
    for (dataset, decoder, B, _), b in batches.items():
        if b["config"] is None:
            continue
        groups.setdefault((dataset, decoder, B), []).append(
            cm.predict_batch(costs, b["config"], b["step_tokens"], b["accepted"]))
    return [{"dataset": d, "decoder": n, "B": B, "projected": statistics.median(v), "batches": len(v)}
            for (d, n, B), v in sorted(groups.items())]


def flex_section(shape: str, device: torch.device, dtype: torch.dtype, sizes: Sequence[int], kv_length: int,
                 repeats: int, loop_configs: list, prompt: list[int], loop_steps: int, sdpa_wall: cm.CostModel,
                 sdpa_loops: dict[str, dict], out: Path) -> str:
    """The core-path curve and the decode loop again under flex_attention, after its compile."""
    started = time.perf_counter()
    torch.manual_seed(0)
    torch._dynamo.reset()              # this shape's kernels compile within torch's recompile limit
    model = build_model(shape, device, dtype, "flex_attention")
    say(f"{shape}: flex_attention: compiling (a decode of every loop config, untimed)")
    compile_started = time.perf_counter()
    for config in loop_configs:
        time_loop(model, config, prompt, 4)
    cm.measure_latency(model, sizes, kv_length=kv_length, repeats=1)
    compile_s = time.perf_counter() - compile_started
    wall = cm.measure_latency(model, sizes, kv_length=kv_length, repeats=max(2, repeats // 2))
    write_csv(out / f"latency_core_{shape}_flex.csv", wall.to_rows())
    loops = {}
    for config in loop_configs:
        loops[config_label(config)] = time_loop(model, config, prompt, loop_steps)
    write_csv(out / f"loop_{shape}_flex.csv", list(loops.values()))
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    say(f"{shape}: flex_attention done in {time.perf_counter() - started:.0f} s (compile {compile_s:.0f} s)")
    curve = [{"k": k, "sdpa ms": 1e3 * sdpa_wall.latency(k), "flex ms": 1e3 * wall.latency(k),
              "flex/sdpa": wall.latency(k) / sdpa_wall.latency(k)} for k in wall.tokens]
    loop_rows = [{"decoder": name, "tokens_per_step": row["tokens_per_step"], "sdpa ms/step": sdpa_loops[name]["ms_per_step"],
                  "flex ms/step": row["ms_per_step"], "flex/sdpa": row["ms_per_step"] / sdpa_loops[name]["ms_per_step"]}
                 for name, row in loops.items()]
    return (f"\n### {shape} under flex_attention (compile {compile_s:.0f} s, untimed)\n\nCore path, KV length "
            f"{kv_length}:\n\n" + markdown(curve, ["k", "sdpa ms", "flex ms", "flex/sdpa"])
            + "\n\nDecode loop, G candidates every step:\n\n"
            + markdown(loop_rows, ["decoder", "tokens_per_step", "sdpa ms/step", "flex ms/step", "flex/sdpa"]))


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def markdown(rows: list[dict], columns: Sequence[str]) -> str:
    def cell(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the CSVs and summary.md (written as it goes)")
    parser.add_argument("--acceptance", nargs="*", default=[], help="rows.csv files of experiments.presets.benchmark")
    parser.add_argument("--shapes", nargs="*", default=None, help="7b 13b (default), or tiny")
    parser.add_argument("--tiny", action="store_true", help="tiny shape on whatever device: a smoke test")
    parser.add_argument("--device", default=None, help="default: cuda if available")
    parser.add_argument("--kv-length", type=int, default=None, help="default 512 (tiny: 32)")
    parser.add_argument("--repeats", type=int, default=None, help="timed rounds per size (default 10, tiny 2)")
    parser.add_argument("--loop-steps", type=int, default=None, help="decode steps timed per config (default 48, tiny 8)")
    parser.add_argument("--configs", nargs="*", default=None, help="N,W,G triples for the loop timing")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's; tiny: 1)")
    parser.add_argument("--batch-rows", nargs="*", default=[], help="rows.csv files of experiments.presets.batch: "
                        "measure t(B, k) and project the speedup against batch size")
    parser.add_argument("--batch-sizes", nargs="*", type=int, default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--flex-shapes", nargs="*", default=None,
                        help="shapes timed again under flex_attention (default: the first shape; none: skip)")
    args = parser.parse_args(argv)
    threads = args.threads or (1 if args.tiny else None)
    if threads:
        torch.set_num_threads(threads)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and not args.tiny:
        parser.error("no GPU here: pass --tiny for the CPU smoke test")
    shapes = args.shapes or (["tiny"] if args.tiny else ["7b", "13b"])
    flex_shapes = shapes[:1] if args.flex_shapes is None else args.flex_shapes
    dtype = torch.float32 if device.type == "cpu" else torch.float16
    sizes = TINY_SIZES if args.tiny else GPU_SIZES
    kv_length = args.kv_length or (32 if args.tiny else 512)
    repeats = args.repeats or (2 if args.tiny else 10)
    loop_steps = args.loop_steps or (8 if args.tiny else 48)
    acceptance = read_acceptance(args.acceptance)
    triples = [tuple(int(v) for v in c.split(",")) for c in args.configs] if args.configs else list(DEFAULT_CONFIGS)
    if args.tiny and not args.configs:
        triples = triples[:2]
    loop_configs: list[LookaheadConfig | None] = [None] + [LookaheadConfig(window=w, ngram=n, guess=g) for n, w, g in triples]
    loop_configs += [a["config"] for a in acceptance if a["config"] not in loop_configs]

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    say(f"device {device_name}, dtype {dtype}, shapes {shapes}, {len(acceptance)} acceptance rows")
    summary = [f"# GPU projection ({device_name}, {str(dtype).removeprefix('torch.')}, random weights)\n"]
    meta = {"device": device_name, "dtype": str(dtype), "torch": torch.__version__, "kv_length": kv_length,
            "shapes": shapes, "acceptance": args.acceptance}
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    for shape in shapes:
        started = time.perf_counter()
        say(f"{shape}: building random model")
        model = build_model(shape, device, dtype)
        say(f"{shape}: built in {time.perf_counter() - started:.0f} s; timing forwards (model only)")
        latency = forward_latency(model, sizes, kv_length, repeats)
        write_csv(out / f"latency_events_{shape}.csv", latency)
        say(f"{shape}: t(k)/t(1) " + ", ".join(f"{r['tokens']}: {r['ratio']:.2f}" for r in latency))
        say(f"{shape}: timing forwards through CausalLM.forward (host mask + copy)")
        wall = cm.measure_latency(model, sizes, kv_length=kv_length, repeats=max(2, repeats // 2))
        write_csv(out / f"latency_core_{shape}.csv", wall.to_rows())
        events = cm.CostModel(tuple(r["tokens"] for r in latency), tuple(r["seconds"] for r in latency), device=str(device))

        prompt = torch.randint(0, model.config.vocab_size, (kv_length,), generator=torch.Generator().manual_seed(1)).tolist()
        loops: dict[str, dict] = {}
        for config in loop_configs:
            say(f"{shape}: timing the loop of {config_label(config)}")
            loops[config_label(config)] = time_loop(model, config, prompt, loop_steps)
            write_csv(out / f"loop_{shape}.csv", list(loops.values()))
        projection = project(acceptance, events, wall, loops)
        write_csv(out / f"projection_{shape}.csv", projection)

        summary += [
            f"## {shape} ({sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters)\n",
            f"Forward latency (model only, {'CUDA events' if device.type == 'cuda' else 'wall clock'}), KV length "
            f"{kv_length}:\n\n" + markdown([{"k": r["tokens"], "ms": 1e3 * r["seconds"], "t(k)/t(1)": r["ratio"],
                                             "core path ms": 1e3 * wall.latency(r["tokens"])} for r in latency],
                                           ["k", "ms", "t(k)/t(1)", "core path ms"]),
            "\nDecode loop, G candidates every step:\n\n" + markdown(
                list(loops.values()), ["decoder", "tokens_per_step", "ms_per_step", "model_ms_per_step",
                                       "host_ms_per_step", "overhead_frac"]),
        ]
        if projection:
            summary.append("\nProjected speedup over greedy (S from the CPU runs of a real model):\n\n" + markdown(
                projection, ["source", "decoder", "S", "tokens_per_step", "t1_ms", "tk_ms",
                             "projected_forward_only", "projected_with_loop"]))
        batches = read_batch_records(args.batch_rows)
        if batches:
            costs = {}
            for B in args.batch_sizes:
                say(f"{shape}: timing batched forwards, B = {B}")
                costs[B] = cm.measure_latency(model, sizes, kv_length=kv_length, repeats=max(2, repeats // 2), batch=B)
                write_csv(out / f"latency_batch_{shape}.csv", [r for c in costs.values() for r in c.to_rows()])
            batch_projection = project_batches(batches, costs)
            write_csv(out / f"projection_batch_{shape}.csv", batch_projection)
            summary.append("\nt(B, k) / t(B, 1), core path:\n\n" + markdown(
                [{"B": B, **{f"k={k}": c.latency(k) / c.latency(1) for k in (1, 4, 16, 64)}} for B, c in costs.items()],
                ["B", "k=1", "k=4", "k=16", "k=64"]))
            summary.append("\nProjected speedup over batched greedy (per-sequence records from the CPU batch runs):\n\n"
                           + markdown(batch_projection, ["dataset", "decoder", "B", "projected", "batches"]))
        if shape in flex_shapes:
            del model
            if device.type == "cuda":
                torch.cuda.empty_cache()
            summary.append(flex_section(shape, device, dtype, sizes, kv_length, repeats, loop_configs, prompt,
                                        loop_steps, wall, loops, out))
            model = None
        (out / "summary.md").write_text("\n".join(summary) + "\n")
        say(f"{shape}: done in {time.perf_counter() - started:.0f} s")
        print("\n".join(summary[-3:]), flush=True)
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    say(f"written {out / 'summary.md'}")


if __name__ == "__main__":
    main()

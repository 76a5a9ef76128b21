"""Correctness on a GPU, without any weights: probe, fp32 losslessness, fp16/bf16 divergence, host cost.

    python scripts/gpu_check.py --out results/gpu            # Llama-2-7B shape, one GPU, ~3-6 minutes
    python scripts/gpu_check.py --tiny --out /tmp/gpu_check   # tiny shape on the CPU (tests run this)

On a Llama-2-7B-shaped model with random weights built on the device (``gpu_bench.build_model``),
once per dtype (fp32, fp16, bf16):

1. the capability probe (``lookahead_core.capability``): max |logit| difference between a branching step
   and plain forwards, against the dtype's tolerance;
2. greedy and lookahead decodes of ``--prompts`` prompts x ``--new-tokens`` tokens, for lookahead
   W5 N4 G5 with and without the prompt pool, and pool-only with a pool holding the greedy text's
   n-grams (so that steps accept N tokens and multi-token KV commits run): every output is compared
   with greedy and each difference judged by ``lookahead_core.divergence`` (near_tie / mismatch);
3. host overhead per step (loop time outside the model's forward) of each decoder.

The same again under ``attn_implementation="flex_attention"`` (the core's block masks; the compile
is timed apart, ``compile_s``) for ``--flex-dtypes`` (default fp32 and fp16). fp32 must be
token-identical (a fp32 mismatch or a failed probe exits 1); in fp16/bf16 near-ties are expected
and counted. Results go to ``--out`` (``check.json``, ``summary.md``) as they come.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_bench import build_model, markdown, say  # noqa: E402

from lookahead_core import (  # noqa: E402
    CausalLM, DecodeLimits, DecodeState, LookaheadConfig, NGramPool, decode, divergence, probe,
)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
CONFIGS = {
    "lookahead_w5_n4_g5": LookaheadConfig(5, 4, 5),
    "lookahead_pool_w5_n4_g5": LookaheadConfig(5, 4, 5, prompt_pool=True),
    "pool_only_true_n4_g4": LookaheadConfig(ngram=4, guess=4, pool_only=True),
}


def prompts(vocab: int, count: int, length: int) -> list[list[int]]:
    """Random prompts with a repeated motif, so that the prompt pool has something to find."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        motif = torch.randint(0, vocab, (8,), generator=gen).tolist()
        noise = torch.randint(0, vocab, (length,), generator=gen).tolist()
        out.append((motif + noise[: length // 2] + motif + noise[length // 2:])[:length])
    return out


def true_pool(prompt: list[int], greedy: list[int], ngram: int) -> DecodeState:
    pool = NGramPool(ngram, capacity=64)
    pool.add_from_sequence(prompt[-1:] + greedy)
    return DecodeState.with_pool(pool)


def check_dtype(model, dtype_name: str, batch: list[list[int]], new_tokens: int) -> dict:
    lm = CausalLM(model)
    started = time.perf_counter()
    result = probe(lm)
    say(f"{lm.attention} {dtype_name}: probe {'passed' if result.passed else 'FAILED'}, max diff "
        f"{result.max_diff:.3g} (tolerance {result.tolerance:g})")
    limits = DecodeLimits(max_new_tokens=new_tokens)
    for config in (None, *CONFIGS.values()):           # warm-up: under flex_attention, the compile
        decode(lm, batch[0], config, DecodeLimits(max_new_tokens=4))
    compile_s = time.perf_counter() - started
    verdicts: dict[str, Counter] = {name: Counter() for name in CONFIGS}
    margins: dict[str, list[float]] = {name: [] for name in CONFIGS}
    host: dict[str, list[float]] = {"greedy": [], **{name: [] for name in CONFIGS}}
    steps: dict[str, int] = Counter()
    for prompt in batch:
        base = decode(lm, prompt, None, limits)
        host["greedy"].append(1e3 * (base.stats.decode_seconds - base.stats.model_seconds) / base.stats.steps)
        steps["greedy"] += base.stats.steps
        for name, config in CONFIGS.items():
            state = true_pool(prompt, base.tokens, config.ngram) if name.startswith("pool_only_true") else None
            out = decode(lm, prompt, config, limits, state=state)
            steps[name] += out.stats.steps
            host[name].append(1e3 * (out.stats.decode_seconds - out.stats.model_seconds) / out.stats.steps)
            found = divergence(lm, prompt, base.tokens, out.tokens)
            verdicts[name]["equal" if found is None else found.verdict] += 1
            if found is not None:
                margins[name].append(found.margin)
    rows = [{"decoder": name, "steps": steps[name], **{k: verdicts[name][k] for k in ("equal", "near_tie", "mismatch")},
             "max_margin": max(margins[name], default=None),
             "host_ms_per_step": statistics.median(host[name])} for name in CONFIGS]
    rows.insert(0, {"decoder": "greedy", "steps": steps["greedy"], "equal": None, "near_tie": None, "mismatch": None,
                    "max_margin": None, "host_ms_per_step": statistics.median(host["greedy"])})
    return {"probe": {"passed": result.passed, "max_diff": result.max_diff, "tolerance": result.tolerance,
                      "reasons": list(result.reasons)}, "decoders": rows, "compile_s": compile_s}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for check.json and summary.md")
    parser.add_argument("--tiny", action="store_true", help="tiny shape (a CPU smoke test)")
    parser.add_argument("--device", default=None, help="default: cuda if available")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per dtype (default 4, tiny 2)")
    parser.add_argument("--new-tokens", type=int, default=None, help="tokens per decode (default 96, tiny 16)")
    parser.add_argument("--prompt-length", type=int, default=None, help="default 256 (tiny 24)")
    parser.add_argument("--dtypes", nargs="*", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--flex-dtypes", nargs="*", default=["float32", "float16"], choices=list(DTYPES),
                        help="dtypes checked again under flex_attention (none: skip)")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type != "cuda" and not args.tiny:
        parser.error("no GPU here: pass --tiny for the CPU smoke test")
    if args.tiny:
        torch.set_num_threads(1)
    torch.backends.cuda.matmul.allow_tf32 = False      # fp32 means fp32: TF32 would add its own noise
    shape = "tiny" if args.tiny else "7b"
    count = args.prompts or (2 if args.tiny else 4)
    new_tokens = args.new_tokens or (16 if args.tiny else 96)
    length = args.prompt_length or (24 if args.tiny else 256)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    report = {"device": device_name, "shape": shape, "torch": torch.__version__, "prompts": count,
              "new_tokens": new_tokens, "prompt_length": length, "dtypes": {}, "flex_attention": {}}
    summary = [f"# GPU check ({device_name}, Llama-2-{shape} shape, random weights)\n"]
    failed = []
    runs = [("sdpa", d) for d in args.dtypes] + [("flex_attention", d) for d in args.flex_dtypes]
    for attention, dtype_name in runs:
        started = time.perf_counter()
        torch.manual_seed(0)
        torch._dynamo.reset()          # each dtype's flex kernels compile within torch's recompile limit
        model = build_model(shape, device, DTYPES[dtype_name], attention)
        say(f"{attention} {dtype_name}: built in {time.perf_counter() - started:.0f} s")
        result = check_dtype(model, dtype_name, prompts(model.config.vocab_size, count, length), new_tokens)
        result["seconds"] = time.perf_counter() - started
        report["dtypes" if attention == "sdpa" else attention].setdefault(dtype_name, result)
        label = dtype_name if attention == "sdpa" else f"{attention} {dtype_name}"
        if not result["probe"]["passed"]:
            failed.append(f"{label} probe: {result['probe']['reasons']}")
        if dtype_name == "float32":
            failed += [f"{label} {r['decoder']}: {r['mismatch']} mismatches" for r in result["decoders"] if r.get("mismatch")]
        probe_line = (f"probe {'passed' if result['probe']['passed'] else 'FAILED'}: max |logit diff| "
                      f"{result['probe']['max_diff']:.3g}, tolerance {result['probe']['tolerance']:g}; "
                      f"probe and warm-up {result['compile_s']:.1f} s"
                      + (" (the compile)" if attention == "flex_attention" else ""))
        summary += [f"## {label} ({result['seconds']:.0f} s)\n", probe_line + "\n",
                    markdown(result["decoders"], ["decoder", "steps", "equal", "near_tie", "mismatch", "max_margin",
                                                  "host_ms_per_step"]) + "\n"]
        (out / "check.json").write_text(json.dumps(report, indent=1) + "\n")
        (out / "summary.md").write_text("\n".join(summary) + "\n")
        say("\n".join(summary[-3:]))
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    report["failed"] = failed
    (out / "check.json").write_text(json.dumps(report, indent=1) + "\n")
    say(f"written {out / 'summary.md'}; " + ("FAILED: " + "; ".join(failed) if failed else "all checks passed"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

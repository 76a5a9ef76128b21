"""The command: the pieces in the order that keeps what matters most, each if it fits the budget,
an alarm for one that overruns, and the files rewritten after each."""

from __future__ import annotations

import argparse
import gc
import platform
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

import torch
import transformers

from experiments.rows.provenance import git_commit
from lookahead_core.capability import UnsupportedAttentionError, device_name

from . import __doc__ as DOC
from .checks import check_family
from .projection import ROOT, SOURCES, project, read_sources
from .record import OutOfTime, Run
from .shapes import FAMILIES, FLEX_ORDER, GPU_PLAN, TINY_PLAN, Plan, flex_kernels, gpu_dtype
from .timing import time_flex, time_sdpa


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()



def pieces(keys: list[str], flex: list[str], sections: list[str]) -> list[tuple[str, str, str]]:
    """(section, model, attention) in the order they run: what matters most first. (a) and (b) under
    SDPA for every model; then flex_attention, alternating (a) and (b), models whose kernels are new
    (MHA, then GQA with a sliding window) before those that reuse them."""
    out = [("a", k, "sdpa") for k in keys if "correctness" in sections]
    out += [("b", k, "sdpa") for k in keys if "timing" in sections]
    order = sorted(flex, key=lambda k: (FLEX_ORDER.index(k) if k in FLEX_ORDER else len(FLEX_ORDER)))
    for key in order:
        out += [(section, key, "flex_attention") for section, name in (("a", "correctness"), ("b", "timing"))
                if name in sections]
    return out


def run_pieces(run: Run, plan: Plan, device: torch.device, tiny: bool, todo: list[tuple[str, str, str]],
               curves: dict) -> None:
    """Each piece if its estimate fits in what is left of the budget, else a note; a piece's error is
    a failure for (a) and a note for (b), and the run goes on."""
    for section, key, attention in todo:
        what = f"({section}) {key} {attention}"
        if attention == "sdpa":
            kind = "check_sdpa" if section == "a" else "time_sdpa"
        else:
            kernels = flex_kernels(FAMILIES[key], torch.float32 if section == "a" else gpu_dtype(device))
            kind = ("check_flex_" if section == "a" else "time_flex_") + ("reuse" if kernels in run.compiled else "new")
        if not run.fits(kind, plan):
            run.skip(what, f"{run.left():.0f} s left, it needs about {run.estimate(kind, plan):.0f} s")
            run.pieces.append({"piece": what, "section": section, "status": "skipped by the budget"})
            continue
        started = time.perf_counter()
        run.pieces.append({"piece": what, "section": section, "status": "running"})
        try:
            if section == "a":
                check_family(run, key, attention, plan, device, tiny)
            elif attention == "sdpa":
                time_sdpa(run, key, plan, device, tiny, curves, traffic=not any(r.get("traffic") for r in run.host))
            else:
                time_flex(run, key, plan, device, tiny, curves)
            if attention != "sdpa":
                run.compiled.add(kernels)
            run.pieces[-1]["status"] = "done"
        except UnsupportedAttentionError as error:     # the backend is wrong on this host: said, not failed
            run.pieces[-1]["status"] = "refused"
            run.refusals.append(f"{what}: {error}")
            run.say(f"REFUSED {what}: {error}")
        except Exception as error:  # noqa: BLE001 - one piece's failure leaves the others their time
            message = f"{what}: {type(error).__name__}: {error}"
            run.pieces[-1]["status"] = "error"
            (run.failures if section == "a" else run.notes).append(message)
            run.say(f"ERROR {message}")
        run.took(kind, time.perf_counter() - started)
        run.pieces[-1]["seconds"] = time.perf_counter() - started
        free(device)                     # the piece's model went with its frame
        if section == "b":
            project(run, curves, tiny)
        run.save()



def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=DOC.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for the (at most 8) result files")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU: the smoke test")
    parser.add_argument("--device", default=None, help="default: cuda if available (cuda:N names one GPU)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds from the process start (default 450; tiny: none)")
    parser.add_argument("--models", nargs="*", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--project", nargs="*", default=[], metavar="GLOB",
                        help="more CPU rows to project (results CSVs, relative to the repository): every core "
                        "decoder in them, forward time only (no host time is measured for their configs)")
    parser.add_argument("--sections", nargs="*", default=["correctness", "timing"], choices=["correctness", "timing"])
    parser.add_argument("--flex-models", nargs="*", default=None, choices=list(FAMILIES),
                        help="the models checked and timed again under flex_attention (default: all of --models; "
                        "none: SDPA only)")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda" and not args.tiny:
        parser.error("no GPU here: pass --tiny for the CPU smoke test")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    plan = TINY_PLAN if args.tiny else GPU_PLAN
    flex_models = args.models if args.flex_models is None else [m for m in args.models if m in args.flex_models]
    budget = args.budget if args.budget is not None else (None if args.tiny else 450.0)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.tiny:
        torch.set_num_threads(1)
    # float32 means float32: no TF32 in matmuls, convolutions or flex's Triton kernels
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    for name in ("recompile_limit", "cache_size_limit"):     # four shapes x two dtypes of flex kernels
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(64, getattr(torch._dynamo.config, name)))

    run = Run(out, budget)
    run.meta = {"device": device_name(device), "device_index": str(device), "tiny": args.tiny,
                "torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
                "python": platform.python_version(), "commit": git_commit(ROOT), "budget_s": budget,
                "started": time.strftime("%Y-%m-%d %H:%M:%S"), "plan": {f.name: getattr(plan, f.name) for f in fields(plan)},
                "argv": list(argv) if argv is not None else sys.argv[1:],
                "checks_planned": [f"{k} sdpa" for k in args.models] + [f"{k} flex_attention" for k in flex_models]
                if "correctness" in args.sections else []}
    run.say(f"{run.meta['device']} ({device}), torch {torch.__version__}, transformers {transformers.__version__}, "
            f"budget {budget or 'none'} s, models {args.models}")
    run.sources = read_sources(ROOT, SOURCES + tuple(("rows", pattern, None) for pattern in args.project))
    run.say(f"(c) {len(run.sources)} groups of CPU rows to project from: "
            + ", ".join(sorted({f"{s['what']}:{s['decoder']}" for s in run.sources})))
    run.save()

    def alarm(signum, frame):
        raise OutOfTime()

    previous = None
    if budget is not None and hasattr(signal, "setitimer"):
        previous = signal.signal(signal.SIGALRM, alarm)
        signal.setitimer(signal.ITIMER_REAL, max(budget - run.elapsed(), 1.0))
    curves: dict = {}
    try:
        run_pieces(run, plan, device, args.tiny, pieces(args.models, flex_models, args.sections), curves)
    except OutOfTime:
        current = run.pieces[-1] if run.pieces and run.pieces[-1]["status"] == "running" else None
        if current is not None:
            current["status"] = "stopped by the budget"
        run.notes.append(f"the budget ({budget:.0f} s) ran out "
                         + (f"during {current['piece']}" if current else "between pieces") + ": what finished is kept")
    finally:
        if previous is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    project(run, curves, args.tiny)
    for leftover in out.glob("*.tmp"):          # a write the alarm interrupted
        leftover.unlink()
    run.meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    run.save()
    files = sorted(p.name for p in out.iterdir())
    run.say(f"done in {run.elapsed():.0f} s; {len(files)} files in {out}: {files}; "
            + ("FAILED: " + "; ".join(run.failures) if run.failures else "no failure"))
    run.save()
    run.log_handle.close()
    return 1 if run.failures else 0

"""(b) Timing: t(k) curves of each mission shape at full depth, and the decode loop's host cost per
step (the loop's wall time minus its forwards', ``DecodeStats.model_seconds``) with the host<->device
copies and synchronizations of a step."""

from __future__ import annotations

import re
import statistics
import time
import warnings
from collections import Counter
from collections.abc import Callable

import torch

from lookahead_core import CausalLM, DecodeLimits, decode
from lookahead_core import cost as cm
from experiments.config.labels import config_label
from lookahead_core.flex import FALLBACK_WARNING, rearm_fallback_warning

from .record import Run
from .shapes import CHECKS, FAMILIES, PAPER, POOL, Plan, admit, build, gpu_dtype, random_eagle, to_flex, used_pool


def synchronize(device: torch.device) -> None:
    """Wait for ``device``'s work, named: without a device torch.cuda.synchronize waits on the current one."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def traffic(names) -> Counter:
    """Host<->device copies and host synchronizations among profiler event names."""
    counts = Counter()
    for name in names:
        if name.startswith("Memcpy HtoD"):
            counts["h2d"] += 1
        elif name.startswith("Memcpy DtoH"):
            counts["d2h"] += 1
        elif name in SYNC_CALLS:
            counts["syncs"] += 1
    return counts


def profiled_traffic(run_once: Callable[[], object], device: torch.device) -> Counter:
    from torch.profiler import ProfilerActivity, profile

    synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run_once()
    return traffic(event.name for event in prof.events())


def sync_warnings(run_once: Callable[[], object]) -> int:
    """Synchronizing CUDA calls of ``run_once()`` as ``torch.cuda.set_sync_debug_mode`` reports them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            run_once()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def traffic_per_step(decode_with: Callable[[DecodeLimits], object], tokens: int, device: torch.device) -> dict:
    """Copies and syncs per decoding step: a ``tokens``-token decode's minus a prefill-only decode's,
    over its steps (CUDA only; the profiler and the sync debug mode each count them their way)."""
    row = {"h2d_per_step": None, "d2h_per_step": None, "syncs_per_step": None, "sync_warnings_per_step": None}
    if device.type != "cuda":
        return row
    limits, prefill = DecodeLimits(max_new_tokens=tokens), DecodeLimits(max_new_tokens=1)
    outputs = []
    try:
        full = profiled_traffic(lambda: outputs.append(decode_with(limits)), device)
        base = profiled_traffic(lambda: decode_with(prefill), device)
        steps = max(outputs[0].stats.steps, 1)
        for kind in ("h2d", "d2h", "syncs"):
            row[f"{kind}_per_step"] = (full[kind] - base[kind]) / steps
    except Exception as error:  # noqa: BLE001 - a profiler that does not run leaves the columns empty
        row["traffic_error"] = f"profiler: {type(error).__name__}: {error}"
    try:
        outputs.clear()
        full = sync_warnings(lambda: outputs.append(decode_with(limits)))
        row["sync_warnings_per_step"] = (full - sync_warnings(lambda: decode_with(prefill))) / max(
            outputs[0].stats.steps, 1)
    except Exception as error:  # noqa: BLE001
        row["traffic_error"] = f"sync debug mode: {type(error).__name__}: {error}"
    return row


def host_costs(run: Run, key: str, model, curve: cm.CostModel, plan: Plan, kv_length: int, traffic: bool) -> None:
    """ms per step outside the forward, for greedy and for configs whose steps accept drafts, and for
    an EAGLE-3 drafter's tree (random weights: every level grown, its forwards counted apart too);
    with ``traffic``, their copies and syncs per step too (the same for every model of these 32 layers)."""
    device = model.device
    drafters = {"eagle": random_eagle(model)}                 # used only by the config that drafts with it
    plain = CausalLM(model, drafters=drafters)
    prompt = torch.randint(0, model.config.vocab_size, (kv_length,), generator=torch.Generator().manual_seed(2)).tolist()
    limits = DecodeLimits(max_new_tokens=plan.host_tokens)
    greedy = decode(plain, prompt, None, limits).tokens
    auto = cm.widest_tree(curve)
    configs = {"greedy": None, "pool_N4G4 (prefilled)": POOL, "paper la_N5W15G15 (prefilled)": PAPER,
               f"auto {config_label(auto)} (prefilled, this device's cut)": auto,
               "eagle EAGLE-3 drafter, 10 nodes, 6 levels (random weights)": CHECKS["eagle"]}
    for name, config in configs.items():
        started = time.perf_counter()

        def decode_with(lim: DecodeLimits, config=config):
            state = used_pool(config, prompt, greedy) if config is not None and config.guess else None
            return decode(plain, prompt, config, lim, state=state)

        try:
            decode_with(DecodeLimits(max_new_tokens=4))            # warm-up: the probe, the kernels
            out = decode_with(limits)
            stats = out.stats
            forward = stats.model_seconds          # the step forwards, timed by the core's ForwardClock
            row = {"model": key, "attention": "sdpa", "kv_length": kv_length, "decoder": name,
                   "config": config_label(config), "steps": stats.steps,
                   "fed_per_step": statistics.fmean(stats.step_tokens) if stats.step_tokens else 0.0,
                   "accepted_per_step": stats.compression,
                   "ms_per_step": 1e3 * stats.decode_seconds / max(stats.steps, 1),
                   "forward_ms_per_step": 1e3 * forward / max(stats.steps, 1),
                   "host_ms_per_step": 1e3 * (stats.decode_seconds - forward) / max(stats.steps, 1),
                   "draft_ms_per_step": 1e3 * stats.draft_seconds / max(stats.steps, 1),
                   "matches_greedy": out.tokens == greedy[: len(out.tokens)]}
            if traffic and device.type == "cuda":
                row.update(traffic_per_step(decode_with, plan.traffic_tokens, device), traffic=True)
        except Exception as error:  # noqa: BLE001
            row = {"model": key, "attention": "sdpa", "kv_length": kv_length, "decoder": name,
                   "config": config_label(config), "error": f"{type(error).__name__}: {error}"}
        row["seconds"] = time.perf_counter() - started
        run.host.append(row)
        run.say(f"(b) {key} host: {name}: " + (row["error"] if "error" in row else
                f"{row['accepted_per_step']:.2f} accepted / {row['fed_per_step']:.1f} fed a step, "
                f"{row['host_ms_per_step']:.2f} ms host (of it {row['draft_ms_per_step']:.2f} ms drafter) + "
                f"{row['forward_ms_per_step']:.2f} ms forward"
                + (f", {row['syncs_per_step']:.1f} syncs, {row['h2d_per_step']:.1f} H2D a step"
                   if row.get("syncs_per_step") is not None else "")))
        run.save()


def curve_note(message: str) -> str:
    if FALLBACK_WARNING in message:
        return "flex_attention ran uncompiled (torch's fallback)"
    bent = re.search(r"for k = (\[[^\]]*\])", message)
    return f"bent at k = {bent.group(1)}" if bent else message.split("\n")[0][:100]


def curve(run: Run, key: str, lm: CausalLM, plan: Plan, kv_length: int) -> cm.CostModel:
    started = time.perf_counter()
    rearm_fallback_warning()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cost = cm.measure_latency(lm, plan.sizes, kv_length=kv_length, repeats=plan.repeats,
                                  extra_rounds=plan.extra_rounds)
    seconds = time.perf_counter() - started
    notes = sorted({curve_note(str(w.message)) for w in caught
                    if FALLBACK_WARNING in str(w.message) or "still bent" in str(w.message)})
    run.curves.append({"model": key, "attention": lm.attention, "kv_length": kv_length, "dtype": str(lm.dtype),
                       "seconds_to_measure": seconds, "warnings": notes,
                       "t1_ms": 1e3 * cost.latency(1), "t256_over_t1": cost.latency(plan.sizes[-1]) / cost.latency(1)})
    for row in cost.to_rows():
        run.latency.append({"model": key, "device": run.meta.get("device"), "dtype": str(lm.dtype).removeprefix("torch."),
                            **{k: v for k, v in row.items() if k not in ("host_seconds", "device")}})
    run.say(f"(b) {key} {lm.attention} KV {kv_length}: t(1) {1e3 * cost.latency(1):.2f} ms, "
            + ", ".join(f"t({k})/t(1) {cost.latency(k) / cost.latency(1):.2f}" for k in plan.sizes[1::4])
            + f" ({seconds:.0f} s{'; ' + '; '.join(notes) if notes else ''})")
    return cost


def time_sdpa(run: Run, key: str, plan: Plan, device: torch.device, tiny: bool, curves: dict, traffic: bool) -> None:
    """(b) for one model under SDPA: its curves at each KV length and the host cost of its steps."""
    started = time.perf_counter()
    model = build(FAMILIES[key], device, gpu_dtype(device), tiny=tiny)
    run.say(f"(b) {key}: built {sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters, "
            f"{str(model.dtype).removeprefix('torch.')}, in {time.perf_counter() - started:.0f} s")
    lm = CausalLM(model)
    for kv in plan.kv_lengths:
        curves[(key, "sdpa", kv)] = curve(run, key, lm, plan, kv)
        run.save()
    host_costs(run, key, model, curves[(key, "sdpa", plan.kv_lengths[0])], plan, plan.kv_lengths[0], traffic)


def time_flex(run: Run, key: str, plan: Plan, device: torch.device, tiny: bool, curves: dict) -> None:
    """(b) for one model under flex_attention: its curves (the kernels compile in the untimed first round)."""
    model = build(FAMILIES[key], device, gpu_dtype(device), tiny=tiny)
    to_flex(model)
    admit(model)
    lm = CausalLM(model)
    for kv in plan.kv_lengths:
        curves[(key, "flex_attention", kv)] = curve(run, key, lm, plan, kv)
        run.save()


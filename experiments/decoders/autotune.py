"""``decoding=auto``: calibrate on prompts that are not evaluated, pick a config, remember the pick.

The choice itself is :func:`lookahead_core.cost.choose_config`; this module runs it for the
harness and the benchmark and stores its record (latency curve, every candidate's S and predicted
speedup, the pick) as JSON beside the results. A rerun of the same command reloads that record
instead of calibrating again, so a resumed run keeps decoding with the config it started with.

What a calibration measures is also kept for other jobs, outside the repository, under
:func:`cache_root` (``$LOOKAHEAD_CALIBRATION_CACHE``, default ``<model cache>/calibration``):

* ``latency/``: the device's latency curve, a property of (model, dtype, device, threads,
  attention implementation, batch size, linear kernel) and the KV length's power-of-two bucket
  (:class:`CurveKey`), with the date and the load average it was measured under;
* ``acceptance/``: draft acceptance per (tag, depth) for a (model, dataset, decoding mode),
  updated after every evaluated item (:class:`AcceptanceStore`); a calibration that finds one
  skips its survey decode, and the evaluated decodes start from it;
* ``picks/``: whole calibration records, keyed by the curve, the calibration items, their tokens
  and the grid (:func:`pick_key`): the same job on the same machine calibrates once.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from lookahead_core import cost as cm
from lookahead_core import decode
from experiments.config.labels import config_label
from experiments.reporting.calibration import calibration_markdown
from lookahead_core.capability import device_name
from lookahead_core.config import DecodeLimits, LookaheadConfig, SamplingConfig, config_fields
from lookahead_core.drafts import Bins, Counts, DraftStats

CACHE_FORMAT = 1           # bump when what a cached file means changes (its tags, its fields)
PICK_FORMAT = 2            # a cached pick's; 2: its saved configs size suffix and recycle in ``sources``
CURVE_FORMAT = 3           # a cached latency curve's; 2: the loop's host time per greedy step; 3: sizes 5, 7, 13

FINALISTS = 3              # configs calibrated in full after the screen
SCREEN_MIN_TOKENS = 8      # the screen decodes max(this, calibration tokens / 2) tokens per prompt
# Half, not a quarter: a 16-token screen (of 64) cannot see what a 10-deep suffix draft copies; on
# Qwen2.5-Coder CNN/DM it screened 1-match depth-10 at S 2.25 where prompt lookup k = 10 reaches 5.1
# over 128 tokens (git show b8db823:results/benchmark/trees/README.md, "auto2").


def calibrate(
    model,
    prompts: list[list[int]],
    limits: DecodeLimits,
    path: Path,
    *,
    grid: Sequence[LookaheadConfig] | None = None,
    always: Sequence[LookaheadConfig] = (),
    sampling: SamplingConfig | None = None,
    finalists: int = FINALISTS,
    cost_model: cm.CostModel | None = None,
    prior: DraftStats | None = None,
    shared: Path | None = None,
    extra: dict | None = None,
) -> dict:
    """Run ``choose_config`` (or reload its record from ``path``, else from ``shared``) and return
    the record, written to ``path`` and to ``shared``.

    ``grid`` defaults to the cost model's default grid; configs in ``always`` are calibrated even
    when their upper bound says they cannot win, so that each gets a prediction to check. Every
    config is first screened on half the calibration tokens; the ``finalists`` best are
    then calibrated in full. ``cost_model``: a latency curve measured before (:func:`latency_curve`);
    ``prior``: draft acceptance measured before (no survey decode then); see ``choose_config``.
    ``extra``: more fields for the record (the latency curve's provenance).
    """
    path = Path(path)
    if path.exists():
        return json.loads(path.read_text())
    if shared is not None and shared.exists():
        record = json.loads(shared.read_text())
        record = {**record, **(extra or {}), "reused_from": str(shared)}
        write_json(path, record)
        return record
    grid = list(cm.default_grid() if grid is None else grid)
    with tqdm(desc="decoding=auto: calibrating", total=None, leave=False) as bar:
        chosen, report = cm.choose_config(
            model, prompts, limits, grid, always_calibrate=list(always), sampling=sampling,
            progress=lambda message: (bar.set_postfix_str(message), bar.update(1)),
            screen_tokens=max(SCREEN_MIN_TOKENS, limits.max_new_tokens // 2), finalists=finalists,
            cost_model=cost_model, prior=prior, namer=config_label,
        )
    record = {
        "chosen": config_label(chosen),
        # Every field but the seed, which the run that uses the pick supplies.
        "chosen_config": config_fields(chosen),
        "calibrated_at": _now(),
        "calibration_prompts": len(prompts),
        "calibration_tokens": limits.max_new_tokens,
        "calibration_seconds": report.seconds,
        "latency": report.cost_model.to_rows(),
        "candidates": report.rows(),
        # The acceptance per (tag, depth) the cost-aware decodes started from, and where it came from.
        "draft_prior": None if report.drafts is None else report.drafts.counts.table(by_source=False),
        "draft_prior_source": "stored" if prior is not None else ("survey" if report.drafts is not None else None),
        "markdown": "#### decoding=auto / cost model calibration\n\n" + calibration_markdown(report)
                    + "\n\nForward latency t(k)/t(1) on this device: "
                    + ", ".join(f"{k}: {r:.2f}" for k, r in report.cost_model.relative()),
        **(extra or {}),
    }
    write_json(path, record)
    if shared is not None:
        write_json(shared, record)
    return record


def prepare(lm, model: str, dataset: str, item_ids: Sequence[str], prompts: list[list[int]], limits: DecodeLimits,
            path: Path, *, protocol: str = "grid", sampling: SamplingConfig | None = None,
            always: Sequence[LookaheadConfig] = (), batch: int = 1, recalibrate: bool = False,
            root: Path | None = None) -> tuple[dict, AcceptanceStore, DraftStats | None]:
    """``decoding=auto``'s pick for a job, with the caches (:func:`cache_root`): the record at
    ``path`` if a resumed job has one; else the latency curve (cached per :class:`CurveKey`), then
    protocol ``grid`` (:func:`calibrate` on ``prompts``, the calibration items ``item_ids``; a pick
    cached for the same key is copied; acceptance stored for (model, dataset, mode) replaces the
    survey) or ``online`` (:func:`online`); for ``batch`` > 1 under ``grid``,
    :func:`calibrate_batch`. ``recalibrate`` forgets the cached curve, pick and acceptance first.

    Returns the record (with ``job_calibration_seconds``, what this call spent, when it made or
    copied one), the acceptance store the evaluated turns add to, and the prior of the first
    evaluated decode (the stored acceptance, else the survey's, else ``None``)."""
    root = cache_root() if root is None else root
    mode = sampling_mode(sampling)
    store = AcceptanceStore(root, model, dataset, mode)
    fresh, started = not Path(path).exists(), time.perf_counter()
    if recalibrate and fresh:
        store.path.unlink(missing_ok=True)
    stored = store.load()
    if fresh:                            # a resumed job keeps its own record: its curve and pick
        kv = int(statistics.fmean(len(p) for p in prompts) + limits.max_new_tokens / 2)
        key = CurveKey.of(lm, model, kv)
        curve, provenance = latency_curve(lm, key, root, remeasure=recalibrate, need=CurveNeed.of(protocol))
        extra = {"latency_provenance": provenance}
        if protocol == "online":
            record = online(path, curve, extra=extra)
        else:
            shared = pick_path(root, pick_key(key, dataset, item_ids, limits.max_new_tokens, mode, cm.default_grid(),
                                              always))
            if recalibrate:
                shared.unlink(missing_ok=True)
            record = calibrate(lm, prompts, limits, path, sampling=sampling, always=always, cost_model=curve,
                               prior=stored, shared=shared, extra=extra)
        record["job_calibration_seconds"] = time.perf_counter() - started
        write_json(path, record)
    else:
        record = json.loads(Path(path).read_text())
    if batch > 1 and protocol == "grid" and "batch" not in record:
        alone = cm.CostModel.from_rows(record["latency"])
        batch_cost, _ = latency_curve(lm, CurveKey.of(lm, model, alone.kv_length, batch), root, remeasure=recalibrate)
        record = calibrate_batch(lm, prompts, limits, path, record, batch, sampling=sampling, batch_cost=batch_cost)
    prior = stored.learnt() if stored is not None else draft_prior(record)
    if stored is None and prior is not None and record.get("draft_prior_source") == "survey":
        store.add(prior, decodes=len(prompts))          # the survey's, for the next job
    return record, store, prior


def describe(record: dict, path: Path) -> str:
    """One line on a record: the pick, where the record is, what it reused."""
    curve = record.get("latency_provenance") or {}
    batch = record.get("batch", {}).get("batch_size")
    return (f"the cost model chose {chosen_label(record)}" + (f" for batches of {batch}" if batch else "")
            + f" (calibration record: {path}" + (f"; reused from {record['reused_from']}" if "reused_from" in record else "")
            + (f"; latency curve of {curve['measured_at']} at load {curve['load_average'][0]:.1f}" if curve else "")
            + ")")


def online(path: Path, cost_model: cm.CostModel, *, extra: dict | None = None) -> dict:
    """The online protocol's record (or the one at ``path``): no grid calibrated, nothing decoded;
    the pick is :func:`lookahead_core.cost.widest_tree` on ``cost_model``, whose step costs include
    the decode loop's host time per greedy step that :func:`measure_curve` measured with the curve.
    The draft acceptance its cuts start from is the caller's (stored, or none: the tags' own
    estimates and the guesses), and grows with every evaluated turn."""
    path = Path(path)
    if path.exists():
        return json.loads(path.read_text())
    chosen = cm.widest_tree(cost_model)
    record = {
        "protocol": "online",
        "chosen": config_label(chosen),
        "chosen_config": config_fields(chosen),
        "calibrated_at": _now(), "calibration_prompts": 0, "calibration_tokens": 0, "calibration_seconds": 0.0,
        "latency": cost_model.to_rows(), "candidates": [], "draft_prior": None,
        "markdown": (f"#### decoding=auto (online) \n\nNo grid calibrated: **{config_label(chosen)}**, every step "
                     f"cut by its nodes' estimates against this device's step costs (host "
                     f"{1e3 * cost_model.host_seconds:.2f} ms a step).\n\nForward latency t(k)/t(1) on this "
                     "device: " + ", ".join(f"{k}: {r:.2f}" for k, r in cost_model.relative())),
        **(extra or {}),
    }
    write_json(path, record)
    return record


EAGLE_NODES = 16           # the EAGLE tree's nodes auto offers its cut


def eagle_price(lm, drafter, cost_model: cm.CostModel, *, depth: int = 6, rounds: int = 5) -> dict:
    """What ``lm``'s EAGLE drafter costs on this device, in greedy steps of ``cost_model``'s curve: a step's
    update (the drafter reading two committed tokens) and each level of its tree past the first
    (``level``, from the time of growing ``depth`` levels against one), medians of ``rounds``."""
    import torch

    from lookahead_core.drafts import StepOutcome
    from lookahead_core.eagle import EagleSource

    prompt = torch.randint(0, lm.vocab_size, (64,), generator=torch.Generator().manual_seed(0)).tolist()
    with torch.inference_mode():
        states = lm.model(torch.tensor([prompt], device=lm.device), output_hidden_states=True).hidden_states
    features = torch.cat([states[i][0] for i in lm.feature_layers], -1)          # as a step hands them over
    updates, grown = [], {1: [], depth: []}
    for _ in range(rounds + 1):                               # the first round warms up
        source = EagleSource(drafter, EAGLE_NODES, depth)
        source.update(StepOutcome(prompt[:-2], len(prompt) - 2, prompt[-3], features=features[:-3]))
        before = source.seconds
        source.update(StepOutcome(prompt, len(prompt) - 2, prompt[-3], features=features[-3:-1]))
        updates.append(source.seconds - before)
        for levels in grown:
            source.depth, before = levels, source.seconds
            source.propose(prompt)
            grown[levels].append(source.seconds - before)
    one = cost_model.step_seconds(None)
    level = max(0.0, statistics.median(grown[depth][1:]) - statistics.median(grown[1][1:])) / (depth - 1)
    return {"update": statistics.median(updates[1:]) / one, "first_level": statistics.median(grown[1][1:]) / one,
            "level": level / one, "greedy_step_seconds": one}


def eagle_trial(lm, prompts: list[list[int]], limits: DecodeLimits, configs: dict[str, LookaheadConfig], *,
                sampling: SamplingConfig | None = None, prior: DraftStats | None = None) -> dict:
    """Decode ``prompts`` (items that are not evaluated) with each of ``configs``, interleaved per
    prompt (the order turning each prompt) after a 16-token warm-up of each, every decode starting
    from ``prior``; per config: decode seconds per committed token, S and the drafter's seconds."""
    from lookahead_core import DecodeState

    def run(config: LookaheadConfig, prompt: list[int], limit: DecodeLimits):
        state = DecodeState(cache=None, cached_tokens=[], drafts=copy.deepcopy(prior)) if prior is not None else None
        return decode(lm, prompt, config, limit, sampling, state=state).stats

    for config in configs.values():
        run(config, prompts[0], replace(limits, max_new_tokens=16))
    totals = {name: [0.0, 0, 0, 0.0] for name in configs}          # seconds, tokens, steps, drafter seconds
    names = list(configs)
    for i, prompt in enumerate(prompts):
        for name in names[i % len(names):] + names[:i % len(names)]:
            stats = run(configs[name], prompt, limits)
            for k, v in enumerate((stats.decode_seconds, stats.new_tokens, stats.steps, stats.draft_seconds)):
                totals[name][k] += v
    return {name: {"seconds_per_token": t[0] / max(t[1], 1), "S": t[1] / max(t[2], 1), "tokens": t[1],
                   "draft_seconds": t[3]} for name, t in totals.items()}


def consider_eagle(lm, record: dict, folder: Path, path: Path, prompts: list[list[int]], limits: DecodeLimits, *,
                   sampling: SamplingConfig | None = None, prior: DraftStats | None = None) -> dict:
    """The online pick with the model's EAGLE drafter (in ``folder``) considered. Priced on this
    device (:func:`eagle_price`); where its held-out acceptance at depth 1 (from its training
    record; 0.5 when it has none) cannot even pay for a step's update and first level, it is left
    out at once. Else both trees, the widest without and with the drafter's ``EAGLE_NODES`` best
    nodes (its levels priced by ``draft_cost``, so each step's tree stops where a level costs more
    than it can add), decode ``prompts`` (:func:`eagle_trial`: items that are not evaluated), and
    the drafter joins only if its tree took less time per token. Written into ``record``
    (``eagle``) and to ``path``."""
    from lookahead_core.eagle import load_drafter

    drafter = lm.drafters.get("eagle") or load_drafter(folder, lm.model)
    lm.drafters["eagle"] = drafter
    chosen = chosen_config(record)
    price = eagle_price(lm, drafter, cm.CostModel.from_rows(record["latency"]))
    acceptance = (getattr(drafter, "training_record", None) or {}).get("acceptance") or [0.5]
    trial, started = None, time.perf_counter()
    if chosen is not None and prompts and acceptance[0] > price["update"] + price["first_level"]:
        with_eagle = replace(chosen, sources={**dict(chosen.sources), "eagle": EAGLE_NODES}, draft_cost=price["level"])
        trial = eagle_trial(lm, prompts, limits, {"without": chosen, "with": with_eagle}, sampling=sampling, prior=prior)
        trial["prompts"], trial["seconds"] = len(prompts), time.perf_counter() - started
    used = trial is not None and trial["with"]["seconds_per_token"] < trial["without"]["seconds_per_token"]
    record["eagle"] = {"drafter": str(folder), "price_in_greedy_steps": {k: round(v, 4) for k, v in price.items()},
                       "heldout_acceptance": acceptance, "trial": trial, "used": used}
    head = (f"\n\nThe model's EAGLE drafter ({folder}): a step's update costs {price['update']:.3f} greedy steps, "
            f"its first level {price['first_level']:.3f} and each further one {price['level']:.3f}; held-out "
            f"acceptance at depth 1 {acceptance[0]:.2f}")
    if trial is None:
        record["markdown"] += head + (": left out, that cannot pay for a step's update and first level." if prompts
                                      else ": left out, no calibration item to try it on.")
    else:
        a, b = trial["with"], trial["without"]
        record["markdown"] += head + (
            f". Tried on {len(prompts)} calibration items: {1e3 * a['seconds_per_token']:.1f} ms a token at S "
            f"{a['S']:.2f} with its {EAGLE_NODES} best nodes in the tree, {1e3 * b['seconds_per_token']:.1f} ms at "
            f"S {b['S']:.2f} without: " + ("it joins the tree." if used else "left out."))
    if used:
        record["chosen"], record["chosen_config"] = config_label(with_eagle), config_fields(with_eagle)
    write_json(path, record)
    return record


def write_json(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(path.suffix + ".partial")
    partial.write_text(json.dumps(record, indent=1, default=str) + "\n")
    partial.replace(path)


def calibrate_batch(model, prompts: list[list[int]], limits: DecodeLimits, path: Path, record: dict, batch: int,
                    *, sampling: SamplingConfig | None = None, repeats: int = 3,
                    batch_cost: cm.CostModel | None = None) -> dict:
    """The pick for batches of ``batch`` sequences, added to ``record`` (the B = 1 calibration,
    saved again at ``path``) as ``record["batch"]``; a record that has it is returned as it is.

    The B = 1 calibration's finalists (status ``calibrated``) decode each calibration prompt again
    for their per-step records; t(B, k) is the record's own curve at B = 1 and is measured at
    B = ``batch`` on the same sizes and KV length; :func:`lookahead_core.cost.choose_for_batch`
    predicts each finalist's speedup over batched greedy for a batch made of those sequences;
    greedy wins where none is predicted above 1.
    """
    if "batch" in record:
        return record
    configs = {row["decoder"]: LookaheadConfig(**json.loads(row["params"])) for row in record["candidates"]
               if row["status"] == "calibrated" and row.get("params")}
    alone = cm.CostModel.from_rows(record["latency"])
    costs = {1: alone, batch: batch_cost or cm.measure_latency(model, alone.tokens, kv_length=alone.kv_length,
                                                               repeats=repeats, batch=batch)}
    calibration = {}
    for label, config in tqdm(configs.items(), desc=f"decoding=auto: per-step records for B={batch}", leave=False):
        outs = [decode(model, prompt, config, limits, sampling).stats for prompt in prompts]
        calibration[label] = (config, [(stats.step_tokens, stats.accepted) for stats in outs])
    pick, predicted = cm.choose_for_batch(costs, calibration, batch)
    chosen = calibration[pick][0] if pick != "greedy" else None
    record = {**record, "batch": {
        "batch_size": batch, "chosen": pick, "predicted": predicted,
        "chosen_config": config_fields(chosen),
        "latency": [row for c in costs.values() for row in c.to_rows()],
    }}
    record["markdown"] += (f"\n\nFor batches of {batch}: **{pick}** (predicted speedup over batched greedy: "
                           + ", ".join(f"{k} {v:.2f}x" for k, v in predicted.items()) + ")")
    write_json(path, record)
    return record


def chosen_config(record: dict, seed: int = 0) -> LookaheadConfig | None:
    """The pick of a calibration record (for batches, when it has one); ``None`` means greedy was
    predicted fastest."""
    chosen = record["batch"]["chosen_config"] if "batch" in record else record["chosen_config"]
    return None if chosen is None else LookaheadConfig(**chosen, seed=seed)


def draft_prior(record: dict) -> DraftStats | None:
    """The acceptance the calibration's survey measured (``None``: no survey, or an older record)."""
    rows = record.get("draft_prior")
    return None if rows is None else DraftStats(Counts.from_table(rows))


def chosen_label(record: dict) -> str:
    return record["batch"]["chosen"] if "batch" in record else record["chosen"]


def write_tables(record: dict, folder: Path) -> None:
    """``latency.csv`` and ``calibration.csv`` of a record, for plots and notebooks."""
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(record["latency"]).to_csv(folder / "latency.csv", index=False)
    pd.DataFrame(record["candidates"]).to_csv(folder / "calibration.csv", index=False)


# ---------------------------------------------------------------------------------------------
# What a calibration measured, kept for later jobs


def cache_root() -> Path:
    """``$LOOKAHEAD_CALIBRATION_CACHE``, else ``calibration/`` under the model cache root."""
    from experiments.models.loader import default_cache_root

    env = os.environ.get("LOOKAHEAD_CALIBRATION_CACHE")
    return Path(env).expanduser() if env else default_cache_root() / "calibration"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _slug(fields: dict) -> str:
    """A readable, filesystem-safe name for ``fields`` plus a hash of all of them."""
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:12]
    words = "_".join(str(v) for v in fields.values() if isinstance(v, (str, int)) and len(str(v)) <= 24)
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in words)
    return f"{safe[:80]}_{digest}"


@dataclass(frozen=True)
class CurveKey:
    """What a forward's latency depends on, hence what a cached curve is keyed by."""

    model: str
    dtype: str
    device: str          # "<device type>:<device_name()>": a curve belongs to the chip, not to the device type
    threads: int         # torch intra-op threads
    attention: str
    batch: int
    kv_length: int       # kv_bucket() of the job's mean prompt plus half its new tokens
    linear: str = "stock"  # the linear layers' kernel (lookahead_core.kernels.linear_kernel)

    @classmethod
    def of(cls, lm, model: str, kv_length: int, batch: int = 1) -> CurveKey:
        import torch

        from lookahead_core.kernels import linear_kernel

        chip = lm.device if lm.device.type in ("cuda", "cpu") else torch.device("cpu")
        return cls(model, str(lm.model.dtype).removeprefix("torch."), f"{lm.device.type}:{device_name(chip)}",
                   torch.get_num_threads(), lm.attention, batch, cm.kv_bucket(kv_length), linear_kernel(lm.model))

    def path(self, root: Path) -> Path:
        return root / "latency" / f"{_slug(asdict(self))}.json"


@dataclass(frozen=True)
class CurveNeed:
    """What a protocol prices from a curve: steps of up to ``tokens`` tokens, and (``one_logit``)
    steps that keep fewer logit rows than they feed (the linear window's rows). ``online``'s one tree
    keeps every row's logits and feeds at most its budget, so its curve costs under half of the
    full one (no one-logit variant, no sizes beyond 64)."""

    tokens: int = max(cm.DEFAULT_SIZES)
    one_logit: bool = True

    @classmethod
    def of(cls, protocol: str) -> CurveNeed:
        widest = cm.widest_tree(cm.CostModel(tokens=(1,), seconds=(1.0,))) if protocol == "online" else None
        return cls(widest.budget, False) if widest is not None else cls()    # the tree online decodes with

    def sizes(self) -> tuple[int, ...]:
        """The default sizes up to the first that holds ``tokens``."""
        return cm.sizes_through(self.tokens)

    def met_by(self, curve: cm.CostModel) -> bool:
        return max(curve.tokens) >= self.tokens and (curve.seconds_one_logit is not None or not self.one_logit)

    def union(self, curve: cm.CostModel) -> CurveNeed:
        """This need and what ``curve`` covers: a re-measured curve keeps serving its earlier users."""
        return CurveNeed(max(self.tokens, max(curve.tokens)), self.one_logit or curve.seconds_one_logit is not None)


def measure_curve(lm, *, kv_length: int, batch: int = 1, need: CurveNeed = CurveNeed()) -> cm.CostModel:
    """:func:`lookahead_core.cost.step_costs` at ``kv_length`` and ``batch`` for the sizes of ``need``."""
    return cm.step_costs(lm, need.sizes(), kv_length=kv_length, batch=batch, one_logit=need.one_logit)


def latency_curve(lm, key: CurveKey, root: Path, *, remeasure: bool = False, need: CurveNeed = CurveNeed(),
                  measure: Callable[..., cm.CostModel] = measure_curve) -> tuple[cm.CostModel, dict]:
    """The latency curve for ``key``: the cached one if it meets ``need``, or (``remeasure``, none
    cached, another format, one that falls short) measured now at the key's KV length and batch,
    for ``need`` and whatever the cached one covered, and cached. Returns the curve and its
    provenance: the key, when and under which load average (1 minute, before and after) it was
    measured, how long that took, and whether this call reused it."""
    path = key.path(root)
    if not remeasure and path.exists():
        cached = json.loads(path.read_text())
        if cached.get("format") == CURVE_FORMAT and cached.get("key") == asdict(key):
            curve = cm.CostModel.from_rows(cached["rows"])
            if need.met_by(curve):
                return curve, {**cached["meta"], "reused": True, "path": str(path)}
            need = need.union(curve)
    before, started = os.getloadavg()[0], time.perf_counter()
    curve = measure(lm, kv_length=key.kv_length, batch=key.batch, need=need)
    meta = {"key": asdict(key), "measured_at": _now(), "host": platform.node(),
            "load_average": [before, os.getloadavg()[0]], "seconds": time.perf_counter() - started}
    write_json(path, {"format": CURVE_FORMAT, "key": asdict(key), "meta": meta, "rows": curve.to_rows()})
    return curve, {**meta, "reused": False, "path": str(path)}


def sampling_mode(sampling: SamplingConfig | None) -> str:
    """``greedy`` or ``t0.7-k0-p0.9``: acceptance differs between them."""
    if sampling is None or sampling.greedy:
        return "greedy"
    return f"t{sampling.temperature:g}-k{sampling.top_k}-p{sampling.top_p:g}"


class AcceptanceStore:
    """Draft acceptance per (tag, depth) measured on one (model, dataset, decoding mode), counts
    summed over every decode that reported to it, in this job and earlier ones."""

    def __init__(self, root: Path, model: str, dataset: str, mode: str) -> None:
        self.key = {"model": model, "dataset": dataset, "mode": mode}
        self.path = root / "acceptance" / f"{_slug(self.key)}.json"
        self.decodes = 0                  # decodes the stored counts come from (as of the last load)

    def load(self) -> DraftStats | None:
        """The stored counts (``None``: none stored, or in another format)."""
        if not self.path.exists():
            return None
        stored = json.loads(self.path.read_text())
        if stored.get("format") != CACHE_FORMAT or stored.get("key") != self.key:
            return None
        self.decodes = int(stored.get("decodes", 0))
        return DraftStats(Counts.from_table(stored["table"]), Bins.from_list(stored.get("calibration", ())))

    def add(self, stats: DraftStats, decodes: int = 1) -> None:
        """Add ``stats``' own counts (``decodes`` decodes' worth) to what is stored now: several
        decoders of one job, or jobs side by side, each add theirs."""
        total = self.load() or DraftStats()
        total.merge(stats)
        self.decodes += decodes
        write_json(self.path, {"format": CACHE_FORMAT, "key": self.key, "updated_at": _now(), "decodes": self.decodes,
                               "table": total.counts.table(by_source=False), "calibration": total.calibration.to_list()})


def pick_key(curve: CurveKey, dataset: str, items: Sequence[str], tokens: int, mode: str,
             grid: Sequence[LookaheadConfig], always: Sequence[LookaheadConfig] = ()) -> dict:
    """What a calibration's pick depends on beyond the curve: the calibration items (by id), their
    new tokens, the decoding mode and the configs it chose among."""
    return {"curve": asdict(curve), "dataset": dataset, "items": list(items), "tokens": tokens, "mode": mode,
            "grid": sorted(config_label(c) for c in grid), "always": sorted(config_label(c) for c in always),
            "format": PICK_FORMAT}


def pick_path(root: Path, key: dict) -> Path:
    return root / "picks" / f"{_slug({'model': key['curve']['model'], 'dataset': key['dataset'], **key})}.json"

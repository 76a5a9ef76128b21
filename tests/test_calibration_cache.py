"""``auto``'s calibration cache (experiments/decoders/autotune.py): latency curves keyed by what a
forward's latency depends on, draft acceptance per (model, dataset, mode), picks per calibration.
The harness's use of them (online learning, a second job calibrating nothing) is tested in
test_harness.py."""

from __future__ import annotations

import json
from dataclasses import asdict, fields, replace
from pathlib import Path

import pytest
import torch

from experiments.decoders import autotune
from experiments.models.tiny import tiny_random_model
from lookahead_core import CausalLM, DraftStats, LookaheadConfig
from lookahead_core.cost import CostModel, kv_bucket

KEY = autotune.CurveKey("smollm2_135m", "float32", "cpu:Some CPU", 1, "sdpa", 1, 256)


class Measure:
    """A stand-in for ``measure_latency`` that counts its calls and returns a fixed curve."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def __call__(self, lm, **kwargs) -> CostModel:
        self.calls.append(kwargs)
        need = kwargs["need"]
        seconds = (0.01, 0.02 + 0.001 * len(self.calls))
        return CostModel(tokens=(1, need.tokens), seconds=seconds, seconds_one_logit=seconds if need.one_logit else None,
                         kv_length=kwargs["kv_length"])


def test_every_field_of_the_key_names_another_curve(tmp_path: Path) -> None:
    changed = {"model": "qwen25_coder_05b", "dtype": "bfloat16", "device": "cuda:NVIDIA H200", "threads": 2,
               "attention": "eager", "batch": 4, "kv_length": 512, "linear": "stream"}
    assert {f.name for f in fields(autotune.CurveKey)} == set(changed)
    paths = {KEY.path(tmp_path)} | {replace(KEY, **{name: value}).path(tmp_path) for name, value in changed.items()}
    assert len(paths) == len(changed) + 1
    assert KEY.path(tmp_path) == autotune.CurveKey(**asdict(KEY)).path(tmp_path)      # stable across processes


def test_a_curve_is_measured_once_per_key_reused_and_measured_again_when_asked(tmp_path: Path) -> None:
    measure = Measure()
    first, meta = autotune.latency_curve(None, KEY, tmp_path, measure=measure)
    assert not meta["reused"] and len(measure.calls) == 1
    assert measure.calls[0] == {"kv_length": 256, "batch": 1, "need": autotune.CurveNeed()}
    assert len(meta["load_average"]) == 2 and meta["measured_at"].startswith("20") and meta["key"] == asdict(KEY)
    again, meta2 = autotune.latency_curve(None, KEY, tmp_path, measure=measure)
    assert meta2["reused"] and len(measure.calls) == 1 and again == first and meta2["measured_at"] == meta["measured_at"]
    fresh, meta3 = autotune.latency_curve(None, KEY, tmp_path, measure=measure, remeasure=True)
    assert not meta3["reused"] and len(measure.calls) == 2 and fresh != first
    assert autotune.latency_curve(None, KEY, tmp_path, measure=measure)[0] == fresh     # the new one is cached
    autotune.latency_curve(None, replace(KEY, threads=2), tmp_path, measure=measure)
    assert len(measure.calls) == 3                                                      # another key: measured


def test_online_measures_only_what_it_prices_and_a_curve_that_falls_short_is_measured_again(tmp_path: Path) -> None:
    """``online`` prices one tree that keeps every row's logits, at most its budget: its curve has
    no one-logit variant and stops at 64 tokens. ``grid`` needs both: the curve is measured again
    for both needs together, and serves ``online`` from then on."""
    online = autotune.CurveNeed.of("online")
    assert online == autotune.CurveNeed(64, False) and online.sizes()[-1] == 64 and 96 not in online.sizes()
    assert autotune.CurveNeed.of("grid") == autotune.CurveNeed() and autotune.CurveNeed().sizes()[-1] == 128
    assert autotune.CurveNeed(10).sizes()[-2:] == (8, 12)            # up to the first size that holds it
    measure = Measure()
    first, meta = autotune.latency_curve(None, KEY, tmp_path, need=online, measure=measure)
    assert not meta["reused"] and first.tokens == (1, 64) and first.seconds_one_logit is None
    assert autotune.latency_curve(None, KEY, tmp_path, need=online, measure=measure)[1]["reused"]
    both, meta = autotune.latency_curve(None, KEY, tmp_path, measure=measure)        # grid's need: short
    assert not meta["reused"] and measure.calls[-1]["need"] == autotune.CurveNeed(128, True)
    again, meta = autotune.latency_curve(None, KEY, tmp_path, need=online, measure=measure)
    assert meta["reused"] and again == both and len(measure.calls) == 2
    autotune.latency_curve(None, replace(KEY, kv_length=512), tmp_path, need=autotune.CurveNeed(200, False),
                           measure=measure)
    assert measure.calls[-1]["need"] == autotune.CurveNeed(200, False)


def test_a_cached_curve_of_another_format_or_key_is_measured_again(tmp_path: Path) -> None:
    measure = Measure()
    autotune.latency_curve(None, KEY, tmp_path, measure=measure)
    path = KEY.path(tmp_path)
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({**stored, "format": autotune.CURVE_FORMAT - 1}))
    assert not autotune.latency_curve(None, KEY, tmp_path, measure=measure)[1]["reused"]
    stored = json.loads(path.read_text())
    path.write_text(json.dumps({**stored, "key": {**stored["key"], "threads": 8}}))   # a hash collision, say
    assert not autotune.latency_curve(None, KEY, tmp_path, measure=measure)[1]["reused"]
    assert len(measure.calls) == 3


def test_the_key_of_a_loaded_model_names_its_dtype_chip_threads_and_bucket() -> None:
    lm = CausalLM(tiny_random_model("llama", seed=0))
    key = autotune.CurveKey.of(lm, "tiny", kv_length=300)
    assert (key.dtype, key.threads, key.attention, key.batch, key.kv_length) == (
        "float32", torch.get_num_threads(), lm.attention, 1, 512)
    assert key.device.startswith("cpu:") and len(key.device) > 4
    assert [kv_bucket(n) for n in (1, 64, 65, 300, 1000)] == [64, 64, 128, 512, 1024]


def test_acceptance_is_stored_per_model_dataset_and_mode(tmp_path: Path) -> None:
    stats = DraftStats()
    stats.counts.fed["suffix:4", 1], stats.counts.tried["suffix:4", 1], stats.counts.accepted["suffix:4", 1] = 9, 8, 6
    stats.calibration["recycle", 4, "predicted"], stats.calibration["recycle", 4, "accepted"] = 30.0, 10
    store = autotune.AcceptanceStore(tmp_path, "smollm2_135m", "humaneval", "greedy")
    assert store.load() is None
    store.add(stats, decodes=3)
    beside = autotune.AcceptanceStore(tmp_path, "smollm2_135m", "humaneval", "greedy")   # another decoder
    beside.add(stats)
    again = autotune.AcceptanceStore(tmp_path, "smollm2_135m", "humaneval", "greedy")
    total = again.load()
    assert total.counts.tried == stats.counts.tried + stats.counts.tried and total.counts.accepted["suffix:4", 1] == 12 \
        and again.decodes == 4
    assert total.corrected("recycle", 0.45) == pytest.approx(0.45 * (20 + 5) / (60 + 5))   # the recalibration kept
    for other in (("smollm2_135m", "mbpp", "greedy"), ("qwen25_coder_05b", "humaneval", "greedy"),
                  ("smollm2_135m", "humaneval", autotune.sampling_mode(_sampling(0.7)))):
        assert autotune.AcceptanceStore(tmp_path, *other).load() is None
    assert autotune.sampling_mode(None) == autotune.sampling_mode(_sampling(0.0)) == "greedy"


def _sampling(temperature: float):
    from lookahead_core import SamplingConfig

    return SamplingConfig(temperature=temperature, top_p=0.9)


def test_a_pick_is_keyed_by_curve_items_tokens_mode_and_grid(tmp_path: Path) -> None:
    grid = [LookaheadConfig(window=5, ngram=4, guess=5), LookaheadConfig(ngram=4, guess=1, pool_only=True)]
    base = dict(curve=KEY, dataset="humaneval", items=["HumanEval/4"], tokens=128, mode="greedy", grid=grid)
    path = autotune.pick_path(tmp_path, autotune.pick_key(**base))
    variants = [{"curve": replace(KEY, threads=2)}, {"dataset": "mbpp"}, {"items": ["HumanEval/5"]}, {"tokens": 64},
                {"mode": "t0.7-k0-p1"}, {"grid": grid[:1]}]
    others = {autotune.pick_path(tmp_path, autotune.pick_key(**{**base, **v})) for v in variants}
    assert path not in others and len(others) == len(variants)
    assert autotune.pick_path(tmp_path, autotune.pick_key(**{**base, "grid": grid[::-1]})) == path   # a set


@pytest.mark.parametrize("env", [True, False])
def test_the_cache_lives_outside_the_repository(env: bool, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    if env:
        monkeypatch.setenv("LOOKAHEAD_CALIBRATION_CACHE", str(tmp_path / "calib"))
        assert autotune.cache_root() == tmp_path / "calib"
    else:
        monkeypatch.delenv("LOOKAHEAD_CALIBRATION_CACHE")
        monkeypatch.setenv("LOOKAHEAD_CACHE", str(tmp_path / "models"))
        assert autotune.cache_root() == tmp_path / "models" / "calibration"


def test_a_measured_curve_carries_the_loops_host_time_and_the_online_pick_decodes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lm = CausalLM(tiny_random_model("llama", seed=0))
    key = autotune.CurveKey.of(lm, "tiny", kv_length=64)
    curve, meta = autotune.latency_curve(lm, key, tmp_path)
    assert not meta["reused"] and 0 < curve.host_seconds < 0.1
    again, meta2 = autotune.latency_curve(lm, key, tmp_path)
    assert meta2["reused"] and again.host_seconds == curve.host_seconds                 # cached with the curve
    monkeypatch.setattr(autotune, "decode", lambda *a, **k: pytest.fail("the online pick decoded"))
    record = autotune.online(tmp_path / "job.auto.json", again)
    assert record["protocol"] == "online" and record["calibration_seconds"] == 0.0
    assert CostModel.from_rows(record["latency"]).host_seconds == curve.host_seconds
    assert f"host {1e3 * curve.host_seconds:.2f} ms a step" in record["markdown"]

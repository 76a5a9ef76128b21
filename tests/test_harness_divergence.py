"""The harness judges every greedy row that differs from its baseline, and a fp32 mismatch fails the
run after its rows are written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

import lookahead_core
from experiments.reporting import report
from experiments.job import runner
from experiments.data.datasets import repo_root
from experiments.config.schema import register_configs

from conftest import DATA_ROOT  # the full data when present, else tests/fixtures/data

register_configs()
OVERRIDES = ["model=tiny_llama", "threads=1", "warmup=0", "decoding.window=3", "decoding.ngram=3",
             "decoding.guess=3", "experiment=mtbench", "dataset.limit=2", "dataset.turns=2",
             "experiment.max_new_tokens=12"]
WRONG_AT = 4


@pytest.fixture(autouse=True)
def keep_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def corrupt_lookahead(monkeypatch: pytest.MonkeyPatch, items: set[str] | None = None) -> None:
    """Lookahead outputs get a wrong token at WRONG_AT in the first turn (turn 2 then differs too)."""
    real = lookahead_core.decode               # what the core decoders call

    def decode(model, ids, lookahead, *args, **kwargs):
        out = real(model, ids, lookahead, *args, **kwargs)
        if lookahead is not None and kwargs.get("state") is None:
            out.tokens[WRONG_AT] = (out.tokens[WRONG_AT] + 1) % model.vocab_size
        return out

    monkeypatch.setattr(lookahead_core, "decode", decode)


def run(tmp_path: Path, *extra: str) -> Path:
    with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[*OVERRIDES, f"data_root={DATA_ROOT}", f"results_dir={tmp_path}", *extra])
    return runner.run(cfg)


def test_a_fp32_mismatch_fails_the_run_after_writing_its_rows(tmp_path, monkeypatch):
    corrupt_lookahead(monkeypatch)
    with pytest.raises(runner.LosslessnessError, match="2 fp32 rows .* depart from greedy") as failed:
        run(tmp_path)
    csv = next(tmp_path.rglob("*.csv"))
    df = report.load_results([csv])
    assert len(df) == 8                                                  # 2 items x 2 turns x 2 decoders
    looked = df[~df["baseline"]].sort_values(["item_id", "turn"])
    first = looked[looked["turn"] == 1]
    assert (first["diff_verdict"] == "mismatch").all() and (first["first_diff"] == WRONG_AT).all()
    assert (first["diff_margin"] > 1e-3).all()
    assert df[df["baseline"]][["first_diff", "diff_margin", "diff_verdict"]].isna().all().all()
    for item in first["item_id"]:
        assert f"{item} turn 1 (lookahead, token {WRONG_AT}" in str(failed.value)
    table = report.divergence_table(df).iloc[0]
    assert (table["dtype"], table["rows"], table["mismatch"], table["near_tie"]) == ("float32", 4, 2, 0)
    assert table["differ"] == 2 + table["earlier_turn"]


def test_a_turn_after_a_differing_one_is_judged_there():
    prompts = {"greedy": [1, 2, 3], "lookahead": [1, 2, 4]}
    assert runner.compare_to_baseline(None, prompts, "greedy", "lookahead", [5, 6, 7], [5, 9, 7], False,
                                      lookahead_core.SamplingConfig()) == \
        {"matches_greedy": False, "first_diff": 1, "diff_margin": None, "diff_verdict": "earlier_turn"}

def test_lossless_rows_carry_no_verdict_and_bf16_mismatches_do_not_fail(tmp_path, monkeypatch):
    clean = report.load_results([run(tmp_path / "clean", "dataset.turns=1")])
    assert clean[~clean["baseline"]]["matches_greedy"].all() and clean["diff_verdict"].isna().all()
    corrupt_lookahead(monkeypatch)
    df = report.load_results([run(tmp_path / "bf16", "dataset.turns=1", "model.dtype=bfloat16", "device=cpu")])
    assert set(df[~df["baseline"]]["diff_verdict"]) <= {"mismatch", "near_tie"} and (df["dtype"] == "bfloat16").all()

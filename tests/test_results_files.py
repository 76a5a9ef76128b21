"""Results files: committed rows kept as gzip CSV (read, reported and resumed as they are) and the
config written beside every result, from which ``run.py`` reruns it alone (issue 46, items 2 and 5)."""

from __future__ import annotations

import dataclasses
import gzip
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from experiments.config.settings import check_parallel_backend, to_settings
from experiments.data.datasets import repo_root
from experiments.reporting import report
from experiments.rows.schema import COLUMNS
from experiments.rows.store import ResultStore, sidecar

from conftest import DATA_ROOT
from test_configs import compose_config

TINY = ["model=tiny_llama", "threads=1", "warmup=0", "decoding.window=3", "decoding.ngram=3", "decoding.guess=3",
        "experiment=mtbench", "dataset.turns=1", "experiment.max_new_tokens=8", "experiment.score=false"]


def row(item: str, decoder: str) -> dict[str, str]:
    return {**dict.fromkeys(COLUMNS, ""), "item_id": item, "turn": "1", "decoder": decoder, "decode_s": "0.5"}


PLAN = {item: frozenset({("1", "greedy"), ("1", "la")}) for item in ("a", "b", "c")}


def test_a_gzip_results_file_is_appended_read_and_resumed_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "x-h0-s0.csv.gz"
    store = ResultStore(path, PLAN)
    assert store.finished == set()
    store.append([row("a", "greedy"), row("a", "la")])
    store.append([row("b", "greedy"), row("b", "la")])
    with gzip.open(path, "rt") as handle:          # gzip readers see one CSV (one member per append)
        assert handle.readline().strip() == ",".join(COLUMNS)
    df = pd.read_csv(path)                          # pandas reads it as it is
    assert list(df["item_id"]) == ["a", "a", "b", "b"]
    assert len(report.load_results([tmp_path])) == 4 and report.find_csvs([tmp_path]) == [path]
    assert ResultStore(path, PLAN).finished == {"a", "b"}


def test_a_gzip_member_torn_by_a_crash_drops_its_item_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "x-h0-s0.csv.gz"
    store = ResultStore(path, PLAN)
    store.append([row("a", "greedy"), row("a", "la")])
    whole = path.stat().st_size
    store.append([row("b", "greedy"), row("b", "la")])
    path.write_bytes(path.read_bytes()[:whole + (path.stat().st_size - whole) // 2])   # b's member cut in half
    resumed = ResultStore(path, PLAN)
    assert resumed.finished == {"a"}
    assert list(pd.read_csv(path)["item_id"]) == ["a", "a"]   # rewritten whole, readable again
    resumed.append([row("b", "greedy"), row("b", "la")])
    assert ResultStore(path, PLAN).finished == {"a", "b"}


def test_a_plain_file_with_a_torn_row_still_drops_that_item(tmp_path: Path) -> None:
    path = tmp_path / "x-h0-s0.csv"
    store = ResultStore(path, PLAN)
    store.append([row("a", "greedy"), row("a", "la")])
    store.append([row("b", "greedy"), row("b", "la")])
    path.write_text(path.read_text()[:-5])
    assert ResultStore(path, PLAN).finished == {"a"}


def test_the_results_path_is_the_gzip_file_where_only_it_exists(tmp_path: Path) -> None:
    settings = to_settings(compose_config(*TINY, f"results_dir={tmp_path}"), device="cpu")
    plain = settings.results_path()
    assert plain.name.endswith(".csv")
    packed = plain.with_name(plain.name + ".gz")
    packed.parent.mkdir(parents=True)
    packed.write_bytes(gzip.compress(b"item_id\n"))
    assert settings.results_path() == packed
    plain.write_text("item_id\n")                   # a plain file beside it (a job in progress) wins
    assert settings.results_path() == plain
    assert sidecar(packed, ".yaml") == sidecar(plain, ".yaml") == plain.with_name(plain.name[:-4] + ".yaml")


def test_the_config_beside_a_result_reruns_and_resumes_it_alone(tmp_path: Path) -> None:
    """A job writes ``<results name>.yaml``; ``run.py --config-dir <folder> --config-name <name>``
    composes the same settings, finds the same file and resumes it (nothing decoded again), and
    it still does after the file is gzipped."""
    command = [sys.executable, "run.py", *TINY, "dataset.limit=2", f"data_root={DATA_ROOT}",
               f"results_dir={tmp_path / 'raw'}", f"hydra.run.dir={tmp_path / 'out'}"]
    done = subprocess.run(command, cwd=repo_root(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = (tmp_path / "raw").rglob("*.csv")
    config = sidecar(results, ".yaml")
    text = config.read_text()
    assert "experiment=mtbench" in text.splitlines()[2] and yaml.safe_load(text)["dataset"]["limit"] == 2
    with gzip.open(results.with_name(results.name + ".gz"), "wb") as handle:
        handle.write(results.read_bytes())
    results.unlink()
    rerun = [sys.executable, "run.py", "--config-dir", str(config.parent), "--config-name", config.stem,
             f"hydra.run.dir={tmp_path / 'out2'}"]
    again = subprocess.run(rerun, cwd=repo_root(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "2 of 2 items already in" in again.stdout and str(results) + ".gz" in again.stdout
    assert not results.exists() and len(report.load_results([tmp_path / "raw"])) == 4
    wider = subprocess.run([*rerun, "dataset.limit=3"], cwd=repo_root(), capture_output=True, text=True, timeout=300)
    assert wider.returncode == 0, wider.stderr[-3000:]
    assert "2 of 3 items already in" in wider.stdout
    assert len(report.load_results([tmp_path / "raw"])) == 6     # the third item appended to the gzip file


COMMITTED = sorted((repo_root() / "results").rglob("*.csv.gz"))


def test_every_committed_result_is_named_by_the_config_beside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each committed rows file has its config beside it, and that config, composed as
    ``run.py --config-dir <folder> --config-name <name>`` composes it, names this very file on the
    chip its rows ran on (the chip their ``device_name`` column records): the command reruns and
    resumes it. Its rows carry the config's fingerprint."""
    from hydra import compose, initialize_config_dir

    from experiments.config.schema import register_configs

    register_configs()
    checked = 0
    for path in COMMITTED:
        config = sidecar(path, ".yaml")
        if not config.exists():
            assert path.parent.name in ("batch",), f"{path} has no config beside it"   # the batch view's derived rows
            continue
        with initialize_config_dir(config_dir=str(config.parent), version_base="1.3"):
            cfg = compose(config.stem)
        rows = pd.read_csv(path, dtype=str, keep_default_na=False)
        (chip,) = set(rows["device_name"])
        ranks = max(int(r or 1) for r in rows["lp_ranks"])           # torchrun's WORLD_SIZE when it ran
        monkeypatch.setenv("WORLD_SIZE", str(ranks))
        settings = dataclasses.replace(to_settings(cfg, device="cpu"), device_name=chip)
        if settings.ranks > 1:
            settings = dataclasses.replace(settings, backend=check_parallel_backend(settings))
        assert settings.results_path() == path, f"{config} names {settings.results_path()}"
        assert set(rows["settings"]) == {settings.fingerprint()}, path
        checked += 1
    assert checked >= 100

"""conf/suite/ (decoder lineups) and scripts/runs/: every lineup composes and plans on a tiny model,
names its decoders by their configs, and every script names only options that exist.

The scripts are run by bash as they are, with a stand-in ``python`` first on the PATH that records
its arguments instead of running anything: the loops and variables expand as they would, and each
``run.py`` command line is then composed with Hydra's compose API and checked (``to_settings``),
each ``python -m <module>`` must name a module, and a tool's (experiments/tools/) overrides must
compose with its conf/<tool>.yaml."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from experiments.config.schema import register_configs
from experiments.config.settings import plan, to_settings
from experiments.data.datasets import repo_root
from experiments.config.labels import config_label

from conftest import DATA_ROOT  # the full data when present, else tests/fixtures/data

register_configs()
ROOT = repo_root()
CONF = ROOT / "conf"
SUITES = sorted(path.stem for path in (CONF / "suite").glob("*.yaml"))
# The lineups of the former benchmark preset: each decoder named as the preset named it, by its
# config (lookahead_core.config.config_label), hf_pld_k<k> for transformers' prompt lookup.
BENCHMARK_SUITES = ("paper", "predict", "medusa")
SCRIPTS = sorted((ROOT / "scripts" / "runs").rglob("*.sh"))


def compose_config(name: str, overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(name, overrides=overrides)


def test_the_benchmark_lineups_are_there():
    assert set(BENCHMARK_SUITES) <= set(SUITES)


@pytest.mark.parametrize("suite", SUITES)
def test_every_suite_composes_and_plans(suite: str):
    cfg = compose_config("config", [f"suite={suite}", "model=tiny_llama", "experiment=mtbench", "dataset.limit=2",
                                    f"data_root={DATA_ROOT}"])
    settings, _, items = plan(cfg)
    assert settings.candidates and len(items) == 2
    assert settings.dataset.turns == 1 and settings.sampling.greedy


@pytest.mark.parametrize("suite", BENCHMARK_SUITES)
def test_benchmark_lineups_name_decoders_by_their_configs(suite: str):
    settings = to_settings(compose_config("config", [f"suite={suite}", "model=tiny_llama", "experiment=xsum"]))
    assert settings.baseline.name == "hf_greedy" and settings.sampling.greedy    # xsum samples by default
    for decoder in settings.candidates:
        if decoder.kind == "hf_pld":
            assert decoder.name == f"hf_pld_k{decoder.params.k}"
        elif decoder.kind == "core":
            assert decoder.name == (config_label(decoder.config) if decoder.config else "core_greedy")
        else:
            assert decoder.name == decoder.kind == "auto"


STAND_IN = """#!/bin/sh
exec {python} -c 'import json, os, sys; open(os.environ["RECORD"], "a").write(json.dumps(sys.argv[1:]) + "\\n")' "$@"
"""


def script_commands(script: Path, tmp_path: Path) -> list[list[str]]:
    """The ``python`` command lines ``script`` runs, recorded by a stand-in ``python``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / "python"
    stand_in.write_text(STAND_IN.format(python=sys.executable))
    stand_in.chmod(stand_in.stat().st_mode | stat.S_IXUSR)
    record = tmp_path / f"{script.stem}.jsonl"
    env = {key: value for key, value in os.environ.items() if key not in ("MODELS", "SETS", "PREFIX", "RESULTS")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", RECORD=str(record))
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


@pytest.mark.parametrize("script", SCRIPTS, ids=[str(s.relative_to(ROOT / "scripts" / "runs")) for s in SCRIPTS])
def test_scripts_name_only_existing_conf_options(script: Path, tmp_path: Path):
    commands = script_commands(script, tmp_path)
    assert commands, f"{script} runs no python"
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for argv in dict.fromkeys(map(tuple, commands)):
            if "run.py" in argv:                      # python run.py ..., python -m torch.distributed.run ... run.py ...
                overrides = [arg for arg in argv[argv.index("run.py") + 1:] if not arg.startswith("-")]
                to_settings(compose("config", overrides=overrides))
            elif argv[0] == "-m":
                module = argv[1]
                assert importlib.util.find_spec(module) is not None, f"{script.name}: no module {module}"
                tool = module.removeprefix("experiments.tools.")
                if module.startswith("experiments.tools.") and (CONF / f"{tool}.yaml").is_file():
                    importlib.import_module(module)  # registers the tool's schema
                    compose(tool, overrides=[arg for arg in argv[2:] if not arg.startswith("-")])
            else:
                assert (ROOT / argv[0]).is_file(), f"{script.name}: no file {argv[0]}"

"""The harness's command line: one Hydra job = one model x dataset subset x a list of decoders against one baseline.

    python run.py                                        # the demo, HumanEval, SmolLM2, 4 decoders
    python run.py experiment=humaneval 'decoders=[hf_pld,lookahead,auto]'
    python run.py experiment=specbench dataset.limit=130 'decoders=[hf_pld,lookahead,auto]' baseline=hf_greedy
    python run.py -m experiment=humaneval decoding.window=5,10,15 decoding.ngram=3,5
    python run.py -m sweep=smollm2_wn                    # a ready-made grid (conf/sweep/)

The config is validated before torch or transformers are imported: a bad override, a missing data
file or a missing model package fails at once, in one line naming the key. Parallel jobs on one
machine share its cores and skew speedups: time one job per device.

Config groups live in conf/ and are typed by experiments/config/schema.py (decoders by their class in
experiments/decoders/); results go to results/raw/<experiment>/<model>/<decoders>-<hash>-s<seed>.csv,
and rerunning a command resumes it. Beside each results file, ``<same name>.yaml`` holds the job's
config (the command that wrote it in its header): ``python run.py --config-dir <its folder>
--config-name <its name>`` reruns or resumes that result from it alone.
"""

import shlex
import sys
from pathlib import Path

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from experiments.data.datasets import repo_root
from experiments.config.errors import ConfigError, one_line
from experiments.config.settings import chosen_decoders, plan
from experiments.config.schema import register_configs
from experiments.rows.store import sidecar

register_configs()


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def precheck(argv: list[str]) -> None:
    """Compose a single run's overrides once, so that Hydra's own errors also come as one line."""
    if any(arg.startswith("-") for arg in argv) or any(arg.startswith(("hydra.", "hydra/", "+hydra")) for arg in argv):
        return   # multirun, --help, --cfg ...: Hydra handles those itself
    try:
        with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
            compose("config", overrides=argv)
    except (HydraException, OmegaConfBaseException) as err:
        fail(one_line(err))


@hydra.main(config_path=str(repo_root() / "conf"), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        cfg = chosen_decoders(cfg, HydraConfig.get().overrides.task)    # decoding=X runs X
        settings, adapter, items = plan(cfg)   # validates, checks packages, reads the data: no torch yet
    except ConfigError as err:
        fail(str(err))
    from experiments.job.runner import run_job   # torch and transformers load only now
    from lookahead_core.capability import UnsupportedAttentionError
    from lookahead_core.parallel import ParallelError

    try:
        run_job(settings, adapter, items, config=lambda path: job_config(cfg, HydraConfig.get(), path))
    except ConfigError as err:     # found once torch is imported (device=auto without a GPU), before the model loads
        fail(str(err))
    except UnsupportedAttentionError as err:   # the attention backend is wrong on this device: before any item
        fail(f"model.attn_implementation: {err}")
    except ParallelError as err:   # a rank died or hung: the finished batches' rows are kept
        print(f"error: {err}", file=sys.stderr)
        sys.exit(1)


def job_config(cfg: DictConfig, hydra_config, results: Path) -> str:
    """The config file written beside ``results``: the job's composed config (interpolations such as
    the data root's environment variable kept) as a primary config of its own, so that Hydra reruns
    it from that folder, and the command that wrote it."""
    args = [*(["-m"] if hydra_config.mode.name == "MULTIRUN" else []), *hydra_config.overrides.task]
    command = " ".join(["python run.py", *map(_shell, args)])
    folder = results.parent.resolve()
    folder = folder.relative_to(repo_root()) if folder.is_relative_to(repo_root()) else folder
    return "\n".join([
        f"# The config of {results.name}, beside it. From the repository root, this reruns or resumes it:",
        f"#   python run.py --config-dir {shlex.quote(str(folder))} --config-name {shlex.quote(sidecar(results, '').name)}",
        f"# (other overrides may follow). Written by: {command}",
        "defaults:", "  - run_schema", "  - _self_",
        OmegaConf.to_yaml(cfg, resolve=False),
    ])


def _shell(arg: str) -> str:
    """``arg`` quoted for bash on one line (a newline, as in stop strings, as ``$'\\n'``)."""
    if "\n" not in arg:
        return shlex.quote(arg)
    return "$'" + arg.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n") + "'"


def run() -> None:
    """``python run.py``: Hydra's command line over ``conf/``."""
    precheck(sys.argv[1:])
    main()

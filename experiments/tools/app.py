"""What the entry points under ``experiments/tools`` share: a Hydra app over ``conf/<name>.yaml``
whose config is composed and checked before anything heavy loads, a bad one failing in one line
that names the key (exit 2), as ``run.py`` does (``experiments/cli.py``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn, Optional, TypeVar

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from experiments.config.errors import ConfigError, one_line
from experiments.config.schema import ModelConfig
from experiments.config.settings import check_packages
from experiments.data.datasets import repo_root

T = TypeVar("T")


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def settings(config_name: str, overrides: Sequence[str], check: Callable[[DictConfig], T]) -> T:
    """``conf/<config_name>.yaml`` with ``overrides``, checked by ``check``; a ConfigError naming the key."""
    try:
        with initialize_config_dir(config_dir=str(repo_root() / "conf"), version_base="1.3"):
            cfg = compose(config_name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(one_line(err)) from err
    return check(cfg)


def checked(cfg: DictConfig, check: Callable[[DictConfig], T]) -> T:
    """``check(cfg)`` inside the Hydra app; a bad value exits in one line."""
    try:
        return check(cfg)
    except ConfigError as err:
        fail(str(err))


def at_least_one(s: object, *keys: str) -> None:
    """Each of ``s``'s ``keys`` is at least 1, else a ConfigError naming the key."""
    for key in keys:
        if getattr(s, key) < 1:
            raise ConfigError(f"{key}: must be at least 1, got {getattr(s, key)}")


def at_least_one_or_null(s: object, *keys: str) -> None:
    """Each of ``s``'s ``keys`` is null or at least 1 (``threads``), else a ConfigError naming the key."""
    for key in keys:
        if getattr(s, key) is not None and getattr(s, key) < 1:
            raise ConfigError(f"{key}: must be at least 1 or null, got {getattr(s, key)}")


def positive(s: object, *keys: str) -> None:
    """Each of ``s``'s ``keys`` is above 0, else a ConfigError naming the key."""
    for key in keys:
        if not getattr(s, key) > 0:
            raise ConfigError(f"{key}: must be positive, got {getattr(s, key)}")


def positive_lists(s: object, *keys: str) -> None:
    """Each of ``s``'s ``keys`` is a non-empty list of ints >= 1, else a ConfigError naming the key."""
    for key in keys:
        values = getattr(s, key)
        if not values or min(values) < 1:
            raise ConfigError(f"{key}: must be a non-empty list of ints >= 1, got {values}")


def one_kernel(model: object) -> None:
    """A tool measures one kernel: ``model.linear=both`` (both kernels, interleaved) is a run.py job's."""
    if getattr(model.linear, "value", model.linear) == "both":
        raise ConfigError("model.linear: both runs every decoder of a run.py job on both kernels; this tool "
                          "measures one: stock, stream or auto")


def stock_kernel(model: object, tool: str) -> None:
    """A tool that loads its model on PyTorch's linear layers refuses another ``model.linear``
    rather than ignore it."""
    linear = getattr(model.linear, "value", model.linear)
    if linear != "stock":
        raise ConfigError(f"model.linear: {tool} runs PyTorch's linear layers (stock), got {linear}")


def launch(config_name: str, app: Callable[[], None], check: Callable[[DictConfig], object]) -> None:
    """Check the command line's overrides once (Hydra's own errors then come as one line too), then
    run the Hydra app ``app``; multirun, ``--help`` and ``hydra.`` overrides go to Hydra as given."""
    argv = sys.argv[1:]
    if not any(arg.startswith(("-", "hydra.", "hydra/", "+hydra")) for arg in argv):
        try:
            settings(config_name, argv, check)
        except ConfigError as err:
            fail(str(err))
    app()


@dataclass
class Training:
    """What a drafter's training config (``conf/medusa.yaml``, ``conf/eagle.yaml``) holds besides its own
    fields: the base model (``model``, the harness's group), where the drafter goes, and the run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    out: Optional[str] = None              # the drafter's folder; None: the cache's, keyed by model.name
    show: bool = False                     # print where the drafter is and how it did; train nothing
    tokens: int = 120_000                  # corpus tokens
    steps: int = 1000
    eval_every: int = 50                   # held-out evaluation and checkpoint every this many steps
    seed: int = 0
    threads: Optional[int] = None          # torch.set_num_threads; None keeps torch's default
    device: str = "cpu"


def check_training(s: Training, tool: str) -> None:
    """The checks every drafter's training shares (ConfigError naming the key): counts, threads, the
    model's packages, PyTorch's linear layers."""
    at_least_one(s, "tokens", "steps", "eval_every")
    at_least_one_or_null(s, "threads")
    check_packages(s.model)
    stock_kernel(s.model, tool)

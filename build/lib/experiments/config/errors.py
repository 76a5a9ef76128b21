"""The harness's one configuration error, and Hydra's errors said on one line."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration (or a missing file or package) that cannot run; the message names the key."""


def one_line(err: BaseException) -> str:
    """An OmegaConf / Hydra error as ``key: reason`` on one line."""
    cause = err
    while cause.__cause__ is not None and not getattr(cause, "full_key", None):
        cause = cause.__cause__
    message = str(cause).split("\n")[0]
    key = getattr(cause, "full_key", None)
    return f"{key}: {message}" if key else message

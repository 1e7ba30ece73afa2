"""The training loggers speculators 0.9.0 drives (speculators.train.logger: `--logger`,
`--log-dir`, `--run-name`), checked and prepared before training starts.

Each logger imports its package lazily, at the first metric: a missing one would crash the run
after the model was built (and, on GPU, compiled). `check_installed` says it in one line first.
Every logger writes under LOG_DIR = <train --output>/logs, which `harness pull` fetches and
`harness tensorboard` serves (W&B offline where its server is unreachable; MLflow's and Trackio's
stores moved there), and `finish` leaves that directory pullable after training. Keys come from
the environment only (the host's `env` in harness.toml). Where each logger writes and why:
docs/pipeline.md, "Training loggers"; the finishing touches: docs/architecture/common-modules.md,
common/loggers.py.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Callable, Mapping
from urllib.parse import urlparse

LOG_DIR = "logs"  # under train's --output; harness/run_pull.py and harness/tensorboard.py name it too
# logger -> the package its speculators handler imports (tensorboard through torch.utils.tensorboard)
PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio", "mlflow": "mlflow"}
WANDB_DEFAULT_URL = "https://api.wandb.ai"
REACH_TIMEOUT_S = 5.0


class LoggerError(RuntimeError):
    """A logger that cannot work here, said in one line before training starts."""


def check_installed(loggers: list[str], find_spec: Callable[[str], object] = importlib.util.find_spec) -> None:
    missing = [name for name in loggers if find_spec(PACKAGES[name]) is None]
    if missing:
        packages = " ".join(PACKAGES[m] for m in missing)
        raise LoggerError(
            f"logger{'s' if len(missing) > 1 else ''} {', '.join(missing)}: package {packages} is not installed where the "
            f"train stage runs; install it there (docker hosts: container.build_args = {{ EXTRA_PIP_PACKAGES = \"{packages}\" }}, "
            "then harness build) or remove it from loggers"
        )


def reachable(url: str, timeout: float = REACH_TIMEOUT_S) -> bool:
    """A TCP connection to url's host and port opens within timeout (name lookup included: it
    has no timeout of its own, so it runs in a thread)."""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    result: list[bool] = []

    def attempt() -> None:
        try:
            with socket.create_connection((parsed.hostname or "", port), timeout=timeout):
                result.append(True)
        except OSError:
            result.append(False)

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(timeout + 1)
    return bool(result and result[0])


def prepare_env(loggers: list[str], log_dir: str, env: Mapping[str, str], can_reach: Callable[[str], bool] = reachable) -> tuple[dict[str, str], list[str]]:
    """Environment defaults the loggers need here, and one message per decision. Pure apart from
    `can_reach` (called only for wandb without WANDB_MODE)."""
    extra: dict[str, str] = {}
    messages: list[str] = []
    if "wandb" in loggers and not env.get("WANDB_MODE"):
        url = env.get("WANDB_BASE_URL") or WANDB_DEFAULT_URL
        if not can_reach(url):
            extra["WANDB_MODE"] = "offline"
            messages.append(f"W&B: {url} cannot be reached from this host: logging offline to {log_dir}/wandb "
                            f"(harness pull fetches it; then `wandb sync {log_dir}/wandb/offline-run-*` where there is internet)")
        elif not env.get("WANDB_API_KEY") and not _netrc_login(url):
            raise LoggerError("logger wandb: no WANDB_API_KEY where the train stage runs: put its name in the host's env "
                              "in harness.toml (the value stays in your environment), or set WANDB_MODE=offline")
    if "mlflow" in loggers and not env.get("MLFLOW_TRACKING_URI"):
        extra["MLFLOW_TRACKING_URI"] = f"sqlite:///{log_dir}/mlflow.db"
    if "trackio" in loggers and not any(env.get(name) for name in ("TRACKIO_DIR", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL")):
        extra["TRACKIO_DIR"] = f"{log_dir}/trackio"
    return extra, messages


def _netrc_login(url: str) -> bool:
    """`wandb login` stores the key in ~/.netrc."""
    import netrc

    try:
        return netrc.netrc().authenticators(urlparse(url).hostname or "") is not None
    except (OSError, netrc.NetrcParseError):
        return False


def apply(loggers: list[str], log_dir: str) -> list[str]:
    """check_installed, then prepare_env into os.environ; returns the messages to log."""
    check_installed(loggers)
    extra, messages = prepare_env(loggers, log_dir, os.environ)
    os.environ.update(extra)
    return messages


def finish(log_dir: str, exit_code: int = 0) -> None:
    """End the W&B run if one is open here, with exit_code (so its logs are complete), then
    replace each link under log_dir that leads out of it by a copy of its file (dropped when it
    names no file)."""
    if "wandb" in sys.modules:
        sys.modules["wandb"].finish(exit_code=exit_code)  # a no-op without a run
    root = Path(log_dir).resolve()
    if not root.is_dir():
        return
    for link in [p for p in root.rglob("*") if p.is_symlink()]:
        target = link.resolve()
        if target == root or root in target.parents:
            continue
        if target.is_file():
            fd, tmp = tempfile.mkstemp(dir=link.parent, prefix=f".{link.name}.")
            os.close(fd)
            shutil.copyfile(target, tmp)
            os.replace(tmp, link)
        else:
            link.unlink()

"""Shell completion's run ids: a local cache of the runs each host was last seen with.

`harness completion bash|zsh|fish` prints Click's script (it calls `harness` back with
_HARNESS_COMPLETE set; cli/completion_cmds.py); the candidates come from cli/params.py: commands,
hosts and groups from the config, stages from harness.pipeline, run ids from here. Completion never opens a connection: a Tab that waits on a handshake, asks for a
host key or a passphrase, or hangs on a dead link is worse than none. So the run ids are those the
last `harness run`, `runs` or `status` of that host saw (remember_runs), kept in the user's cache
directory (XDG_CACHE_HOME, else ~/.cache): a run started from another laptop completes after the
next `harness runs HOST` here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

KEPT_RUNS = 100  # per host, newest last


def cache_file() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "harness" / "run-ids.json"


def _key(config_path: str | os.PathLike[str], host: str) -> str:
    return f"{os.path.realpath(config_path)}\0{host}"


def _read() -> dict[str, list[str]]:
    try:
        data = json.loads(cache_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember_runs(config_path: str | os.PathLike[str], host: str, run_ids: Iterable[str], replace: bool = False) -> None:
    """Record run ids of a host (replace: the whole list, as `harness runs` saw it). Best effort:
    a cache that cannot be written costs completion, never the command."""
    try:
        data = _read()
        key = _key(config_path, host)
        known = [] if replace else [r for r in data.get(key, []) if isinstance(r, str)]
        ids = sorted(set(known) | set(run_ids))[-KEPT_RUNS:]
        data[key] = ids
        path = cache_file()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        os.replace(tmp, path)  # never a half-written cache
    except OSError:
        pass


def recall_runs(config_path: str | os.PathLike[str], host: str) -> list[str]:
    """The run ids remembered for a host, newest first."""
    ids = _read().get(_key(config_path, host), [])
    return sorted((r for r in ids if isinstance(r, str)), reverse=True)

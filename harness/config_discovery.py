"""Which harness.toml a command uses: `--config PATH`, else `$HARNESS_CONFIG`, else the first
harness.toml in the current directory or one above it, like git finds its repository. Paths
inside the config (sync paths, the Dockerfile, data to sync) are relative to the config file's
directory, wherever the command is run from.

A harness.toml found by walking up must belong to you (or root): one that another user could
place in a shared parent directory (/tmp) is refused by name rather than used, since a config
names the code that runs. Imports only os: the warm exec (cli/warm.py) asks it before click.
"""

from __future__ import annotations

import os

CONFIG_NAME = "harness.toml"
CONFIG_ENV = "HARNESS_CONFIG"


class ConfigNotFound(Exception):
    """No usable config; the message is one line saying what to do."""


def discover(explicit: str | None = None, cwd: str | None = None, environ: "os._Environ[str] | dict[str, str] | None" = None) -> str:
    """The config file's path (absolute when found by walking up)."""
    env = os.environ if environ is None else environ
    for given, source in ((explicit, "--config"), (env.get(CONFIG_ENV), f"${CONFIG_ENV}")):
        if given:
            if not os.path.isfile(given):
                raise ConfigNotFound(f"{given}: config file not found (from {source})")
            return given
    start = os.path.abspath(cwd or os.getcwd())
    here = start
    while True:
        candidate = os.path.join(here, CONFIG_NAME)
        if os.path.isfile(candidate):
            owner = os.stat(candidate).st_uid
            if owner not in (os.getuid(), 0):
                raise ConfigNotFound(f"{candidate} belongs to uid {owner}, not you: not using it (pass --config {candidate} if you trust it)")
            return candidate
        parent = os.path.dirname(here)
        if parent == here:
            raise ConfigNotFound(f"no {CONFIG_NAME} in {start} or above (run `harness init`, or pass --config PATH, or set {CONFIG_ENV})")
        here = parent

"""The arguments several commands share (HOST, RUN, STAGE), with their shell completion.

Completion reads only local files: the config (hosts, groups) and harness.completion's cache of
run ids; it never connects to a host (harness/completion.py says why). A leaf module: commands
import it, it imports no command.
"""

from __future__ import annotations

import click



def _config(ctx: click.Context):
    from harness.config import load_config

    root = ctx.find_root()
    path = root.params.get("config_path") or ctx.params.get("config_path")
    try:
        return load_config(path)
    except Exception:  # noqa: BLE001 - no config, or a broken one: nothing to offer, never a traceback at Tab
        return None


def complete_hosts(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    config = _config(ctx)
    names = [*config.hosts, *config.groups] if config is not None else []
    return [n for n in names if n.startswith(incomplete)]


def complete_stages(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    from harness.stages import CHAIN_NAMES, STAGES

    return [n for n in (*STAGES, *CHAIN_NAMES) if n.startswith(incomplete)]


def complete_runs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    from harness.completion import recall_runs

    config, host = _config(ctx), ctx.params.get("host")
    ids = recall_runs(config.path, host) if config is not None and host else []
    return [r for r in ["last", *ids] if r.startswith(incomplete)]


def host_argument(**kw):
    return click.argument("host", shell_complete=complete_hosts, **kw)


def run_argument(**kw):
    return click.argument("run_id", metavar="[RUN]", required=False, shell_complete=complete_runs, **kw)


def run_or_path_argument(**kw):
    """pull's REMOTE: a run (completed from the cache) or a path on the host."""
    return click.argument("remote", metavar="[REMOTE]", shell_complete=complete_runs, **kw)


def remember_runs(app, host: str, run_ids, replace: bool = False) -> None:
    """Shell completion's cache of a host's run ids (harness.completion), after a command saw them."""
    from harness.completion import remember_runs as remember

    remember(app.config.path, host, run_ids, replace=replace)

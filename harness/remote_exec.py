"""`harness exec`: run one command on a host, in its workdir, with live output and its exit code.

The command runs in the stage environment, as the host's runtime says (Runtime.foreground: the
workdir, created first on a fresh host; the container when the stages run in one). How it
reaches the host is the transport's choice (Transport.exec_foreground: its fastest way,
docs/architecture/measurements.md "Choices made by measurement"). On a host runtime nothing is asked of the host before the command.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

from harness.runtime import WrapOptions

if TYPE_CHECKING:
    from harness.host import Host


@dataclass(frozen=True)
class WarmExec:
    """Where a slow exec leaves its recipe for the warm one (transport/warm_exec.py)."""

    key: str  # names the host and the config file (cli/warm.py recipe_key)
    config_file: str  # an edit of it voids the recipe
    started_ns: int  # when this process began reading its inputs (time.time_ns())


def exec_on_host(place: "Host", argv: Sequence[str], *, pty: bool, warm: WarmExec | None = None) -> int:
    """Run argv on the host; return its exit code. With `warm`, a plain exec leaves the recipe
    for the next one."""
    host, transport, runtime = place.cfg, place.transport, place.runtime
    env = host.env_values()
    options = WrapOptions(interactive=pty, env_names=tuple(env))
    # Env values travel through the transport; a container gets them by name.
    code = transport.exec_foreground(runtime.foreground(list(argv), options), env=env, pty=pty)
    if warm is not None and not pty:
        from harness.transport.warm_exec import MARK

        transport.remember_exec(warm.key, runtime.foreground([MARK], options), env_names_known=list(host.env), env_names=list(env),
                                also_watch=[warm.config_file], started_ns=warm.started_ns)
    return code

"""State shared by the commands of one CLI invocation: the loaded config and what the command
works on (a harness.host.Host or a harness.group.Group), with one connection per host, reused by every
operation of the command and closed once when the command ends (cli/__init__.py registers
`close` on the root context: no command closes anything itself)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from harness.config import Config, load_config

if TYPE_CHECKING:
    from harness.group import Group
    from harness.host import Host
    from harness.transport import ConnectOptions, Transport


@dataclass
class AppContext:
    config_path: str | None = None
    accept_new_host_key: bool = False
    quiet: bool = False  # -q: results and errors only
    started_ns: int = field(default_factory=time.time_ns)  # before any input is read (warm exec's racy rule)
    _config: Config | None = None
    _transports: dict[str, "Transport"] = field(default_factory=dict)

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    def override(self, settings: list[str]) -> None:
        """`--set STAGE.FLAG=VALUE` for this invocation (config.with_overrides: checked first)."""
        from harness.config import with_overrides

        self._config = with_overrides(self.config, settings)

    def host(self, name: str) -> "Host":
        """One host (a group name is one clear error: this command takes one host)."""
        from harness.host import Host

        return Host(self.config, self.config.host(name), self.transport)

    def place(self, name: str) -> "Host | Group":
        """A host or a group, by name (commands that take HOST|GROUP)."""
        if name in self.config.groups:
            from harness.group import Group  # deferred: start-up (a host's command never needs it)

            return Group(self.config, name, self.transport)
        self.config.targets(name)  # neither a host nor a group: one error naming both
        return self.host(name)

    def connect_options(self) -> "ConnectOptions":
        from harness.transport import ConnectOptions

        return ConnectOptions(accept_new_host_key=self.accept_new_host_key)

    def transport(self, host_name: str) -> "Transport":
        """Open (once) and return the transport for a configured host."""
        if host_name not in self._transports:
            from harness.transport import connect

            self._transports[host_name] = connect(self.config.host(host_name), self.connect_options())
        return self._transports[host_name]

    def close(self) -> None:
        for t in self._transports.values():
            t.close()
        self._transports.clear()

"""State shared by the commands of one CLI invocation: the loaded config and open transports
(one connection per host, reused by every operation of the command)."""

from __future__ import annotations

from dataclasses import dataclass, field

from harness.config import Config, HostConfig, load_config
from harness.transport import ConnectOptions, Transport, connect


@dataclass
class AppContext:
    config_path: str | None = None
    accept_new_host_key: bool = False
    _config: Config | None = None
    _transports: dict[str, Transport] = field(default_factory=dict)

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path)
        return self._config

    def host(self, name: str) -> HostConfig:
        return self.config.host(name)

    def connect_options(self) -> ConnectOptions:
        return ConnectOptions(accept_new_host_key=self.accept_new_host_key)

    def transport(self, host_name: str) -> Transport:
        """Open (once) and return the transport for a configured host."""
        if host_name not in self._transports:
            self._transports[host_name] = connect(self.host(host_name), self.connect_options())
        return self._transports[host_name]

    def close(self) -> None:
        for t in self._transports.values():
            t.close()
        self._transports.clear()

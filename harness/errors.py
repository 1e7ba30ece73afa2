"""Typed errors. Every error a user can provoke is one of these: the CLI prints its message as
one line (`harness: error: ...`) and exits with its exit code. Nothing else should reach the user
as a traceback."""

from __future__ import annotations


class HarnessError(Exception):
    """Base class. `message` is one line; `hint` (optional) is the one-line fix."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class UsageError(HarnessError):
    """Bad input on the command line or in a file the user wrote."""

    exit_code = 2


class ConfigError(UsageError):
    """harness.toml is invalid: names the file, the key and what was expected."""

    def __init__(self, file: str, key: str, problem: str):
        super().__init__(f"{file}: {key}: {problem}")
        self.file, self.key, self.problem = file, key, problem


class TransportError(HarnessError):
    """The host could not be reached or talked to."""

    exit_code = 255  # like ssh(1) for connection-level failures


class ConnectError(TransportError):
    """TCP connect failed or timed out (unreachable host, closed port, DNS)."""


class HostKeyError(TransportError):
    """Unknown or changed host key. Never silently accepted."""


class AuthError(TransportError):
    """The server refused every key / the agent."""


class ForwardRefusedError(TransportError):
    """The host's sshd refused to open a forwarded TCP connection (AllowTcpForwarding no,
    DisableForwarding, nothing listening)."""


class RemoteCommandError(HarnessError):
    """A remote command we needed (not a user command) failed."""

    def __init__(self, argv_text: str, exit_code: int, stderr: str = ""):
        tail = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        super().__init__(f"remote command failed with exit code {exit_code}: {argv_text}" + (f": {tail}" if tail else ""))
        self.remote_exit_code = exit_code
        self.stderr = stderr

"""Typed errors and the exit codes, in one place. Every error a user can provoke is one of these:
the CLI prints it as one line, `harness: error: WHAT (HINT)`, and exits with its exit code.
Nothing else should reach the user as a traceback (docs/troubleshooting.md lists the cases)."""

from __future__ import annotations

import difflib
from typing import Iterable

# The exit codes of every command (docs/troubleshooting.md). `harness exec` and `harness shell`
# exit with the remote command's own code instead.
EXIT_OK = 0
EXIT_FAILED = 1  # it ran and did not succeed: a run failed, was cancelled or lost; a check failed; a host of a group failed
EXIT_USAGE = 2  # bad input: the command line, harness.toml, an unknown host, stage or run
EXIT_INTERRUPTED = 130  # Ctrl-C (a run keeps going on the host)
EXIT_CONNECTION = 255  # the host could not be reached or talked to (as ssh(1))


class HarnessError(Exception):
    """Base class. `message` is one line; `hint` (optional) is the one-line next step."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class Interrupted(HarnessError):
    """Ctrl-C while something was being started on the host: the line says what may be running
    there and how to see it."""

    exit_code = EXIT_INTERRUPTED


class UsageError(HarnessError):
    """Bad input on the command line or in a file the user wrote."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """harness.toml is invalid: names the file, the key and what was expected."""

    def __init__(self, file: str, key: str, problem: str, hint: str | None = None):
        super().__init__(f"{file}: {key}: {problem}", hint)
        self.file, self.key, self.problem = file, key, problem


class TransportError(HarnessError):
    """The host could not be reached or talked to."""

    exit_code = EXIT_CONNECTION


class ConnectError(TransportError):
    """TCP connect failed or timed out (unreachable host, closed port, DNS)."""


class LinkLostError(TransportError):
    """An established connection stopped answering (its keepalives went unanswered: a stalled
    link, a box that vanished)."""


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


def did_you_mean(word: str, choices: Iterable[str]) -> str | None:
    """The hint for a misspelt name: "did you mean 'train'?", or None when nothing is close."""
    close = difflib.get_close_matches(word, list(choices), n=2, cutoff=0.6)
    if not close:
        return None
    return "did you mean " + " or ".join(repr(c) for c in close) + "?"

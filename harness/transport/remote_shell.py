"""How an argv, a working directory and secret environment values become ONE remote command line
plus a few bytes for its stdin. Shared by the paramiko transport and the OpenSSH command line, so
both deliver exactly the same thing.

Environment values never appear on a command line (remote `ps`, sshd logs): they are written to
the command's stdin as NAME=value lines ended by an empty line, read by a tiny `sh` preamble
that exports them and then `exec`s the real command, which inherits the rest of stdin. `read`
consumes a pipe one byte at a time, so nothing after the empty line is swallowed.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence  # not typing: the warm exec imports this module (transport/warm_exec.py)

from harness.errors import UsageError

# Positional args stay data: the preamble is a constant, the user's argv is "$@".
ENV_PREAMBLE = (
    'while IFS= read -r harness_kv && [ -n "$harness_kv" ]; do export "$harness_kv"; done; '
    'unset harness_kv; exec "$@"'
)
# On a PTY, which echoes what it receives: echo off first, then PTY_READY tells the laptop to send
# the values (transport/terminal.py), then echo back on. No stty: refuse rather than show them.
PTY_READY = "harness:pty-ready:"
ENV_PREAMBLE_PTY = (
    "stty -echo 2>/dev/null || { echo 'harness: no stty on the host: cannot keep environment values off the screen' >&2; exit 97; }; "
    f"printf %s {PTY_READY}; " + ENV_PREAMBLE.replace('exec "$@"', 'stty echo 2>/dev/null; exec "$@"')
)


def quote_argv(argv: Sequence[str]) -> str:
    """The one place an argument vector becomes a POSIX shell command line."""
    if not argv:
        raise ValueError("empty command")
    return " ".join(shlex.quote(str(a)) for a in argv)


def env_payload(env: Mapping[str, str]) -> bytes:
    """NAME=value lines + an empty line. Rejects what a line-based protocol cannot carry."""
    lines = []
    for name, value in env.items():
        if not (name.isascii() and name.isidentifier()):  # a POSIX shell variable name
            raise UsageError(f"environment variable name {name!r} is not a valid shell name")
        if "\n" in value or "\0" in value or "\r" in value:
            # Never echo the value: it may be a secret.
            raise UsageError(f"environment variable {name} contains a newline or NUL; such values cannot be passed to a remote host")
        lines.append(f"{name}={value}\n")
    return ("".join(lines) + "\n").encode("utf-8", "surrogateescape")


def sh_expand_home(var: str) -> str:
    """Shell code expanding a leading `~` in $var on the host: the host-side twin of
    Transport.expand, for commands that must not spend a round trip learning the home."""
    return f'case ${var} in "~") {var}=$HOME;; "~/"*) {var}=$HOME/${{{var}#"~/"}};; esac'


def cd_target(path: str) -> str:
    """A shell word for `cd --` that expands a leading `~` the way the host sees it."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:]) if path[2:] else '"$HOME"'
    return shlex.quote(path)


def remote_command(
    argv: Sequence[str], *, cwd: str | None = None, env: Mapping[str, str] | None = None, pty: bool = False
) -> tuple[str, bytes]:
    """(command line for the remote login shell, bytes to send first on stdin). With pty, always
    the PTY preamble: its PTY_READY says when stdin may be sent (env values or none)."""
    if env or pty:
        preamble = ENV_PREAMBLE_PTY if pty else ENV_PREAMBLE
        command, stdin_prefix = quote_argv(["sh", "-c", preamble, "sh", *argv]), env_payload(env or {})
    else:
        command, stdin_prefix = quote_argv(argv), b""
    if cwd:
        command = f"cd -- {cd_target(cwd)} && {command}"
    return command, stdin_prefix

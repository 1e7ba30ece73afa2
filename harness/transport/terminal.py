"""An interactive command on a remote PTY (`harness shell`, `exec --pty`) through fabric.

fabric's remote runner does the terminal work: the PTY at this terminal's size, window-size
changes, stdin copied as it is typed, exit status. What this module adds, and why:
- Bytes pass unchanged. invoke decodes each read to text (a UTF-8 character split between two
  reads would be mangled), so the runner decodes latin-1, which maps every byte to one character
  and back.
- Output is streamed, not kept: invoke keeps a session's whole output and rejoins it on every
  read for its watchers, which a long session cannot afford.
- Environment values (secrets) never reach the screen. A PTY echoes what it receives, so the
  remote preamble turns echo off and prints PTY_READY (remote_shell.ENV_PREAMBLE_PTY); only then
  are the values sent, and the user's keystrokes after them.
- This terminal is put in raw mode, so every key (Ctrl-C, Ctrl-Z, Ctrl-\\) goes to the remote
  program as with `ssh -t`; invoke's own cbreak mode would let Ctrl-Z stop harness itself.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import TYPE_CHECKING

from harness.transport.remote_shell import PTY_READY

if TYPE_CHECKING:
    from fabric import Connection

BYTES = "latin-1"  # one character per byte, both ways


def run(connection: "Connection", command: str, stdin_prefix: bytes) -> int:
    """Run the remote command line on a PTY wired to this terminal; return the remote exit status
    (-1 when the server sent none)."""
    from fabric.runners import Remote

    ready = threading.Event()  # the preamble has turned echo off and got the environment values

    class TerminalRunner(Remote):
        def handle_stdout(self, buffer_, hide, output) -> None:
            pending = ""  # output before PTY_READY, held while it could be the marker's start
            for data in self.read_proc_output(self.read_proc_stdout):
                if not ready.is_set():
                    before, found, after = (pending + data).partition(PTY_READY)
                    if not found:
                        keep = _marker_prefix_length(before)
                        pending, data = before[len(before) - keep:], before[:len(before) - keep]
                    else:
                        self.write_our_output(output, before)
                        self.write_proc_stdin(stdin_prefix.decode(BYTES))
                        ready.set()
                        data = after
                if data:
                    self.write_our_output(output, data)

    stdin = _GatedStdin(ready)
    with _raw_terminal(stdin.fd):
        result = TerminalRunner(context=connection, inline_env=True).run(
            command, pty=True, warn=True, hide=False, echo=False, encoding=BYTES,
            in_stream=stdin if stdin.fd is not None else False, out_stream=_BinaryOut(sys.stdout.buffer),
        )
    return result.exited


def _marker_prefix_length(text: str) -> int:
    """How many trailing characters of text could start PTY_READY."""
    return next((k for k in range(min(len(text), len(PTY_READY) - 1), 0, -1) if text.endswith(PTY_READY[:k])), 0)


class _GatedStdin:
    """This process's stdin as invoke's runner reads it: nothing until the environment values
    are sent (typed-ahead keys then follow them)."""

    def __init__(self, ready: threading.Event):
        self.ready = ready
        try:
            os.fstat(0)
            self.fd: int | None = 0
        except OSError:
            self.fd = None

    def fileno(self) -> int:
        assert self.fd is not None
        return self.fd

    def isatty(self) -> bool:
        return self.fd is not None and os.isatty(self.fd)

    def read(self, n: int) -> bytes | None:
        if not self.ready.is_set():
            return None
        return os.read(self.fileno(), max(n, 1))


class _BinaryOut:
    """The runner's text (one character per byte) back to bytes on our stdout."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        self.stream.write(text.encode(BYTES))

    def flush(self) -> None:
        self.stream.flush()


class _raw_terminal:
    """Raw mode on fd while the session runs, when fd is this process's terminal. TCSADRAIN, not
    tty.setraw's default TCSAFLUSH: keys typed before the session started are kept."""

    def __init__(self, fd: int | None):
        self.fd = fd if fd is not None and os.isatty(fd) else None
        self.saved = None

    def __enter__(self) -> None:
        if self.fd is not None:
            import termios
            import tty

            self.saved = termios.tcgetattr(self.fd)
            tty.setraw(self.fd, termios.TCSADRAIN)

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            import termios

            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)

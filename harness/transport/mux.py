"""A minimal client for OpenSSH's ControlMaster socket (PROTOCOL.mux, version 4).

Why: the warm `harness exec` path runs a command over an already-open master connection. Asking
the master directly from Python saves spawning an `ssh` mux client per command (~0.1 s of its
start-up here), which is what brings `harness exec` close to bare `ssh` (bench/exec_latency.py).
We pass our own stdin/stdout/stderr file descriptors, so output streams straight from the master
to our stdout with no copying, exactly like `ssh -S socket host cmd`.

Any protocol surprise raises MuxError and the caller falls back to the `ssh` binary.
"""

from __future__ import annotations

import socket
import struct

MUX_MSG_HELLO = 0x00000001
MUX_C_NEW_SESSION = 0x10000002
MUX_S_PERMISSION_DENIED = 0x80000002
MUX_S_FAILURE = 0x80000003
MUX_S_EXIT_MESSAGE = 0x80000004
MUX_S_SESSION_OPENED = 0x80000006
MUX_S_TTY_ALLOC_FAIL = 0x80000008
PROTOCOL_VERSION = 4
NO_ESCAPE_CHAR = 0xFFFFFFFF


class MuxError(Exception):
    """The master refused, went away before the session started, or spoke an unexpected dialect."""


class NoMaster(MuxError):
    """Nothing listens on the control socket (never started, or its master exited)."""


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _send(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(struct.pack(">I", len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


def _recv(sock: socket.socket) -> tuple[int, bytes]:
    (length,) = struct.unpack(">I", _recv_exact(sock, 4))
    payload = _recv_exact(sock, length)
    (kind,) = struct.unpack(">I", payload[:4])
    return kind, payload[4:]


def _reason(body: bytes) -> str:
    try:
        (n,) = struct.unpack(">I", body[4:8])
        return body[8 : 8 + n].decode("utf-8", "replace")
    except struct.error:
        return "no reason given"


def run_session(control_path: str, command: str, stdin_fd: int, stdout_fd: int, stderr_fd: int) -> int:
    """Run `command` (a remote shell command line) through the master; return its exit code.

    Raises MuxError if the session could not be started (nothing has run remotely then).
    If the master disappears after the session started, returns 255 like ssh(1).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.connect(control_path)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            raise NoMaster(str(e)) from None
        try:
            kind, body = _recv(sock)
            if kind != MUX_MSG_HELLO or struct.unpack(">I", body[:4])[0] != PROTOCOL_VERSION:
                raise MuxError(f"unexpected mux hello (type {kind:#x})")
            _send(sock, struct.pack(">II", MUX_MSG_HELLO, PROTOCOL_VERSION))
            request = (
                struct.pack(">II", MUX_C_NEW_SESSION, 1)
                + _string(b"")  # reserved
                + struct.pack(">IIII", 0, 0, 0, 0)  # want tty, X11, agent, subsystem (u32 on the wire)
                + struct.pack(">I", NO_ESCAPE_CHAR)
                + _string(b"dumb")
                + _string(command.encode("utf-8", "surrogateescape"))
            )
            _send(sock, request)
            for fd in (stdin_fd, stdout_fd, stderr_fd):
                socket.send_fds(sock, [b"\0"], [fd])
            kind, body = _recv(sock)
        except (OSError, EOFError, struct.error) as e:
            raise MuxError(f"control socket: {e or type(e).__name__}") from None
        if kind in (MUX_S_PERMISSION_DENIED, MUX_S_FAILURE):
            raise MuxError(f"master refused the session: {_reason(body)}")
        if kind != MUX_S_SESSION_OPENED:
            raise MuxError(f"unexpected mux reply (type {kind:#x})")
        while True:
            try:
                kind, body = _recv(sock)
            except (OSError, EOFError, struct.error):
                return 255  # the master went away without an exit status, as ssh reports it
            if kind == MUX_S_EXIT_MESSAGE:
                return struct.unpack(">II", body[:8])[1]
            # MUX_S_TTY_ALLOC_FAIL and anything else: keep waiting for the exit message
    finally:
        sock.close()

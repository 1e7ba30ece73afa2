"""A network of its own for a server we start: `python private_network.py -- ARGV...` runs ARGV in
new user and network namespaces whose one interface is an up loopback (`--check`: only says whether
this box allows it).

Why (docs/security.md): vLLM's workers listen on TCP with no authentication (torch's store, gloo's
pairs: about 14 on the CPU build at tensor parallel 1; NCCL's bootstrap on GPUs), and neither gloo
nor NCCL's bootstrap has another transport. In a network namespace of its own nothing else on the
box reaches them; the server's API is on a unix socket, a path in the file system, which network
namespaces do not separate.

Standard library only (ctypes for unshare(2)): it runs before the server's interpreter, and on any
python. The process maps only its own uid and gid, so files it writes are the stage's as before.
Unprivileged user namespaces can be off (a sysctl, Ubuntu's AppArmor restriction, Docker's default
seccomp profile): unavailable() says why, and the caller runs the server in the stage's network.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import socket
import struct
import subprocess
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCSIFFLAGS = 0x8914
IFF_UP, IFF_LOOPBACK = 0x1, 0x8


def enter() -> None:
    """This (single-threaded) process into new user and network namespaces, the loopback up.
    OSError when the box does not allow it."""
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unshare(CLONE_NEWUSER|CLONE_NEWNET): {os.strerror(code)}")
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    # a new namespace's loopback is down; up before exec, while this process holds the namespace's capabilities
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", IFF_UP | IFF_LOOPBACK))


@functools.cache
def unavailable() -> str | None:
    """Why a server cannot have a network of its own on this box (one line), None when it can.
    Asked of a child process: unshare(2) of a user namespace refuses a multi-threaded caller."""
    try:
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--check"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if done.returncode == 0 else (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def wrap(argv: list[str]) -> list[str]:
    """ARGV, run in a network of its own."""
    return [sys.executable, os.path.abspath(__file__), "--", *argv]


def main(args: list[str]) -> int:
    check = args == ["--check"]
    if not check and (args[:1] != ["--"] or len(args) < 2):
        print("usage: private_network.py --check | -- ARGV...", file=sys.stderr)
        return 2
    try:
        enter()
    except OSError as e:
        print(f"no network namespace of its own: {e.strerror or e}", file=sys.stderr)
        return 1
    if check:
        return 0
    try:
        os.execvp(args[1], args[1:])
    except OSError as e:
        print(f"cannot start {args[1]}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

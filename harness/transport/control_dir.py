"""Where the ssh control sockets live, with the warm exec's recipes and harness's `ssh -F` files:
one short directory private to this user (unix socket paths are limited to ~104 bytes). Standard
library only: the warm exec's fast path reads it before anything else is imported."""

from __future__ import annotations

import os
import stat


SHARED = "/tmp/harness-ssh-{uid}"  # a name any local user could make first: checked, never trusted


def candidates() -> list[str]:
    """Where it may be, in order: $HARNESS_CONTROL_DIR (then the only one); the session's own
    runtime directory; /tmp/harness-ssh-UID; ~/.cache/harness/ssh. Another local user can make
    the /tmp name first: it is then passed over, never trusted (and never a reason to stop)."""
    if os.environ.get("HARNESS_CONTROL_DIR"):
        return [os.environ["HARNESS_CONTROL_DIR"]]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    found = [os.path.join(runtime, "harness-ssh")] if runtime and _private(runtime) else []
    return [*found, SHARED.format(uid=os.getuid()), os.path.join(os.path.expanduser("~"), ".cache", "harness", "ssh")]


def _private(directory: str) -> bool:
    try:
        return is_private(os.lstat(directory))
    except OSError:
        return False


def path() -> str:
    """The first candidate that is private to this user or not there yet (ensure() makes it)."""
    options = candidates()
    for directory in options:
        if _private(directory) or not os.path.lexists(directory):
            return directory
    return options[-1]


def is_private(st: os.stat_result) -> bool:
    """A directory owned by this user that no one else may enter (mode 0700)."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def ensure() -> str:
    """The directory, made 0700 if missing; a TransportError where none can be private to us."""
    for directory in candidates():
        try:
            if not os.path.lexists(directory):
                os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
                os.mkdir(directory, 0o700)
        except FileExistsError:
            pass  # made meanwhile: checked next
        except OSError:
            continue
        if _private(directory):
            return directory
    from harness.errors import TransportError

    raise TransportError(f"{path()} must be a directory owned by you with mode 0700 (it holds ssh control sockets)",
                         "set HARNESS_CONTROL_DIR to a directory of yours")

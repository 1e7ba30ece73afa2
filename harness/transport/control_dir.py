"""Where the ssh control sockets live, with the warm exec's recipes and harness's `ssh -F` files:
one short directory private to this user (unix socket paths are limited to ~104 bytes). Standard
library only: the warm exec's fast path reads it before anything else is imported."""

from __future__ import annotations

import os
import stat


def path() -> str:
    return os.environ.get("HARNESS_CONTROL_DIR") or f"/tmp/harness-ssh-{os.getuid()}"


def is_private(st: os.stat_result) -> bool:
    """A directory owned by this user that no one else may enter (mode 0700)."""
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def ensure() -> str:
    """The directory, made 0700 if missing; a TransportError where it is not private to us."""
    directory = path()
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    if not is_private(os.lstat(directory)):
        from harness.errors import TransportError

        raise TransportError(f"{directory} must be a directory owned by you with mode 0700 (it holds ssh control sockets)")
    return directory

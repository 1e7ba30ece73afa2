"""The laptop's side of a pull as a place to write: LOCAL_DIR's disk, its room and its faults.

A local write that fails (a full disk, a file-size limit, a read-only or unwritable LOCAL_DIR,
LOCAL_DIR a file) is no link fault: retrying cannot help, so it ends the pull at once as one
LocalDiskError line naming the place and what to do; the pieces already written stay for the
same pull to resume, and part files with nothing in them are removed."""

from __future__ import annotations

import errno
import os
import resource
from pathlib import Path

from harness.errors import HarnessError
from harness.units import human_bytes

FULL = (errno.ENOSPC, errno.EDQUOT)
NOT_WRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


class LocalDiskError(HarnessError):
    """A write into LOCAL_DIR failed for a reason on this machine (exit 1, one line)."""


class LocalWriteFailed(Exception):
    """A stream's write into a part file failed (not an OSError: a stream takes those for a
    dropped link and reconnects)."""

    def __init__(self, error: OSError, path: Path):
        super().__init__(str(error))
        self.error, self.path = error, path


def mount_point(path: Path) -> str:
    """The mount point of the file system holding path (or its nearest existing parent)."""
    p = os.path.realpath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    while not os.path.ismount(p):
        p = os.path.dirname(p)
    return p


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on path's file system (its nearest existing
    parent's)."""
    p = os.path.realpath(path)
    while not os.path.exists(p):
        p = os.path.dirname(p)
    st = os.statvfs(p)
    return st.f_bavail * st.f_frsize




def disk_full(local_root: Path, needed: int) -> LocalDiskError:
    return LocalDiskError(
        f"local disk full: {mount_point(local_root)} has {human_bytes(free_bytes(local_root))} free and the pull needs "
        f"{human_bytes(needed)} more for {local_root}; free space there (or choose another LOCAL_DIR) and run the same pull again to resume"
    )


def local_failure(error: OSError, local_root: Path, needed: int, path: Path | str | None = None) -> LocalDiskError:
    """The one line for a failed write under local_root (`needed`: the bytes still to come)."""
    where = path or error.filename or local_root
    if error.errno in FULL:
        return disk_full(local_root, needed)
    if error.errno == errno.EFBIG:
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        limit = "unlimited" if soft == resource.RLIM_INFINITY else human_bytes(soft)
        return LocalDiskError(
            f"{where}: larger than this process may write (file size limit `ulimit -f`: {limit}, or the file system's); "
            "raise the limit (or choose another LOCAL_DIR) and run the same pull again to resume"
        )
    if error.errno in NOT_WRITABLE:
        return LocalDiskError(f"LOCAL_DIR {local_root} is not writable ({where}: {error.strerror}); choose another LOCAL_DIR or make it writable")
    if error.errno in (errno.EEXIST, errno.ENOTDIR) and _a_file_on_the_way(local_root):
        return LocalDiskError(f"LOCAL_DIR {local_root} is a file, not a directory (or lies under one); choose another LOCAL_DIR")
    return LocalDiskError(f"cannot write {where}: {error.strerror or error}")


def _a_file_on_the_way(local_root: Path) -> bool:
    p = Path(local_root)
    for q in (p, *p.parents):
        if q.exists():
            return not q.is_dir()
    return False


def check_room(local_root: Path, needed: int) -> None:
    """Refuse, before a byte is written, a pull that cannot fit in what is free."""
    if needed > free_bytes(local_root):
        raise disk_full(local_root, needed)

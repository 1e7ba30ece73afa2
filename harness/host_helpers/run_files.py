"""A run's files on the host: where each lives, how a state file is written, the run's lock.
A companion of supervisor.py (harness/host_helpers/__init__.py, COMPANIONS); standard library only.

    <workdir>/runs/<run_id>/run.json         the run's record (the plan; versions and artifacts added)
                            state.json       the run's state (LIVE_RUN, then FINAL_RUN), its pid
                            supervisor.lock  flock, held by the run's supervisor while it lives
                            supervisor.log   the supervisor's own lines
                            cancel           made by a cancel: the supervisor stops the run
                            cancelling       made by a group's cancel, before any node is stopped
                            <stage>/         spec.json, log, events.jsonl, state.json (FINAL_STAGE)

Every state file is written atomically (temporary name, then rename), so a reader never sees half
a JSON document. A pid in a state file is no proof that the process is the run's: the lock is
(lock_is_held), and a stage's process group is checked by its leader's identity (process_groups.py).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import time

FINAL_STAGE = {"ok", "failed", "cancelled", "skipped"}
FINAL_RUN = {"ok", "failed", "cancelled", "lost"}
LIVE_RUN = {"queued", "running"}  # a supervisor owns the run: "lost" once its lock is free
POLL_S = 0.2  # how often a waiter reads a run's files (or a process's state) again


def read_json(path: str, default=None):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, json.JSONDecodeError):
        return default


def write_json(path: str, data) -> None:
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT) or not os.path.exists(path):
            raise
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        # a full disk: over the file's own blocks (a state file fits in its first), so the run's
        # outcome is still recorded; a reader may see it half written for that moment
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, text.encode())
            os.ftruncate(fd, len(text.encode()))
        finally:
            os.close(fd)


def update_json(path: str, **fields) -> dict:
    data = read_json(path, {}) or {}
    data.update(fields)
    write_json(path, data)
    return data


def now() -> float:
    return round(time.time(), 3)


def stage_dir(run_dir: str, stage: str) -> str:
    return os.path.join(run_dir, stage)


def workdir_of(run_dir: str) -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))  # <workdir>/runs/<run_id>


def lock_is_held(run_dir: str) -> bool:
    """True while a live supervisor holds the run's lock."""
    path = os.path.join(run_dir, "supervisor.lock")
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False

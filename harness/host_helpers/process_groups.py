"""A stage's process group: proving it is still the one the stage started, and stopping it.
A companion of supervisor.py (harness/host_helpers/__init__.py, COMPANIONS); standard library only.

A pid (and so a pgid) is reused, at once after a reboot: a stage's group is signalled only while
it is provably the one the stage started. Its leader's identity is recorded at the start.
"""

from __future__ import annotations

import os
import signal
import time

if globals().get("__package__"):  # imported as harness.host_helpers.process_groups (tests)
    from harness.host_helpers import run_files
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import run_files


def process_identity(pid: int) -> dict | None:
    """{"boot_id", "start_time"} of a live process (start_time: /proc/PID/stat field 22, clock
    ticks after boot), None when there is none."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot_id = f.read().strip()
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name (it may hold spaces and parentheses): field 3 on
    return {"boot_id": boot_id, "start_time": int(fields[19])}


def group_is_ours(stage_state: dict) -> bool:
    """The recorded leader still leads the group. A leader gone (its group may live on, or the id
    may be a stranger's by now) or a record without its identity proves nothing."""
    leader = stage_state.get("leader")
    return bool(leader) and process_identity(int(stage_state["pgid"])) == leader


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def terminate_group(pgid: int, grace: float, exited) -> None:
    """SIGTERM the process group, wait up to `grace` seconds, then SIGKILL it."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if exited() is not None:
            break
        time.sleep(run_files.POLL_S)
    try:
        os.killpg(pgid, signal.SIGKILL)  # also any children left behind by the leader
    except ProcessLookupError:
        pass

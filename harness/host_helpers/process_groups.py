"""A stage run as a process group of its own: started with its leader's identity recorded, proven
still the one the stage started before it is signalled, stopped. A companion of supervisor.py
(harness/host_helpers/__init__.py, COMPANIONS); standard library only.

A pid (and so a pgid) is reused, at once after a reboot: a stage's group is signalled only while
it is provably the one the stage started. Its leader's identity is recorded at the start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

if globals().get("__package__"):  # imported as harness.host_helpers.process_groups (tests)
    from harness.host_helpers import run_files
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import run_files


def run_stage(spec: dict, cwd: str | None, log_file, state_path: str, lock_fd: int | None, grace: float, cancel_pending) -> tuple[int, bool]:
    """Run a stage's process (spec "argv") as the leader of a process group of its own, its output to
    log_file, its leader's identity recorded; on cancel_pending(), terminate_group. (exit code, cancelled)."""
    env = {**spec.get("env_defaults", {}), **os.environ, "PYTHONUNBUFFERED": "1", **spec.get("env_extra", {})}
    try:
        # The stage holds its artifact's lock too: should the supervisor die, the orphan still does.
        proc = subprocess.Popen(
            spec["argv"], cwd=cwd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, pass_fds=() if lock_fd is None else (lock_fd,)
        )
    except OSError as e:
        log_file.write(f"harness: cannot start {spec['argv'][0]}: {e}\n".encode())
        return 127, False
    run_files.update_json(state_path, pid=proc.pid, pgid=proc.pid, leader=process_identity(proc.pid))
    cancelled = False
    while proc.poll() is None:
        if cancel_pending() and not cancelled:
            cancelled = True
            terminate_group(proc.pid, grace, proc.poll)
        time.sleep(run_files.POLL_S)
    return proc.returncode, cancelled


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

"""The `cancel` and `cancelling` requests: ask the run's supervisor to stop (SIGTERM, after the run's
`cancel` file); where no supervisor lives, stop what is left by hand, never a process group that
is not provably the stage's. A companion of supervisor.py (harness/host_helpers/__init__.py,
COMPANIONS); standard library only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

if globals().get("__package__"):  # imported as harness.host_helpers.cancel (tests)
    from harness.host_helpers import process_groups, run_files
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import process_groups
    import run_files


def cmd_cancelling(run_dir: str) -> int:
    """Mark the run as being cancelled, stopping nothing yet; print its state."""
    run_dir = os.path.abspath(run_dir)
    if not run_files.read_json(os.path.join(run_dir, "run.json")):
        print(f"{run_dir}: no such run", file=sys.stderr)
        return 2
    open(os.path.join(run_dir, "cancelling"), "w").close()
    print(run_files.read_json(os.path.join(run_dir, "state.json"), {}).get("state"))
    return 0


def cmd_cancel(run_dir: str, grace: float | None) -> int:
    """Ask the supervisor to cancel; if it is gone, stop what is left ourselves."""
    run_dir = os.path.abspath(run_dir)
    record = run_files.read_json(os.path.join(run_dir, "run.json"))
    if not record:
        print(f"{run_dir}: no such run", file=sys.stderr)
        return 2
    state_path = os.path.join(run_dir, "state.json")
    state = run_files.read_json(state_path, {})
    if state.get("state") in run_files.FINAL_RUN:
        print(f"already {state['state']}")  # it had ended: nothing was stopped
        return 0
    open(os.path.join(run_dir, "cancel"), "w").close()
    grace = float(record.get("grace_s", 10)) if grace is None else grace
    if run_files.lock_is_held(run_dir) and state.get("pid"):
        try:
            os.kill(int(state["pid"]), signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace + 30
        while time.monotonic() < deadline and run_files.lock_is_held(run_dir):
            time.sleep(run_files.POLL_S)
    if run_files.lock_is_held(run_dir):
        print(f"{run_dir}: supervisor did not stop", file=sys.stderr)
        return 1
    # No live supervisor (it died or never started): finish the job by hand.
    for stage in record["stages"]:
        sp = os.path.join(run_files.stage_dir(run_dir, stage), "state.json")
        st = run_files.read_json(sp, {})
        if st.get("state") in run_files.FINAL_STAGE:
            continue
        if st.get("state") == "running":
            if st.get("container"):
                subprocess.run(["docker", "stop", "-t", str(int(grace)), st["container"]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                subprocess.run(["docker", "rm", "-f", st["container"]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            elif st.get("pgid"):
                if not process_groups.group_is_ours(st):
                    print(f"{run_dir}: stage {stage}'s process group {st['pgid']} is no longer this run's "
                          "(the host rebooted, or the id was reused): the run is lost, nothing signalled", file=sys.stderr)
                    run_files.update_json(state_path, state="lost", finished=run_files.now())
                    print("lost")
                    return 0
                process_groups.terminate_group(int(st["pgid"]), grace, lambda: None if process_groups.group_alive(int(st["pgid"])) else 0)
        run_files.update_json(sp, state="cancelled", finished=run_files.now())
    state = run_files.read_json(state_path, {})
    if state.get("state") not in run_files.FINAL_RUN:
        run_files.update_json(state_path, state="cancelled", finished=run_files.now())
    print(run_files.read_json(state_path, {}).get("state"))
    return 0

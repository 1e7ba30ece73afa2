"""The `launch` request: a run's plan written (its stages' spec.json, run.json) and its supervisor
started detached from the SSH link (double fork, a session of its own, stdout and stderr to
supervisor.log, the run's lock held until it exits). A companion of supervisor.py
(harness/host_helpers/__init__.py, COMPANIONS); standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time

if globals().get("__package__"):  # imported as harness.host_helpers.launch (tests)
    from harness.host_helpers import run_files, status, supervise
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import run_files
    import status
    import supervise


def cmd_launch(request: dict, home: str) -> int:
    """A run's whole start in one request: write its plan (every stage's spec.json, run.json
    with the digest of the code last synced), start it, and answer with its status (queued or
    running, the queue place) and the home directory `~` stood for."""
    run_dir = request["run_dir"]
    for need in request.get("requires") or []:  # what the stages need, before anything is written
        if not os.path.exists(os.path.expanduser(need["path"])):
            print(need["message"], file=sys.stderr)
            return 3
    if run_files.read_json(os.path.join(run_dir, "run.json")):
        print(f"{run_dir}: a run with this id exists", file=sys.stderr)
        return 2
    for stage, spec in request["specs"].items():
        os.makedirs(run_files.stage_dir(run_dir, stage), exist_ok=True)
        run_files.write_json(os.path.join(run_files.stage_dir(run_dir, stage), "spec.json"), spec)
    record = request["record"]
    manifest = run_files.read_json(request["manifest"]) if request.get("manifest") else None
    record["manifest_hash"] = manifest.get("digest") if isinstance(manifest, dict) else None
    run_files.write_json(os.path.join(run_dir, "run.json"), record)
    code = cmd_start(run_dir, request.get("env") or {}, request.get("versions_probe"))
    if code != 0:
        return code
    json.dump({"home": home, "status": status.run_summary(run_dir)}, sys.stdout)
    sys.stdout.write("\n")
    return 0


def cmd_start(run_dir: str, env: dict, versions_probe: dict | None) -> int:
    """Detach (double fork, new session) with the secrets `env`; print the supervisor's pid."""
    run_dir = os.path.abspath(run_dir)
    if run_files.read_json(os.path.join(run_dir, "state.json")):
        print(f"{run_dir}: already started", file=sys.stderr)
        return 2
    first = os.fork()
    if first == 0:
        os.setsid()  # no controlling terminal, no SIGHUP when the SSH session ends
        if os.fork() != 0:
            os._exit(0)
        _become_daemon(run_dir, env, versions_probe)  # never returns
    os.waitpid(first, 0)
    # Wait until the daemon holds the lock, so "started" means started.
    state_path = os.path.join(run_dir, "state.json")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        state = run_files.read_json(state_path)
        if state and state.get("pid"):
            return 0
        time.sleep(0.05)
    print(f"{run_dir}: supervisor did not start (see supervisor.log)", file=sys.stderr)
    return 1


def _become_daemon(run_dir: str, env: dict, versions_probe: dict | None) -> None:
    code = 1
    try:
        os.chdir(run_dir)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        logfd = os.open(os.path.join(run_dir, "supervisor.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        # stdout/stderr leave the SSH channel: the channel closes and the link may drop freely
        os.dup2(logfd, 1)
        os.dup2(logfd, 2)
        os.environ.update(env)
        lock_fd = os.open(os.path.join(run_dir, "supervisor.lock"), os.O_WRONLY | os.O_CREAT, 0o600)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # held until this process exits
        supervise.log(f"started pid {os.getpid()}")
        code = supervise.Supervisor(run_dir, versions_probe).run()
        supervise.log("finished")
    except BaseException as e:  # noqa: BLE001 - record why, then exit
        supervise.log(f"crashed: {e!r}")
        run_files.update_json(os.path.join(run_dir, "state.json"), state="failed", error=repr(e), finished=run_files.now())
    finally:
        sys.stdout.flush()
        os._exit(code)

#!/usr/bin/env python3
"""The run supervisor: runs a chain of stages ON THE HOST, detached from the SSH link.

Sent by harness with every call (harness/helpers.py: its source on stdin ahead of one JSON
request line, run by `python -S -c BOOT`) and run with the host's python3. Standard library only:
it must work on a bare GPU box, outside any container.

Everything about a run lives in files under <workdir>/runs/<run_id>/ (run_files.py), so any laptop
can come back later and nothing depends on the connection that started it. Secret env values
arrive on stdin and are never written. This file reads one request and hands it to the module of
its concept, each shipped ahead of it (harness/host_helpers/__init__.py, COMPANIONS):

    launch, a run's start       launch.py     (the detached supervisor itself: supervise.py, with
                                               run_queue.py, artifact_store.py, process_groups.py,
                                               stage_container.py, stage_events.py)
    cancel, cancelling          cancel.py
    status                      status.py
    follow (harness logs)       follow.py
    gc (harness rm, gc)         cleanup.py
    preflight (run --dry-run)   preflight.py

The files, stage specs and requests in detail: docs/architecture/jobs-and-runs.md, "The supervisor".
"""

from __future__ import annotations

import json
import os
import sys

if globals().get("__package__"):  # imported as harness.host_helpers.supervisor (tests)
    from harness.host_helpers import cancel, cleanup, follow, launch, preflight, status, wire
else:  # on the host: shipped with this helper (harness/host_helpers/__init__.py, WIRE and COMPANIONS)
    import cancel
    import cleanup
    import follow
    import launch
    import preflight
    import status
    import wire


def main() -> int:
    """One request, a JSON document on stdin (harness/helpers.py): {"cmd": ..., ...}. Paths may
    start with ~ (the workdir as configured)."""
    os.umask(0o077)  # what the supervisor and the stages it starts create is the user's alone
    text = sys.stdin.read()
    home = os.path.expanduser("~")
    if wire.HOME_TOKEN in text:  # `~` in a launch request
        text = text.replace(wire.HOME_TOKEN, json.dumps(home)[1:-1])
    text = text.replace(f'"--user", "{wire.USER_TOKEN}"', f'"--user", "{os.getuid()}:{os.getgid()}"')
    request = json.loads(text)
    for key in ("run_dir", "runs_dir", "manifest", "space"):
        if request.get(key):
            request[key] = os.path.expanduser(request[key])
    cmd = request["cmd"]
    if cmd == "launch":
        return launch.cmd_launch(request, home)
    if cmd == "cancel":
        return cancel.cmd_cancel(request["run_dir"], request.get("grace"))
    if cmd == "cancelling":
        return cancel.cmd_cancelling(request["run_dir"])
    if cmd == "status":
        return status.cmd_status(request["runs_dir"], request.get("run_id"))
    if cmd == "preflight":
        return preflight.cmd_preflight(list(request.get("requires") or []), request["space"], request.get("data"), request.get("verifier"))
    if cmd == "gc":
        return cleanup.cmd_gc(request["runs_dir"], list(request.get("stores") or []), list(request.get("remove") or []), bool(request.get("dry_run")))
    if cmd == "follow":
        try:
            return follow.cmd_follow(os.path.abspath(request["run_dir"]), request.get("stage"), bool(request.get("follow")), bool(request.get("json")),
                                     request.get("tail"))
        except BrokenPipeError:  # the reader went away (Ctrl-C on the laptop): nothing to clean up
            return 0
    print(f"supervisor: unknown command {cmd!r}", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())

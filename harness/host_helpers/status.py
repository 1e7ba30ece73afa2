"""The `status` request: a run's record, state and stages as the laptop shows them (a live state
whose supervisor's lock is free reads `lost`; a queued run gets its place). A companion of
supervisor.py (harness/host_helpers/__init__.py, COMPANIONS); standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import time

if globals().get("__package__"):  # imported as harness.host_helpers.status (tests)
    from harness.host_helpers import run_files, run_queue, stage_events, wire
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import run_files
    import run_queue
    import stage_events
    import wire


def cmd_status(runs_dir: str, run_id: str | None) -> int:
    if run_id:
        summary = run_summary(os.path.join(runs_dir, run_id))
        if summary is None:
            print(f"no run {run_id} in {runs_dir}", file=sys.stderr)
            return 2
        out = [summary]
    else:
        out = [s for s in (run_summary(os.path.join(runs_dir, n)) for n in wire.run_names(runs_dir)) if s]
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


def run_summary(run_dir: str) -> dict | None:
    record = run_files.read_json(os.path.join(run_dir, "run.json"))
    if not record:
        return None
    state = run_files.read_json(os.path.join(run_dir, "state.json"), {}) or {}
    if state.get("state") in run_files.LIVE_RUN and not run_files.lock_is_held(run_dir):
        state["state"] = "lost"  # the supervisor died without recording an outcome
    if state.get("state") == "queued":
        gpus = (record.get("queue") or {}).get("gpus", "all")
        state["queue"] = {"place": run_queue.RunQueue(run_files.workdir_of(run_dir)).place(os.path.abspath(run_dir), gpus, (record.get("queue") or {}).get("slot")), "gpus": gpus}
    stages = []
    for stage in record.get("stages", []):
        sd = run_files.stage_dir(run_dir, stage)
        st = run_files.read_json(os.path.join(sd, "state.json"), {}) or {}
        st.setdefault("state", "pending")
        st["stage"] = stage
        events = os.path.join(sd, "events.jsonl")
        # an ended stage shows how it ended: another rank's progress may have come after rank 0's
        # `finished`, and a launcher that failed after its trainer writes a second one (the last wins)
        ended = st["state"] in run_files.FINAL_STAGE and stage_events.last_event(events, stage_events.TAU_WINDOW, lambda ev: ev.get("event") == "finished")
        st["last_event"] = ended or stage_events.last_event(events)
        if st["state"] == "failed" and st.get("error") and not ended:  # a failure the stage could not report itself
            st["last_event"] = {"t": st.get("finished"), "stage": stage, "event": "finished", "status": "failed", "error": st["error"]}
        elif st["state"] == "running" and st.get("error"):  # what the supervisor knows of it now (its engine is away)
            st["last_event"] = {"t": time.time(), "stage": stage, "event": "warning", "text": st["error"]}
        if state.get("state") in run_files.FINAL_RUN and st["state"] == "running":  # nobody supervises it now
            st["state"] = "lost"
        tau = stage_events.latest_tau(os.path.join(sd, "events.jsonl"))
        if tau is not None:  # the draft's estimated acceptance while it trains (status shows it beside the last event)
            st["tau"] = tau
        stages.append(st)
    return {"run_id": record.get("run_id"), "record": record, "state": state, "stages": stages}

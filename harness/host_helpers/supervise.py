"""The supervisor proper: the detached process that runs one run's chain of stages. It waits its
turn in the queue (run_queue.py), runs each stage as a process group (process_groups.py) or a
container (stage_container.py) with its output to the stage's log, reuses or makes a keyed stage's
artifact under the artifact's lock (artifact_store.py), records every state (run_files.py), and
acts on a cancel (SIGTERM, or the run's `cancel` file) between its polls. A companion of
supervisor.py (harness/host_helpers/__init__.py, COMPANIONS); standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

if globals().get("__package__"):  # imported as harness.host_helpers.supervise (tests)
    from harness.host_helpers import artifact_store, process_groups, run_files, run_queue, stage_container, stage_events
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import artifact_store
    import process_groups
    import run_files
    import run_queue
    import stage_container
    import stage_events


ARTIFACT_TOKEN = "@artifact:{}@"  # in a stage's command line: that stage's artifact (harness/artifacts.py)
QUEUE_POLL_S = 1.0  # how often a run waiting for its turn, or for another run's artifact, looks again


class Supervisor:
    def __init__(self, run_dir: str, versions_probe: dict | None = None):
        self.run_dir = run_dir
        self.versions_probe = versions_probe  # {"argv", "stdin"}: the launch request's
        self.record = run_files.read_json(os.path.join(run_dir, "run.json"))
        if not self.record:
            raise SystemExit(f"{run_dir}: no run.json")
        self.stages: list[str] = self.record["stages"]
        self.grace = float(self.record.get("grace_s", 10))
        self.cancel_requested = False
        self.keys: artifact_store.Keys | None = None  # runs recorded before the store have no recipes

    # -- signals: the handler only sets a flag; the loop acts on it ------------------------------

    def _on_term(self, signum, frame) -> None:
        self.cancel_requested = True

    def _cancel_pending(self) -> bool:
        if not self.cancel_requested and os.path.exists(os.path.join(self.run_dir, "cancel")):
            self.cancel_requested = True
        return self.cancel_requested

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_term)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # belt and braces: we are in our own session
        state_path = os.path.join(self.run_dir, "state.json")
        queue = run_queue.RunQueue(run_files.workdir_of(self.run_dir))
        try:
            if not self._wait_in_queue(queue, state_path):
                for stage in self.stages:
                    run_files.update_json(os.path.join(run_files.stage_dir(self.run_dir, stage), "state.json"), state="cancelled", finished=run_files.now())
                run_files.update_json(state_path, state="cancelled", finished=run_files.now())
                return 0
            return self._run_chain(state_path)
        finally:
            queue.leave()

    def _wait_in_queue(self, queue: run_queue.RunQueue, state_path: str) -> bool:
        """Queued until no earlier or running run holds our GPUs (record["queue"]; a record
        without it, or with wait false, starts at once). False: cancelled while queued."""
        spec = self.record.get("queue") or {}
        gpus, wait, slot = spec.get("gpus", "all"), bool(spec.get("wait", False)), spec.get("slot")
        started = queue.enter(self.run_dir, self.record["run_id"], gpus, wait, state_path, slot)
        if not started:
            log(f"queued behind runs on GPUs {gpus}")
        while not started:
            if self._cancel_pending():
                return False
            time.sleep(QUEUE_POLL_S)
            started = queue.try_start(self.run_dir, gpus, state_path, slot)
        return not self._cancel_pending()

    def _run_chain(self, state_path: str) -> int:
        run_files.update_json(state_path, state="running", started=run_files.now(), pid=os.getpid())
        self._probe_versions()
        if self.record.get("recipes"):
            self.keys = artifact_store.Keys(self.record.get("workdir") or run_files.workdir_of(self.run_dir), self.record)
        outcome = "ok"
        for i, stage in enumerate(self.stages):
            sd = run_files.stage_dir(self.run_dir, stage)
            if self._cancel_pending():
                run_files.update_json(os.path.join(sd, "state.json"), state="cancelled", finished=run_files.now())
                outcome = "cancelled"
                continue
            run_files.update_json(state_path, current_stage=stage)
            state = self._run_stage(stage)
            if state == "cancelled":
                outcome = "cancelled"
            elif state != "ok":
                outcome = "failed"
                for rest in self.stages[i + 1 :]:  # a failed stage stops the chain
                    run_files.update_json(os.path.join(run_files.stage_dir(self.run_dir, rest), "state.json"), state="skipped")
                break
        run_files.update_json(state_path, state=outcome, finished=run_files.now(), current_stage=None)
        return 0

    def _probe_versions(self) -> None:
        """Library versions as the stages see them, added to the run record (null when absent)."""
        probe = self.versions_probe
        if not probe:
            return
        versions = None
        try:
            out = subprocess.run(probe["argv"], input=probe["stdin"].encode(), cwd=self.record.get("workdir"), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, timeout=120)
            if out.returncode == 0:
                versions = json.loads(out.stdout.decode().strip().splitlines()[-1])
            else:
                log(f"version probe failed ({out.returncode}): {out.stderr.decode(errors='replace')[-500:]}")
        except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
            log(f"version probe failed: {e}")
        run_json = os.path.join(self.run_dir, "run.json")
        run_files.update_json(run_json, versions=versions)
        self.record["versions"] = versions  # the environment's identity in every key of the run

    def _run_stage(self, stage: str) -> str:
        sd = run_files.stage_dir(self.run_dir, stage)
        spec = run_files.read_json(os.path.join(sd, "spec.json"))
        state_path = os.path.join(sd, "state.json")
        log_path = os.path.join(sd, "log")
        run_files.update_json(state_path, state="running", started=run_files.now())
        lock_fd = None
        try:
            with open(log_path, "ab", buffering=0) as log_file:
                if self.keys is not None and self.keys.keyed(stage):
                    try:
                        claim = self._claim(stage, log_file, state_path)
                    except (OSError, ValueError, SyntaxError) as e:  # an input or script it cannot read
                        problem = f"cannot key {stage}'s artifact: {e}"
                        log_file.write(f"harness: {problem}\n".encode())
                        return self._stage_ended(state_path, "failed", error=problem)
                    if claim != "make":
                        return claim
                    lock_fd = self.lock_fd
                    spec = {**spec, "argv": self._with_artifacts(stage, spec["argv"])}
                if spec["kind"] == "docker":
                    code, cancelled = stage_container.run_stage(spec, log_file, state_path, lock_fd, self.grace, self._cancel_pending)
                else:
                    code, cancelled = process_groups.run_stage(spec, self.record.get("workdir"), log_file, state_path, lock_fd, self.grace,
                                                               self._cancel_pending)
            # A node of a group whose peers were cancelled first dies of their cancel (its collectives
            # break) before its own arrives: the group's cancel marked every node first (cancel.py, cmd_cancelling).
            if code != 0 and os.path.exists(os.path.join(self.run_dir, "cancelling")):
                cancelled = self.cancel_requested = True  # and the stages after it
            state = "cancelled" if cancelled else ("ok" if code == 0 else "failed")
            if state == "ok" and lock_fd is not None:
                self._complete(stage)  # under the lock still: a waiting run then finds it complete
            run_files.update_json(state_path, state=state, exit_code=code, finished=run_files.now())
            return state
        finally:
            if lock_fd is not None:
                os.close(lock_fd)

    # -- artifacts: a keyed stage's output reused when its key matches, else made under its lock --

    def _claim(self, stage: str, log_file, state_path: str) -> str:
        """Before a keyed stage runs: "make" (its artifact's lock is ours: self.lock_fd), or the
        stage's state when it ends here: "ok" (reused), "failed" (an input it reads was never
        made), "cancelled" (while waiting for another run's lock)."""
        keys, run_id = self.keys, self.record["run_id"]
        key = keys.key(stage)
        run_files.update_json(state_path, artifact=key)
        problem = self._check_reads(stage, log_file)
        if problem is not None:
            if problem == "cancelled":
                return self._stage_ended(state_path, "cancelled")
            log_file.write(f"harness: {problem}\n".encode())
            return self._stage_ended(state_path, "failed", error=problem)
        always_run = bool(keys.recipes[stage].get("always_run"))  # a group's distributed stage: resumes into it
        waiting = False
        while True:
            record = None if always_run else keys.store.record(stage, key)
            if record is None:
                fd = keys.store.lock(stage, key, run_id)
                if fd is not None:
                    record = None if always_run else keys.store.record(stage, key)  # made while we took the lock
                    if record is None:
                        self.lock_fd = fd
                        self._note_artifact(stage, "made", None)
                        return "make"
                    os.close(fd)
            if record is not None:
                return self._reuse(stage, record, log_file, state_path)
            if not waiting:
                waiting = True
                holder = keys.store.holder(stage, key)
                log_file.write(f"{stage}: waiting for {holder}, which is making this artifact from the same inputs\n".encode())
            if self._cancel_pending():
                return self._stage_ended(state_path, "cancelled")
            time.sleep(QUEUE_POLL_S)

    def _check_reads(self, stage: str, log_file) -> str | None:
        """Each artifact the stage reads is complete, made earlier in this run or by another
        (one being made by another run is waited for). None, "cancelled", or the line that says
        which is missing and how to make it."""
        keys = self.keys
        recipe = keys.recipes[stage]
        for flag, upstream in sorted(recipe.get("reads", {}).items()):
            key = keys.key(upstream)
            announced = False
            while keys.store.record(upstream, key) is None:
                fd = keys.store.lock(upstream, key, self.record["run_id"])
                if fd is not None:  # nobody is making it
                    os.close(fd)
                    if keys.store.record(upstream, key) is not None:
                        break
                    if flag in recipe.get("optional", []):
                        break
                    host = self.record.get("host", "HOST")
                    return (f"{stage} reads {upstream}'s output made from these inputs (artifact {key}), which no run has made: "
                            f"run `harness run {host} {upstream} {stage}`")
                if not announced:
                    announced = True
                    log_file.write(f"{stage}: waiting for {keys.store.holder(upstream, key)}, which is making {upstream}'s artifact it reads\n".encode())
                if self._cancel_pending():
                    return "cancelled"
                time.sleep(QUEUE_POLL_S)
            record = keys.store.record(upstream, key)
            if record is not None and upstream not in self._recorded_artifacts():
                self._note_artifact(upstream, "read", record)
        return None

    def _with_artifacts(self, stage: str, argv: list) -> list:
        """The stage's command line with each artifact token (`@artifact:STAGE@`, harness/artifacts.py)
        made the artifact's path; an optional input that no run made is left out with its flag."""
        keys = self.keys
        recipe = keys.recipes[stage]
        paths = {stage: keys.path(stage)}
        absent = set()
        for flag, upstream in recipe.get("reads", {}).items():
            paths[upstream] = keys.path(upstream)
            if keys.store.record(upstream, keys.key(upstream)) is None:
                absent.add(ARTIFACT_TOKEN.format(upstream))
        out: list = []
        for arg in argv:
            if any(token in arg for token in absent):
                if out and out[-1].startswith("--"):
                    out.pop()
                continue
            for name, path in paths.items():
                arg = arg.replace(ARTIFACT_TOKEN.format(name), path)
            out.append(arg)
        return out

    def _reuse(self, stage: str, record: dict, log_file, state_path: str) -> str:
        """The stage's artifact is complete: this run takes it as it is, and says so."""
        made_by = record.get("made_by")
        log_file.write(f"{stage}: reused from run {made_by} (same inputs; --fresh {stage} to redo it)\n".encode())
        events = os.path.join(run_files.stage_dir(self.run_dir, stage), "events.jsonl")
        with open(events, "a", encoding="utf-8") as f:  # what the maker's stage reported: status shows its tau
            note = {"t": run_files.now(), "stage": stage, "event": "message", "text": f"reused from run {made_by} (same inputs)"}
            for event in [note, *(record.get("events") or [])]:
                f.write(json.dumps(event) + "\n")
        self._note_artifact(stage, "reused", record)
        return self._stage_ended(state_path, "ok", reused_from=made_by)

    def _complete(self, stage: str) -> None:
        """Record the stage's artifact as complete, with what made it and what its stage reported."""
        events = os.path.join(run_files.stage_dir(self.run_dir, stage), "events.jsonl")
        reported = [e for e in (stage_events.latest_tau_event(events), stage_events.last_event(events, stage_events.TAU_WINDOW, lambda ev: ev.get("event") == "finished")) if e]
        key = self.keys.key(stage)
        record = {"made_by": self.record["run_id"], "created": run_files.now(), "parts": self.keys.parts[stage], "events": reported}
        self.keys.store.complete(stage, key, record)
        self._note_artifact(stage, "made", record)

    def _recorded_artifacts(self) -> dict:
        return (run_files.read_json(os.path.join(self.run_dir, "run.json"), {}) or {}).get("artifacts") or {}

    def _note_artifact(self, stage: str, role: str, record: dict | None) -> None:
        """run.json's `artifacts`: each artifact the run made, reused or read, with its key and
        the parts that made the key (harness diff compares them)."""
        keys = self.keys
        key = keys.key(stage)
        entry = {"key": key, "path": keys.store.dir(stage, key), "role": role, "made_by": (record or {}).get("made_by"),
                 "parts": keys.parts[stage]}
        path = os.path.join(self.run_dir, "run.json")
        run_files.update_json(path, artifacts={**self._recorded_artifacts(), stage: entry})

    @staticmethod
    def _stage_ended(state_path: str, state: str, **fields) -> str:
        run_files.update_json(state_path, state=state, exit_code=0 if state == "ok" else None, finished=run_files.now(), **fields)
        return state


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} supervisor: {message}", file=sys.stderr, flush=True)

#!/usr/bin/env python3
"""The run supervisor: runs a chain of stages ON THE HOST, detached from the SSH link.

Sent by harness with every call (harness/helpers.py: its source on stdin ahead of one JSON
request line, run by `python -S -c BOOT`) and run with the host's python3. Standard library only:
it must work on a bare GPU box, outside any container.

Everything about a run lives in files under <workdir>/runs/<run_id>/ (run.json, state.json,
supervisor.lock, and per stage spec.json, log, events.jsonl, state.json), so any laptop can come
back later and nothing depends on the connection that started it. Runs wait in a queue per GPU
set (<workdir>/.harness/queue/, RunQueue). Secret env values arrive on stdin and are never written.
A stage's output is an artifact of the store (artifact_store.py): reused when its key matches,
else made under the artifact's lock.

Requests (stdin, one JSON document, by "cmd"): launch, cancel, cancelling, status, follow.
The files, stage specs and requests in detail: docs/ARCHITECTURE.md, "The supervisor".
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

if globals().get("__package__"):  # imported as harness.host_helpers.supervisor (tests)
    from harness.host_helpers import artifact_store, wire
else:  # on the host: shipped with this helper (harness/host_helpers/__init__.py, WIRE and COMPANIONS)
    import artifact_store
    import wire

FINAL_STAGE = {"ok", "failed", "cancelled", "skipped"}
FINAL_RUN = {"ok", "failed", "cancelled", "lost"}
LIVE_RUN = {"queued", "running"}  # a supervisor owns the run: "lost" once its lock is free
FOLLOW_SETTLE_S = 30.0
ARTIFACT_TOKEN = "@artifact:{}@"  # in a stage's command line: that stage's artifact (harness/artifacts.py)  # at most this long from a followed run's last stage to its recorded outcome
POLL_S = 0.2
QUEUE_POLL_S = 1.0


# ---------------------------------------------------------------------------------------------
# Small file helpers: every state file is written atomically (temporary name, then rename), so a
# reader never sees half a JSON document.


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


# ---------------------------------------------------------------------------------------------
# The run queue: one run at a time per GPU set, in submission order


def gpus_overlap(a, b) -> bool:
    """Two runs' GPU sets ("all", or a list of indices) share a GPU."""
    if a == "all" or b == "all":
        return True
    return bool(set(a) & set(b))


def competes(entry: dict, gpus, slot) -> bool:
    """Whether a queue entry holds what a run on `gpus` in `slot` needs: a shared GPU, unless both
    runs took different slots (harness sweep's trials that share a GPU: one run per slot at a time;
    a run without a slot competes with every run on its GPUs)."""
    other = entry.get("slot")
    return gpus_overlap(entry["gpus"], gpus) and (slot is None or other is None or other == slot)


class RunQueue:
    """The live runs of one workdir: <workdir>/.harness/queue/<submitted ns>-<run_id>.json =
    {"run_dir", "gpus", "slot"}; names sort in submission order. A run's state (queued | running) is its
    own state.json; an entry counts while its supervisor holds the run's supervisor.lock, so the
    entry of a supervisor that died (kill -9, reboot) is ignored and removed by the next reader.
    Decisions are taken under queue.lock (flock: released by the kernel if its holder dies)."""

    def __init__(self, workdir: str):
        self.dir = os.path.join(workdir, ".harness", "queue")
        self.lock_path = os.path.join(workdir, ".harness", "queue.lock")

    def _locked(self):
        private_state(os.path.dirname(self.dir))
        artifact_store.private_dirs(self.dir)
        fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT, 0o600)  # no other uid may hold it: ours alone
        if os.fstat(fd).st_mode & 0o077:
            os.fchmod(fd, 0o600)  # one made by an older harness
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def live(self) -> list[dict]:
        """Live entries in submission order, each with its "state"; dead ones are removed."""
        try:
            names = sorted(n for n in os.listdir(self.dir) if n.endswith(".json"))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            path = os.path.join(self.dir, name)
            entry = read_json(path)
            if not isinstance(entry, dict) or "run_dir" not in entry:
                continue  # being written, or not ours
            state = (read_json(os.path.join(entry["run_dir"], "state.json"), {}) or {}).get("state")
            if state not in LIVE_RUN or not lock_is_held(entry["run_dir"]):
                _unlink(path)  # finished, or its supervisor is gone: it holds nothing
                continue
            out.append({**entry, "state": state, "path": path})
        return out

    def place(self, run_dir: str, gpus, slot=None) -> int:
        """1 + the live queued runs ahead of this one on overlapping GPUs (and its slot)."""
        ahead = 0
        for e in self.live():
            if e["run_dir"] == run_dir:
                return ahead + 1
            if e["state"] == "queued" and competes(e, gpus, slot):
                ahead += 1
        return ahead + 1

    def _may_start(self, run_dir: str, gpus, slot) -> bool:
        for e in self.live():
            if e["run_dir"] == run_dir:
                continue
            if competes(e, gpus, slot) and (e["state"] == "running" or e["path"] < self.entry):
                return False  # running on our GPUs, or queued before us
        return True

    def enter(self, run_dir: str, run_id: str, gpus, wait: bool, state_path: str, slot=None) -> bool:
        """Register the run and record it queued or running; True when it may start now."""
        fd = self._locked()
        try:
            # Names sort in submission order, even if the clock steps back.
            last = max((int(n.split("-", 1)[0]) for n in os.listdir(self.dir) if n.endswith(".json") and n.split("-", 1)[0].isdigit()), default=0)
            self.entry = os.path.join(self.dir, f"{max(time.time_ns(), last + 1):020d}-{run_id}.json")
            start = not wait or self._may_start(run_dir, gpus, slot)
            # The state first: a reader that finds the entry also finds a live state.
            update_json(state_path, state="running" if start else "queued", queued=now(), pid=os.getpid())
            write_json(self.entry, {"run_dir": run_dir, "gpus": gpus, "slot": slot})
            return start
        finally:
            os.close(fd)

    def try_start(self, run_dir: str, gpus, state_path: str, slot=None) -> bool:
        fd = self._locked()
        try:
            if not self._may_start(run_dir, gpus, slot):
                return False
            update_json(state_path, state="running")
            return True
        finally:
            os.close(fd)

    def leave(self) -> None:
        _unlink(getattr(self, "entry", ""))


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def private_state(path: str) -> None:
    """<workdir>/.harness, made 0700 (or made so again: it holds the queue and its lock)."""
    artifact_store.private_dirs(path)
    st = os.stat(path)
    if st.st_uid == os.getuid() and st.st_mode & 0o077:
        os.chmod(path, 0o700)


def workdir_of(run_dir: str) -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(run_dir)))  # <workdir>/runs/<run_id>


# ---------------------------------------------------------------------------------------------
# The supervisor proper


class Supervisor:
    def __init__(self, run_dir: str, versions_probe: dict | None = None):
        self.run_dir = run_dir
        self.versions_probe = versions_probe  # {"argv", "stdin"}: the launch request's
        self.record = read_json(os.path.join(run_dir, "run.json"))
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
        queue = RunQueue(workdir_of(self.run_dir))
        try:
            if not self._wait_in_queue(queue, state_path):
                for stage in self.stages:
                    update_json(os.path.join(stage_dir(self.run_dir, stage), "state.json"), state="cancelled", finished=now())
                update_json(state_path, state="cancelled", finished=now())
                return 0
            return self._run_chain(state_path)
        finally:
            queue.leave()

    def _wait_in_queue(self, queue: RunQueue, state_path: str) -> bool:
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
        update_json(state_path, state="running", started=now(), pid=os.getpid())
        self._probe_versions()
        if self.record.get("recipes"):
            self.keys = artifact_store.Keys(self.record.get("workdir") or workdir_of(self.run_dir), self.record)
        outcome = "ok"
        for i, stage in enumerate(self.stages):
            sd = stage_dir(self.run_dir, stage)
            if self._cancel_pending():
                update_json(os.path.join(sd, "state.json"), state="cancelled", finished=now())
                outcome = "cancelled"
                continue
            update_json(state_path, current_stage=stage)
            state = self._run_stage(stage)
            if state == "cancelled":
                outcome = "cancelled"
            elif state != "ok":
                outcome = "failed"
                for rest in self.stages[i + 1 :]:  # a failed stage stops the chain
                    update_json(os.path.join(stage_dir(self.run_dir, rest), "state.json"), state="skipped")
                break
        update_json(state_path, state=outcome, finished=now(), current_stage=None)
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
        update_json(run_json, versions=versions)
        self.record["versions"] = versions  # the environment's identity in every key of the run

    def _run_stage(self, stage: str) -> str:
        sd = stage_dir(self.run_dir, stage)
        spec = read_json(os.path.join(sd, "spec.json"))
        state_path = os.path.join(sd, "state.json")
        log_path = os.path.join(sd, "log")
        update_json(state_path, state="running", started=now())
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
                    code, cancelled = self._run_container(spec, log_file, state_path, lock_fd)
                else:
                    code, cancelled = self._run_process(spec, log_file, state_path, lock_fd)
            # A node of a group whose peers were cancelled first dies of their cancel (its collectives
            # break) before its own arrives: the group's cancel marked every node first (cmd_cancelling).
            if code != 0 and os.path.exists(os.path.join(self.run_dir, "cancelling")):
                cancelled = self.cancel_requested = True  # and the stages after it
            state = "cancelled" if cancelled else ("ok" if code == 0 else "failed")
            if state == "ok" and lock_fd is not None:
                self._complete(stage)  # under the lock still: a waiting run then finds it complete
            update_json(state_path, state=state, exit_code=code, finished=now())
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
        update_json(state_path, artifact=key)
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
        events = os.path.join(stage_dir(self.run_dir, stage), "events.jsonl")
        with open(events, "a", encoding="utf-8") as f:  # what the maker's stage reported: status shows its tau
            note = {"t": now(), "stage": stage, "event": "message", "text": f"reused from run {made_by} (same inputs)"}
            for event in [note, *(record.get("events") or [])]:
                f.write(json.dumps(event) + "\n")
        self._note_artifact(stage, "reused", record)
        return self._stage_ended(state_path, "ok", reused_from=made_by)

    def _complete(self, stage: str) -> None:
        """Record the stage's artifact as complete, with what made it and what its stage reported."""
        events = os.path.join(stage_dir(self.run_dir, stage), "events.jsonl")
        reported = [e for e in (latest_tau_event(events), last_event(events, TAU_WINDOW, lambda ev: ev.get("event") == "finished")) if e]
        key = self.keys.key(stage)
        record = {"made_by": self.record["run_id"], "created": now(), "parts": self.keys.parts[stage], "events": reported}
        self.keys.store.complete(stage, key, record)
        self._note_artifact(stage, "made", record)

    def _recorded_artifacts(self) -> dict:
        return (read_json(os.path.join(self.run_dir, "run.json"), {}) or {}).get("artifacts") or {}

    def _note_artifact(self, stage: str, role: str, record: dict | None) -> None:
        """run.json's `artifacts`: each artifact the run made, reused or read, with its key and
        the parts that made the key (harness diff compares them)."""
        keys = self.keys
        key = keys.key(stage)
        entry = {"key": key, "path": keys.store.dir(stage, key), "role": role, "made_by": (record or {}).get("made_by"),
                 "parts": keys.parts[stage]}
        path = os.path.join(self.run_dir, "run.json")
        update_json(path, artifacts={**self._recorded_artifacts(), stage: entry})

    @staticmethod
    def _stage_ended(state_path: str, state: str, **fields) -> str:
        update_json(state_path, state=state, exit_code=0 if state == "ok" else None, finished=now(), **fields)
        return state

    def _run_process(self, spec: dict, log_file, state_path: str, lock_fd: int | None = None) -> tuple[int, bool]:
        env = {**spec.get("env_defaults", {}), **os.environ, "PYTHONUNBUFFERED": "1", **spec.get("env_extra", {})}
        try:
            # The stage holds its artifact's lock too: should the supervisor die, the orphan still does.
            proc = subprocess.Popen(
                spec["argv"], cwd=self.record.get("workdir"), stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                start_new_session=True, pass_fds=() if lock_fd is None else (lock_fd,)
            )
        except OSError as e:
            log_file.write(f"harness: cannot start {spec['argv'][0]}: {e}\n".encode())
            return 127, False
        update_json(state_path, pid=proc.pid, pgid=proc.pid, leader=process_identity(proc.pid))
        cancelled = False
        while proc.poll() is None:
            if self._cancel_pending() and not cancelled:
                cancelled = True
                terminate_group(proc.pid, self.grace, proc.poll)
            time.sleep(POLL_S)
        return proc.returncode, cancelled

    def _run_container(self, spec: dict, log_file, state_path: str, lock_fd: int | None = None) -> tuple[int, bool]:
        name = spec["container"]
        created = subprocess.run(spec["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file)
        if created.returncode != 0:
            return created.returncode, False
        update_json(state_path, container=name, container_id=created.stdout.decode().strip())
        started = subprocess.run(["docker", "start", name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        log_file.write(started.stderr)
        if started.returncode != 0:  # e.g. no GPU runtime: the reason is in the log
            # The engine can die after the container started but before `docker start` returns.
            engine_went_away(state_path, "docker start", started.stderr)
            subprocess.run(["docker", "rm", "-f", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return started.returncode, False
        # `docker wait` AFTER start: on a created container it returns 0 at once ("not running");
        # on one that already exited it returns that exit code, so no exit is missed.
        # The waiter holds the artifact's lock too: should the supervisor die, it lasts as long as the container.
        waiter = subprocess.Popen(["docker", "wait", name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  pass_fds=() if lock_fd is None else (lock_fd,))
        cancelled = False
        while waiter.poll() is None:
            if self._cancel_pending() and not cancelled:
                cancelled = True
                # docker stop: SIGTERM, then SIGKILL after the grace period
                subprocess.run(["docker", "stop", "-t", str(int(self.grace)), name], stdout=subprocess.DEVNULL, stderr=log_file)
            time.sleep(POLL_S)
        out = waiter.stdout.read().decode().strip()
        said = waiter.stderr.read()
        log_file.write(said)
        code = int(out) if out.lstrip("-").isdigit() else 125
        if not out.lstrip("-").isdigit():  # no exit code: the engine went away under the stage (stopped, killed, restarted)
            code, cancelled = self._engine_lost(name, created.stdout.decode().strip(), said, state_path, log_file, cancelled)
        elif code != 0 and not cancelled:
            out_of_memory(name, code, state_path, log_file)  # read before the container (and its state) is removed
        # The stage's output is already in its log file; the container itself is not needed.
        subprocess.run(["docker", "rm", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return code, cancelled


    def _engine_lost(self, name: str, container_id: str, said: bytes, state_path: str, log_file, cancelled: bool) -> tuple[int, bool]:
        """The engine went away under a running stage. Its container may live on (a killed dockerd
        leaves containerd and the container running): the stage stays running, its GPUs held,
        until the engine answers for the container again or the container's processes are gone;
        a cancel meanwhile signals those processes directly (they are the box user's: --user)."""
        lines = said.decode(errors="replace").strip().splitlines()
        why = engine_lost_line(lines) or (lines[-1] if lines else "no answer")
        lost = f"the Docker engine went away under the stage (docker wait: {why})"
        update_json(state_path, error=f"{lost}; its container may still be running: waiting for the engine (harness cancel stops it)")
        log_file.write(f"harness: {lost}; its container may still be running: waiting for the engine\n".encode())
        while True:
            seen = subprocess.run(["docker", "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            answer = seen.stdout.decode().split()
            if seen.returncode == 0 and len(answer) == 2 and answer[0] == "false" and answer[1].lstrip("-").isdigit():
                code = int(answer[1])  # the engine is back and the container ended (or the engine's restart ended it)
                update_json(state_path, error=f"{lost} and came back; its container had ended (exit {code})" + ("" if cancelled else ": run it again"))
                return code, cancelled
            if seen.returncode == 0 and answer[:1] == ["true"]:
                waited = subprocess.run(["docker", "wait", name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
                if waited.returncode == 0 and waited.stdout.strip().lstrip(b"-").isdigit():
                    update_json(state_path, error=None)  # the engine is back and the stage ran on to its end
                    return int(waited.stdout.strip()), cancelled
                continue  # lost again: look again
            pids = container_pids(container_id)
            if not pids:
                update_json(state_path, error=f"{lost}; its container ended while the engine was down (its exit code is unknown: the stage's log says how it ended)")
                return 125, cancelled
            if self._cancel_pending() and not cancelled:
                cancelled = True
                log_file.write(b"harness: cancelled while the engine is away: stopping the container's processes\n")
                stop_pids(pids, self.grace)
                continue
            time.sleep(QUEUE_POLL_S)


def container_pids(container_id: str) -> list[int]:
    """The processes of a container on this host, from their cgroups (which name the container's
    id under cgroupfs and systemd alike): what is known of a container while its engine is away."""
    if len(container_id) < 12:
        return []
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cgroup") as f:
                if container_id in f.read():
                    pids.append(int(entry))
        except OSError:
            continue
    return pids


def stop_pids(pids: list[int], grace: float) -> None:
    """SIGTERM, up to `grace` seconds, then SIGKILL (the container's init passes SIGTERM on)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 0)
        while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
            time.sleep(POLL_S)


# What docker's CLI says when it loses its engine (a broken or refused socket), not a refusal by it.
ENGINE_LOST = ("error during connect", "Cannot connect to the Docker daemon")


def engine_lost_line(lines: list[str]) -> str | None:
    """The last of docker's lines that says it lost its engine, if one does."""
    return next((line for line in reversed(lines) if any(marker in line for marker in ENGINE_LOST)), None)


def engine_went_away(state_path: str, step: str, said: bytes) -> None:
    """Record on the stage that its Docker engine went away during `step`, when it did."""
    why = engine_lost_line(said.decode(errors="replace").strip().splitlines())
    if why:
        update_json(state_path, error=f"the Docker engine went away under the stage ({step}: {why}); its container is gone: run it again")


def out_of_memory(name: str, code: int, state_path: str, log_file) -> None:
    """A stage the kernel killed for memory: say so, not a bare exit 137 (a `docker kill` reads the
    same code). Only the engine knows which: the container's State.OOMKilled."""
    seen = subprocess.run(["docker", "inspect", "--format", "{{.State.OOMKilled}}", name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL)
    if seen.stdout.strip() == b"true":
        said = (f"out of memory: the kernel killed the stage's container (exit {code}); "
                "give the container more memory or the stage a smaller batch")
        log_file.write(f"harness: {said}\n".encode())
        update_json(state_path, error=said)


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
        time.sleep(POLL_S)
    try:
        os.killpg(pgid, signal.SIGKILL)  # also any children left behind by the leader
    except ProcessLookupError:
        pass


def log(message: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} supervisor: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# Commands


def cmd_start(run_dir: str, env: dict, versions_probe: dict | None) -> int:
    """Detach (double fork, new session) with the secrets `env`; print the supervisor's pid."""
    run_dir = os.path.abspath(run_dir)
    if read_json(os.path.join(run_dir, "state.json")):
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
        state = read_json(state_path)
        if state and state.get("pid"):
            return 0
        time.sleep(0.05)
    print(f"{run_dir}: supervisor did not start (see supervisor.log)", file=sys.stderr)
    return 1


def cmd_launch(request: dict, home: str) -> int:
    """A run's whole start in one request: write its plan (every stage's spec.json, run.json
    with the digest of the code last synced), start it, and answer with its status (queued or
    running, the queue place) and the home directory `~` stood for."""
    run_dir = request["run_dir"]
    for need in request.get("requires") or []:  # what the stages need, before anything is written
        if not os.path.exists(os.path.expanduser(need["path"])):
            print(need["message"], file=sys.stderr)
            return 3
    if read_json(os.path.join(run_dir, "run.json")):
        print(f"{run_dir}: a run with this id exists", file=sys.stderr)
        return 2
    for stage, spec in request["specs"].items():
        os.makedirs(stage_dir(run_dir, stage), exist_ok=True)
        write_json(os.path.join(stage_dir(run_dir, stage), "spec.json"), spec)
    record = request["record"]
    manifest = read_json(request["manifest"]) if request.get("manifest") else None
    record["manifest_hash"] = manifest.get("digest") if isinstance(manifest, dict) else None
    write_json(os.path.join(run_dir, "run.json"), record)
    code = cmd_start(run_dir, request.get("env") or {}, request.get("versions_probe"))
    if code != 0:
        return code
    json.dump({"home": home, "status": run_summary(run_dir)}, sys.stdout)
    sys.stdout.write("\n")
    return 0


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
        log(f"started pid {os.getpid()}")
        code = Supervisor(run_dir, versions_probe).run()
        log("finished")
    except BaseException as e:  # noqa: BLE001 - record why, then exit
        log(f"crashed: {e!r}")
        update_json(os.path.join(run_dir, "state.json"), state="failed", error=repr(e), finished=now())
    finally:
        sys.stdout.flush()
        os._exit(code)


def cmd_cancelling(run_dir: str) -> int:
    """Mark the run as being cancelled, stopping nothing yet; print its state."""
    run_dir = os.path.abspath(run_dir)
    if not read_json(os.path.join(run_dir, "run.json")):
        print(f"{run_dir}: no such run", file=sys.stderr)
        return 2
    open(os.path.join(run_dir, "cancelling"), "w").close()
    print(read_json(os.path.join(run_dir, "state.json"), {}).get("state"))
    return 0


def cmd_cancel(run_dir: str, grace: float | None) -> int:
    """Ask the supervisor to cancel; if it is gone, stop what is left ourselves."""
    run_dir = os.path.abspath(run_dir)
    record = read_json(os.path.join(run_dir, "run.json"))
    if not record:
        print(f"{run_dir}: no such run", file=sys.stderr)
        return 2
    state_path = os.path.join(run_dir, "state.json")
    state = read_json(state_path, {})
    if state.get("state") in FINAL_RUN:
        print(f"already {state['state']}")  # it had ended: nothing was stopped
        return 0
    open(os.path.join(run_dir, "cancel"), "w").close()
    grace = float(record.get("grace_s", 10)) if grace is None else grace
    if lock_is_held(run_dir) and state.get("pid"):
        try:
            os.kill(int(state["pid"]), signal.SIGTERM)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + grace + 30
        while time.monotonic() < deadline and lock_is_held(run_dir):
            time.sleep(POLL_S)
    if lock_is_held(run_dir):
        print(f"{run_dir}: supervisor did not stop", file=sys.stderr)
        return 1
    # No live supervisor (it died or never started): finish the job by hand.
    for stage in record["stages"]:
        sp = os.path.join(stage_dir(run_dir, stage), "state.json")
        st = read_json(sp, {})
        if st.get("state") in FINAL_STAGE:
            continue
        if st.get("state") == "running":
            if st.get("container"):
                subprocess.run(["docker", "stop", "-t", str(int(grace)), st["container"]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                subprocess.run(["docker", "rm", "-f", st["container"]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            elif st.get("pgid"):
                if not group_is_ours(st):
                    print(f"{run_dir}: stage {stage}'s process group {st['pgid']} is no longer this run's "
                          "(the host rebooted, or the id was reused): the run is lost, nothing signalled", file=sys.stderr)
                    update_json(state_path, state="lost", finished=now())
                    print("lost")
                    return 0
                terminate_group(int(st["pgid"]), grace, lambda: None if _group_alive(int(st["pgid"])) else 0)
        update_json(sp, state="cancelled", finished=now())
    state = read_json(state_path, {})
    if state.get("state") not in FINAL_RUN:
        update_json(state_path, state="cancelled", finished=now())
    print(read_json(state_path, {}).get("state"))
    return 0


# A pid (and so a pgid) is reused, at once after a reboot: a stage's group is signalled only while
# it is provably the one the stage started. Its leader's identity is recorded at the start.


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


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def run_summary(run_dir: str) -> dict | None:
    record = read_json(os.path.join(run_dir, "run.json"))
    if not record:
        return None
    state = read_json(os.path.join(run_dir, "state.json"), {}) or {}
    if state.get("state") in LIVE_RUN and not lock_is_held(run_dir):
        state["state"] = "lost"  # the supervisor died without recording an outcome
    if state.get("state") == "queued":
        gpus = (record.get("queue") or {}).get("gpus", "all")
        state["queue"] = {"place": RunQueue(workdir_of(run_dir)).place(os.path.abspath(run_dir), gpus, (record.get("queue") or {}).get("slot")), "gpus": gpus}
    stages = []
    for stage in record.get("stages", []):
        sd = stage_dir(run_dir, stage)
        st = read_json(os.path.join(sd, "state.json"), {}) or {}
        st.setdefault("state", "pending")
        st["stage"] = stage
        events = os.path.join(sd, "events.jsonl")
        # an ended stage shows how it ended: another rank's progress may have come after rank 0's
        # `finished`, and a launcher that failed after its trainer writes a second one (the last wins)
        ended = st["state"] in FINAL_STAGE and last_event(events, TAU_WINDOW, lambda ev: ev.get("event") == "finished")
        st["last_event"] = ended or last_event(events)
        if st["state"] == "failed" and st.get("error") and not ended:  # a failure the stage could not report itself
            st["last_event"] = {"t": st.get("finished"), "stage": stage, "event": "finished", "status": "failed", "error": st["error"]}
        elif st["state"] == "running" and st.get("error"):  # what the supervisor knows of it now (its engine is away)
            st["last_event"] = {"t": time.time(), "stage": stage, "event": "warning", "text": st["error"]}
        if state.get("state") in FINAL_RUN and st["state"] == "running":  # nobody supervises it now
            st["state"] = "lost"
        tau = latest_tau(os.path.join(sd, "events.jsonl"))
        if tau is not None:  # the draft's estimated acceptance while it trains (status shows it beside the last event)
            st["tau"] = tau
        stages.append(st)
    return {"run_id": record.get("run_id"), "record": record, "state": state, "stages": stages}


TAU_WINDOW = 1 << 20  # a long run's per-step metrics between two tau estimates fit in 1 MiB


def latest_tau(path: str) -> dict | None:
    """{"step", "tau"} of the newest metric event carrying a tau (docs/events.json), or None."""
    ev = latest_tau_event(path)
    return {"step": ev.get("step"), "tau": ev["metrics"]["tau"]} if ev is not None else None


def latest_tau_event(path: str) -> dict | None:
    return last_event(path, TAU_WINDOW, lambda ev: ev.get("event") == "metric" and "tau" in (ev.get("metrics") or {}))


def last_event(path: str, window: int = 65536, match=None) -> dict | None:
    """The last complete event line of an events.jsonl (reads only its tail), or the last that
    `match(event)` accepts."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - window))
            lines = f.read().splitlines()
    except FileNotFoundError:
        return None
    for line in reversed(lines):
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if match is None or (isinstance(ev, dict) and match(ev)):
            return ev
    return None


def cmd_gc(runs_dir: str, stores: list, remove: list, dry_run: bool) -> int:
    """`harness rm` (the runs in `remove`) and `harness gc` (none): remove those runs, then every
    artifact of the stores that no kept run made, reused or read. Kept whatever it holds: an
    artifact being made (its lock held), and every artifact of a stage a queued or running run
    names (it may read one whose key is not known before its stage starts). Prints what went (or
    would go, with `dry_run`) as one JSON document."""
    workdir = os.path.dirname(os.path.abspath(runs_dir))
    runs = {}
    for name in wire.run_names(runs_dir):
        record = read_json(os.path.join(runs_dir, name, "run.json"))
        if isinstance(record, dict) and not os.path.islink(os.path.join(runs_dir, name)):
            runs[name] = record
    for run_id in remove:
        if run_id not in runs:
            print(f"no run {run_id} in {runs_dir}", file=sys.stderr)
            return 2
        if lock_is_held(os.path.join(runs_dir, run_id)):
            print(f"run {run_id} is {read_json(os.path.join(runs_dir, run_id, 'state.json'), {}).get('state')}: cancel it first", file=sys.stderr)
            return 3
    kept = {rid: record for rid, record in runs.items() if rid not in remove}
    named, reading = set(), set()  # (store, stage, key) kept runs name; (store, stage) a live run may read
    for rid, record in kept.items():
        root = record.get("store")
        for stage, entry in (record.get("artifacts") or {}).items():
            if isinstance(entry, dict):
                named.add((root, stage, entry.get("key")))
        if lock_is_held(os.path.join(runs_dir, rid)):
            reading |= {(root, stage) for stage in (record.get("recipes") or {})}
    roots = sorted({r for r in [*stores, *(record.get("store") for record in runs.values())] if isinstance(r, str) and safe_store(r)})
    answer = {"runs": [], "artifacts": [], "kept": 0, "kept_for_live_runs": 0, "kept_busy": 0, "bytes": 0, "dry_run": dry_run}
    for run_id in remove:
        answer["bytes"] += artifact_store.size_of(os.path.join(runs_dir, run_id))
        if not dry_run:
            artifact_store.remove_path(os.path.join(runs_dir, run_id))
        answer["runs"].append(run_id)
    for root in roots:
        store = artifact_store.Store(workdir, root)
        for stage, key in store.artifacts():
            if (root, stage, key) in named:
                answer["kept"] += 1
            elif (root, stage) in reading:
                answer["kept_for_live_runs"] += 1
            elif store.busy(stage, key):
                answer["kept_busy"] += 1
            else:
                freed = (artifact_store.size_of(store.dir(stage, key)) + artifact_store.size_of(store.dir(stage, key) + ".json")) if dry_run \
                    else store.remove(stage, key)
                if freed is None:
                    answer["kept_busy"] += 1
                    continue
                answer["artifacts"].append({"store": root, "stage": stage, "key": key, "bytes": freed,
                                            "complete": store.record(stage, key) is not None if dry_run else None})
                answer["bytes"] += freed
    json.dump(answer, sys.stdout)
    sys.stdout.write("\n")
    return 0


def safe_store(root: str) -> bool:
    """A store as a record names it: relative to the workdir and below it, or absolute; no `..`."""
    return ".." not in root.split("/") and root not in ("", "/", ".")


def cmd_preflight(requires: list, space: str, data: str | None, verifier: str | None) -> int:
    """`harness run --dry-run`: what the launch would check (requires), the free space where the
    artifacts go, and what sizes the hidden states: the data's rows, the verifier's width and
    depth (its config.json). Prints one JSON document; writes nothing."""
    missing = [need["message"] for need in requires if not os.path.exists(os.path.expanduser(need["path"]))]
    at = os.path.expanduser(space)
    while at and not os.path.exists(at):
        at = os.path.dirname(at)
    free = None
    try:
        st = os.statvfs(at or "/")
        free = st.f_bavail * st.f_frsize
    except OSError:
        pass
    rows = None
    if data and os.path.isfile(os.path.expanduser(data)):
        with open(os.path.expanduser(data), "rb") as f:
            rows = sum(1 for line in f if line.strip())
    width = depth = None
    config = read_json(os.path.join(os.path.expanduser(verifier), "config.json")) if verifier else None
    if isinstance(config, dict):
        text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
        width, depth = text.get("hidden_size"), text.get("num_hidden_layers")
    json.dump({"missing": missing, "free_bytes": free, "space_at": at, "data_rows": rows, "hidden_size": width, "num_layers": depth}, sys.stdout)
    sys.stdout.write("\n")
    return 0


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


def cmd_follow(run_dir: str, only_stage: str | None, follow: bool, as_json: bool, tail: int | None = None) -> int:
    """Print stage logs from their first byte (tail: from the start of their last `tail` lines,
    stages in order); with --follow, keep going until the run ends.

    Raw mode writes the log bytes unchanged. JSON mode writes one object per line:
    {"stage", "log": text} | {"stage", "event": {...}} | {"stage", "state": {...}}.
    """
    record = read_json(os.path.join(run_dir, "run.json"))
    if not record:
        print(f"{run_dir}: no such run", file=sys.stderr)
        return 2
    stages = record["stages"]
    if only_stage is not None:
        if only_stage not in stages:
            print(f"run {record.get('run_id')} has no stage {only_stage!r} (stages: {', '.join(stages)})", file=sys.stderr)
            return 2
        stages = [only_stage]
    first, first_offset = tail_start(run_dir, stages, tail) if tail is not None else (0, 0)
    stages = stages[first:]
    out = sys.stdout.buffer

    def emit(obj: dict) -> None:
        out.write((json.dumps(obj) + "\n").encode())
        out.flush()

    for i, stage in enumerate(stages):
        sd = stage_dir(run_dir, stage)
        log_off, ev_off = (first_offset if i == 0 else 0), 0
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        while True:
            st = read_json(os.path.join(sd, "state.json"), {}) or {}
            done = st.get("state") in FINAL_STAGE or run_over(run_dir) or not follow
            # Read AFTER the state check: output written before the stage ended is always seen.
            log_off, data = read_from(os.path.join(sd, "log"), log_off)
            if data:
                if as_json:
                    emit({"stage": stage, "log": decoder.decode(data)})
                else:
                    out.write(data)
                    out.flush()
            if as_json:
                ev_off, evdata = read_from(os.path.join(sd, "events.jsonl"), ev_off, whole_lines=True)
                for line in evdata.splitlines():
                    try:
                        emit({"stage": stage, "event": json.loads(line)})
                    except ValueError:
                        pass
            if done and not data:
                break
            if not data:
                time.sleep(POLL_S)
        st = read_json(os.path.join(sd, "state.json"), {}) or {}
        if as_json:
            emit({"stage": stage, "state": st or {"state": "pending"}})
        if st.get("state") not in ("ok",) and only_stage is None and follow:
            break  # the chain stopped here
    if follow and only_stage is None:
        # The run's outcome (and the skipped stages) are written just after its last stage's:
        # whoever reads the status next must see them.
        deadline = time.monotonic() + FOLLOW_SETTLE_S
        while not run_over(run_dir) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    return 0


def run_over(run_dir: str) -> bool:
    """The run has an outcome, or nobody is left to write one (its supervisor's lock is free)."""
    run_state = (read_json(os.path.join(run_dir, "state.json"), {}) or {}).get("state")
    return run_state in FINAL_RUN or (run_state in LIVE_RUN and not lock_is_held(run_dir))


def tail_start(run_dir: str, stages: list, lines: int) -> tuple:
    """(index of the stage, byte offset in its log) where the last `lines` lines of the stages'
    logs, in order, begin. Reads each log backwards in blocks: a long log is not read whole."""
    wanted = max(0, lines)
    for i in range(len(stages) - 1, -1, -1):
        path = os.path.join(stage_dir(run_dir, stages[i]), "log")
        try:
            size = os.path.getsize(path)
        except OSError:
            continue
        if not size:
            continue
        with open(path, "rb") as f:
            end = pos = size
            while pos > 0:
                start = max(0, pos - 65536)
                f.seek(start)
                block = f.read(pos - start)
                if pos == end and block.endswith(b"\n"):
                    block = block[:-1]  # the final newline ends the last line, it starts none
                    pos -= 1
                for j in range(len(block) - 1, -1, -1):
                    if block[j] == 10:
                        wanted -= 1
                        if wanted <= 0:
                            return i, start + j + 1
                pos = start
        wanted -= 1  # the stage's first line
        if wanted <= 0:
            return i, 0
    return 0, 0


def read_from(path: str, offset: int, whole_lines: bool = False, limit: int = 1 << 20) -> tuple[int, bytes]:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read(limit)
    except FileNotFoundError:
        return offset, b""
    if whole_lines and data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]  # a line being written is read next time
    return offset + len(data), data


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
        return cmd_launch(request, home)
    if cmd == "cancel":
        return cmd_cancel(request["run_dir"], request.get("grace"))
    if cmd == "cancelling":
        return cmd_cancelling(request["run_dir"])
    if cmd == "status":
        return cmd_status(request["runs_dir"], request.get("run_id"))
    if cmd == "preflight":
        return cmd_preflight(list(request.get("requires") or []), request["space"], request.get("data"), request.get("verifier"))
    if cmd == "gc":
        return cmd_gc(request["runs_dir"], list(request.get("stores") or []), list(request.get("remove") or []), bool(request.get("dry_run")))
    if cmd == "follow":
        try:
            return cmd_follow(os.path.abspath(request["run_dir"]), request.get("stage"), bool(request.get("follow")), bool(request.get("json")),
                              request.get("tail"))
        except BrokenPipeError:  # the reader went away (Ctrl-C on the laptop): nothing to clean up
            return 0
    print(f"supervisor: unknown command {cmd!r}", file=sys.stderr)
    return 64


if __name__ == "__main__":
    sys.exit(main())

"""The run queue: one run at a time per GPU set (and slot) of a workdir, in submission order.
A companion of supervisor.py (harness/host_helpers/__init__.py, COMPANIONS); standard library only.
"""

from __future__ import annotations

import fcntl
import os
import time

if globals().get("__package__"):  # imported as harness.host_helpers.run_queue (tests)
    from harness.host_helpers import artifact_store, run_files
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import artifact_store
    import run_files


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
            entry = run_files.read_json(path)
            if not isinstance(entry, dict) or "run_dir" not in entry:
                continue  # being written, or not ours
            state = (run_files.read_json(os.path.join(entry["run_dir"], "state.json"), {}) or {}).get("state")
            if state not in run_files.LIVE_RUN or not run_files.lock_is_held(entry["run_dir"]):
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
            run_files.update_json(state_path, state="running" if start else "queued", queued=run_files.now(), pid=os.getpid())
            run_files.write_json(self.entry, {"run_dir": run_dir, "gpus": gpus, "slot": slot})
            return start
        finally:
            os.close(fd)

    def try_start(self, run_dir: str, gpus, state_path: str, slot=None) -> bool:
        fd = self._locked()
        try:
            if not self._may_start(run_dir, gpus, slot):
                return False
            run_files.update_json(state_path, state="running")
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

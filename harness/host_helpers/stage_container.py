"""What the host knows of a stage's container beyond its exit code: docker's words for a lost
engine, the kernel's OOM kill, the container's processes while its engine is away, and how to stop
them then. A companion of supervisor.py (harness/host_helpers/__init__.py, COMPANIONS); standard
library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

if globals().get("__package__"):  # imported as harness.host_helpers.stage_container (tests)
    from harness.host_helpers import run_files
else:  # on the host: registered ahead of this module (harness/host_helpers/__init__.py, COMPANIONS)
    import run_files


ENGINE_LOST = ("error during connect", "Cannot connect to the Docker daemon")


def engine_lost_line(lines: list[str]) -> str | None:
    """The last of docker's lines that says it lost its engine, if one does."""
    return next((line for line in reversed(lines) if any(marker in line for marker in ENGINE_LOST)), None)


def engine_went_away(state_path: str, step: str, said: bytes) -> None:
    """Record on the stage that its Docker engine went away during `step`, when it did."""
    why = engine_lost_line(said.decode(errors="replace").strip().splitlines())
    if why:
        run_files.update_json(state_path, error=f"the Docker engine went away under the stage ({step}: {why}); its container is gone: run it again")


def out_of_memory(name: str, code: int, state_path: str, log_file) -> None:
    """A stage the kernel killed for memory: say so, not a bare exit 137 (a `docker kill` reads the
    same code). Only the engine knows which: the container's State.OOMKilled."""
    seen = subprocess.run(["docker", "inspect", "--format", "{{.State.OOMKilled}}", name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL)
    if seen.stdout.strip() == b"true":
        said = (f"out of memory: the kernel killed the stage's container (exit {code}); "
                "give the container more memory or the stage a smaller batch")
        log_file.write(f"harness: {said}\n".encode())
        run_files.update_json(state_path, error=said)


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
            time.sleep(run_files.POLL_S)

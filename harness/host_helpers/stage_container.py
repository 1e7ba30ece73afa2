"""A stage run as a container: created, started, waited for, stopped, removed; and what the host
knows of it beyond its exit code: docker's words for a lost engine, the kernel's OOM kill, the
container's processes while its engine is away (stopped directly then). A companion of
supervisor.py (harness/host_helpers/__init__.py, COMPANIONS); standard library only.
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


# What docker's CLI says when it loses its engine (a broken or refused socket), not a refusal by it.
ENGINE_LOST = ("error during connect", "Cannot connect to the Docker daemon")
ENGINE_POLL_S = 1.0  # how often a stage whose engine went away looks for it (or its container) again


def run_stage(spec: dict, log_file, state_path: str, lock_fd: int | None, grace: float, cancel_pending) -> tuple[int, bool]:
    """Run a stage's container (spec "argv" creates it, spec "container" names it): created, started,
    waited for, stopped on cancel_pending(), removed; its output is in log_file. (exit code, cancelled)."""
    name = spec["container"]
    created = subprocess.run(spec["argv"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log_file)
    if created.returncode != 0:
        return created.returncode, False
    run_files.update_json(state_path, container=name, container_id=created.stdout.decode().strip())
    started = subprocess.run(["docker", "start", name], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    log_file.write(started.stderr)
    if started.returncode != 0:  # e.g. no GPU runtime: the reason is in the log
        container_id = created.stdout.decode().strip()
        # The engine can die after the container started but before `docker start` returns: then its
        # processes run on without it, and the stage is theirs to wait for, as when it dies later.
        if engine_lost_line(started.stderr.decode(errors="replace").splitlines()) and _processes_appear(container_id):
            code, cancelled = _engine_lost(name, container_id, started.stderr, state_path, log_file, False, grace, cancel_pending, "docker start")
            subprocess.run(["docker", "rm", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            return code, cancelled
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
        if cancel_pending() and not cancelled:
            cancelled = True
            # docker stop: SIGTERM, then SIGKILL after the grace period
            subprocess.run(["docker", "stop", "-t", str(int(grace)), name], stdout=subprocess.DEVNULL, stderr=log_file)
        time.sleep(run_files.POLL_S)
    out = waiter.stdout.read().decode().strip()
    said = waiter.stderr.read()
    log_file.write(said)
    code = int(out) if out.lstrip("-").isdigit() else 125
    if not out.lstrip("-").isdigit():  # no exit code: the engine went away under the stage (stopped, killed, restarted)
        code, cancelled = _engine_lost(name, created.stdout.decode().strip(), said, state_path, log_file, cancelled, grace, cancel_pending)
    elif code != 0 and not cancelled:
        out_of_memory(name, code, state_path, log_file)  # read before the container (and its state) is removed
    # The stage's output is already in its log file; the container itself is not needed.
    subprocess.run(["docker", "rm", name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return code, cancelled


def _processes_appear(container_id: str, within_s: float = 3.0) -> bool:
    """Whether the container has processes, looked for a moment: a start cut short by the engine's
    death may still be bringing them up (containerd and the shim go on without dockerd)."""
    deadline = time.monotonic() + within_s
    while not container_pids(container_id):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _engine_lost(name: str, container_id: str, said: bytes, state_path: str, log_file, cancelled: bool, grace: float,
                 cancel_pending, step: str = "docker wait") -> tuple[int, bool]:
    """The engine went away under a running stage. Its container may live on (a killed dockerd
    leaves containerd and the container running): the stage stays running, its GPUs held,
    until the engine answers for the container again or the container's processes are gone;
    a cancel meanwhile signals those processes directly (they are the box user's: --user)."""
    lines = said.decode(errors="replace").strip().splitlines()
    why = engine_lost_line(lines) or (lines[-1] if lines else "no answer")
    lost = f"the Docker engine went away under the stage ({step}: {why})"
    run_files.update_json(state_path, error=f"{lost}; its container may still be running: waiting for the engine (harness cancel stops it)")
    log_file.write(f"harness: {lost}; its container may still be running: waiting for the engine\n".encode())
    while True:
        seen = subprocess.run(["docker", "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", name], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        answer = seen.stdout.decode().split()
        if seen.returncode == 0 and len(answer) == 2 and answer[0] == "false" and answer[1].lstrip("-").isdigit():
            code = int(answer[1])  # the engine is back and the container ended (or the engine's restart ended it)
            run_files.update_json(state_path, error=f"{lost} and came back; its container had ended (exit {code})" + ("" if cancelled else ": run it again"))
            return code, cancelled
        if seen.returncode == 0 and answer[:1] == ["true"]:
            waited = subprocess.run(["docker", "wait", name], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
            if waited.returncode == 0 and waited.stdout.strip().lstrip(b"-").isdigit():
                run_files.update_json(state_path, error=None)  # the engine is back and the stage ran on to its end
                return int(waited.stdout.strip()), cancelled
            continue  # lost again: look again
        pids = container_pids(container_id)
        if not pids:
            run_files.update_json(state_path, error=f"{lost}; its container ended while the engine was down (its exit code is unknown: the stage's log says how it ended)")
            return 125, cancelled
        if cancel_pending() and not cancelled:
            cancelled = True
            log_file.write(b"harness: cancelled while the engine is away: stopping the container's processes\n")
            stop_pids(pids, grace)
            continue
        time.sleep(ENGINE_POLL_S)


def engine_lost_line(lines: list[str]) -> str | None:
    """The last of docker's lines that says it lost its engine, if one does."""
    return next((line for line in reversed(lines) if any(marker in line for marker in ENGINE_LOST)), None)


def engine_went_away(state_path: str, step: str, said: bytes) -> None:
    """Record on the stage that its Docker engine went away during `step`, when it did."""
    why = engine_lost_line(said.decode(errors="replace").strip().splitlines())
    if why:
        run_files.update_json(state_path, error=f"the Docker engine went away under the stage ({step}: {why}); its container is not running: run it again")


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

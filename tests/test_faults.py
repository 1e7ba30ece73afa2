"""The fault table (docs/troubleshooting.md, "Faults"): each fault made for real, each ending
within a bound in one line that says what happened, nothing lost, and a resume (pull) that
finishes with every byte verified.

Local disk faults are real file systems: a small tmpfs as LOCAL_DIR (full, read-only), a
process's RLIMIT_FSIZE (EFBIG). Link faults go through the real sshd behind bench/delayline.py
(a stall: bytes stop, the TCP connection stays open; a cut)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.pull import PART_SUFFIX, PullOptions, PullProgress, pull, received_bytes
from harness.pull.local_disk import LocalDiskError
from harness.transport.local import LocalTransport
from tests.fixtures.beds import bed_unavailable
from tests.fixtures.sshd import free_port

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob(f"*{PART_SUFFIX}*"))


@contextlib.contextmanager
def tmpfs(path: Path, size: str, *options: str):
    """A small real file system at path (root only: the test beds run as root)."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join([f"size={size}", *options]), "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        bed_unavailable("tmpfs", r.stderr.strip() or f"mount exit {r.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def local_config(tmp_path: Path) -> Path:
    config = tmp_path / "harness.toml"
    config.write_text(f'[hosts.here]\nlocal = true\nworkdir = "{tmp_path / "work"}"\n')
    return config


def harness_pull(config: Path, src: Path, dest: Path, preexec=None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "pull", "here", str(src), str(dest)],
                          capture_output=True, text=True, env=env, timeout=timeout, preexec_fn=preexec)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("harness: error: "), (r.returncode, r.stderr[-3000:])
    return lines[0]


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    src = tmp_path / "host" / "ckpt"
    src.mkdir(parents=True)
    (src / "model.safetensors").write_bytes(os.urandom(12 * MiB))
    (src / "config.json").write_text("{}\n")
    return src


# -------------------------------------------------------------------------------------------------
# The laptop's disk during a pull


def test_a_pull_into_a_disk_too_small_is_one_line_naming_it_and_leaves_nothing(tmp_path, checkpoint):
    """Before: `connection lost (run the same pull again to resume)`, retries, the disk left full
    of part files. Now: refused before a byte lands, naming the disk and its free space."""
    dest = tmp_path / "small"
    with tmpfs(dest, "6m"):
        r = harness_pull(local_config(tmp_path), checkpoint, dest)
        line = one_error_line(r)
        assert f"local disk full: {dest} has " in line and "free" in line and "run the same pull again" in line, line
        assert leftovers(dest) == [] and not (dest / "model.safetensors").exists()


class FillsTheDisk(PullProgress):
    """Another writer fills LOCAL_DIR's disk once the pull's first 2 MiB have landed."""

    def __init__(self, filler: Path):
        super().__init__()
        self.filler, self.landed = filler, 0

    def advance(self, nbytes: int) -> None:
        super().advance(nbytes)
        self.landed += nbytes
        if self.landed >= 2 * MiB and not self.filler.exists():
            with open(self.filler, "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * MiB)


def test_a_disk_filled_during_a_pull_stops_it_at_once_and_the_same_pull_resumes(tmp_path, checkpoint):
    dest = tmp_path / "disk"
    with tmpfs(dest, "20m"):
        options = PullOptions(streams=1, piece_size=MiB, adaptive=False)
        filler = dest / "someone-else.bin"
        with pytest.raises(LocalDiskError) as failed:
            pull(LocalTransport(), str(checkpoint), dest, options, FillsTheDisk(filler))
        message = str(failed.value)
        assert message.startswith(f"local disk full: {dest} has ") and "\n" not in message, message
        kept = received_bytes(dest / "model.safetensors")
        assert 0 < kept < 12 * MiB  # the pieces written are kept for the resume, nothing at the final name
        assert not (dest / "model.safetensors").exists()
        filler.unlink()
        report = pull(LocalTransport(), str(checkpoint), dest, options)
        assert report.ok and report.bytes_resumed == kept, report
        assert sha(dest / "model.safetensors") == sha(checkpoint / "model.safetensors") and leftovers(dest) == []


def test_a_file_size_limit_is_one_line_and_the_pull_resumes_without_it(tmp_path, checkpoint):
    """EFBIG (RLIMIT_FSIZE below the file's size): before, a 47-56-line traceback."""
    dest = tmp_path / "dest"
    config = local_config(tmp_path)

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (4 * MiB, resource.RLIM_INFINITY))

    line = one_error_line(harness_pull(config, checkpoint, dest, preexec=limit))
    assert "model.safetensors" in line and "file size limit" in line and "ulimit -f" in line, line
    r = harness_pull(config, checkpoint, dest)
    assert r.returncode == 0, r.stderr
    assert sha(dest / "model.safetensors") == sha(checkpoint / "model.safetensors") and leftovers(dest) == []


def test_local_dir_a_file_or_not_writable_is_one_line(tmp_path, checkpoint):
    config = local_config(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    line = one_error_line(harness_pull(config, checkpoint, a_file))
    assert line == f"harness: error: LOCAL_DIR {a_file} is a file, not a directory (or lies under one); choose another LOCAL_DIR"
    assert a_file.read_text() == "mine\n"
    line = one_error_line(harness_pull(config, checkpoint, a_file / "sub"))
    assert "is a file, not a directory" in line
    with tmpfs(tmp_path / "ro", "1m", "ro") as ro:  # root ignores modes: a read-only mount is what refuses it
        line = one_error_line(harness_pull(config, checkpoint, ro / "dest"))
        assert line.startswith(f"harness: error: LOCAL_DIR {ro / 'dest'} is not writable (") and "Read-only file system" in line, line


# -------------------------------------------------------------------------------------------------
# Links


def test_a_link_out_of_local_dir_cannot_be_assembled_across_two_pulls(tmp_path):
    """Pull 1 brings d/e/q -> .. (inside); pull 2 brings d/e/q/r/L -> ../../../outside, inside
    when read as text, but q on disk makes it climb one level more: out of LOCAL_DIR."""
    dest, outside = tmp_path / "dest", tmp_path / "outside"
    outside.mkdir()
    first = tmp_path / "host1"
    (first / "d" / "e").mkdir(parents=True)
    os.symlink("..", first / "d" / "e" / "q")
    report = pull(LocalTransport(), str(first), dest)
    assert report.links == ["d/e/q"] and report.ok, report
    second = tmp_path / "host2"
    (second / "d" / "e" / "q" / "r").mkdir(parents=True)
    os.symlink("../../../outside", second / "d" / "e" / "q" / "r" / "L")
    (second / "d" / "e" / "q" / "r" / "f").write_text("x\n")
    report = pull(LocalTransport(), str(second), dest)
    assert [name for name, _ in report.refused] == ["d/e/q/r/L"], report
    assert not os.path.lexists(dest / "d" / "r" / "L") and (dest / "d" / "r" / "f").read_text() == "x\n"
    # a `..` after a name is refused from the text alone: where it climbs from depends on the disk
    third = tmp_path / "host3"
    third.mkdir()
    os.symlink("d/e/../x", third / "M")
    report = pull(LocalTransport(), str(third), dest)
    assert [name for name, _ in report.refused] == ["M"] and not os.path.lexists(dest / "M")


# -------------------------------------------------------------------------------------------------
# The pull listener on the host


# the helper's own functions (its source without the call of main()), its bound set to 3
LISTENER = textwrap.dedent("""
    import sys, time
    source = open(sys.argv[1]).read()
    assert source.endswith("\\nmain()\\n")
    helper = {"__name__": "pull_helper"}
    exec(source[: -len("main()\\n")], helper)
    helper["MOST_CONNECTIONS"] = 3
    print(helper["start_listener"]()["port"], flush=True)
    time.sleep(60)
""")


def test_the_pull_listener_serves_a_bounded_number_of_connections(tmp_path):
    """Before: one forked process per connection, without a bound (connections that never send
    their token were each held by a process for the token timeout)."""
    import select
    import socket

    helper = subprocess.Popen([sys.executable, "-c", LISTENER, str(REPO / "harness" / "host_helpers" / "pull_helper.py")], stdout=subprocess.PIPE, text=True)
    try:
        port = int(helper.stdout.readline())
        held = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(8)]
        closed: set[int] = set()  # closed unanswered at once: over the bound
        deadline = time.monotonic() + 3
        while len(closed) < 5 and time.monotonic() < deadline:
            readable, _, _ = select.select([c for i, c in enumerate(held) if i not in closed], [], [], 0.1)
            closed |= {held.index(c) for c in readable if c.recv(1) == b""}
        assert closed == {3, 4, 5, 6, 7}, closed  # the first three are served (waiting for their token)
        for conn in held:
            conn.close()
    finally:
        helper.kill()
        helper.wait()


# -------------------------------------------------------------------------------------------------
# The link: a stall (bytes stop, the TCP connection stays open) and a cut


def slow_host(ssh_host, tmp_path: Path, line_port: int, name: str) -> tuple[Path, dict[str, str]]:
    """harness.toml with host `slow` behind the delay line, and the env that reaches it: short
    keepalive and connect timeouts (the settings that bound a stall), a control dir of its own."""
    from tests.test_pull import _slow_link_files

    ssh_config, known_hosts = _slow_link_files(ssh_host, tmp_path, line_port)
    config = tmp_path / "harness.toml"
    config.write_text(f'[hosts.slow]\nssh = "slow"\nworkdir = "{tmp_path / "host"}"\nconnect_timeout = 2\nkeepalive = 1\n')
    control = Path(ssh_host.control_dir) / name
    control.mkdir(mode=0o700, exist_ok=True)
    (tmp_path / "host").mkdir(exist_ok=True)  # the workdir (its parent is a directory a warm exec's recipe watches)
    env = {**ssh_host.env(), "HARNESS_SSH_CONFIG": str(ssh_config), "HARNESS_KNOWN_HOSTS": str(known_hosts), "HARNESS_CONTROL_DIR": str(control),
           "PYTHONPATH": str(REPO)}
    return config, env


def slow_stage_project(ssh_host, tmp_path: Path, port: int, name: str, keepalive: int | None = None) -> tuple[Path, dict]:
    """slow_host's config in a project of its own, its fake stages on the host, prepare a long one."""
    from tests.fixtures.job_project import write_project

    config, env = slow_host(ssh_host, tmp_path, port, name)
    write_project(tmp_path / "unused", tmp_path / "host", {})  # the fake stages, on the host
    project = tmp_path / "project"
    project.mkdir()
    config = config.rename(project / "harness.toml")
    text = config.read_text()
    if keepalive is not None:
        text = text.replace("keepalive = 1", f"keepalive = {keepalive}")
    config.write_text(text + "[pipeline.stages.prepare]\nlines = 100\nsleep = 100\n")
    return config, env


@pytest.mark.ssh
@pytest.mark.parametrize("fault", ["stall", "cut"])
def test_a_pull_on_a_link_that_stalls_or_drops_ends_in_one_line_and_resumes(ssh_host, tmp_path, fault):
    from bench.delayline import DelayLine

    src = tmp_path / "host" / "ckpt"
    src.mkdir(parents=True)
    (src / "model.safetensors").write_bytes(os.urandom(8 * MiB))
    dest = tmp_path / "dest"
    target = dest / "model.safetensors"
    with DelayLine(("127.0.0.1", ssh_host.port), rtt_ms=2, rate=2 * MiB) as line:
        config, env = slow_host(ssh_host, tmp_path, line.port, f"pull-{fault}")
        argv = [sys.executable, "-m", "harness", "--config", str(config), "pull", "slow", str(src), str(dest)]
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while received_bytes(target) < MiB and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, proc.communicate()
        started = time.monotonic()
        line.stall() if fault == "stall" else line.cut()
        if fault == "cut":
            line.stall()  # and it stays down: reconnects find no box
        out, err = proc.communicate(timeout=90)
        print(f"{fault}: ended {time.monotonic() - started:.1f} s after the fault; rc {proc.returncode}\n{err}")
        assert proc.returncode != 0 and "Traceback" not in err, err
        assert not target.exists() and received_bytes(target) > 0
        line.flow()
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
    assert sha(target) == sha(src / "model.safetensors") and leftovers(dest) == []


def master_pid(control: Path) -> int:
    """The ControlMaster's pid (ssh -O check names it)."""
    import re

    socks = [p for p in control.iterdir() if p.is_socket()]
    assert len(socks) == 1, socks
    r = subprocess.run(["ssh", "-o", f"ControlPath={socks[0]}", "-O", "check", "x"], capture_output=True, text=True, timeout=10)
    return int(re.search(r"pid=(\d+)", r.stderr).group(1))


@pytest.mark.ssh
@pytest.mark.parametrize("fault", ["stall", "master killed"])
def test_an_exec_whose_link_stalls_or_whose_master_dies_ends_in_one_line(ssh_host, tmp_path, fault):
    from bench.delayline import DelayLine

    with DelayLine(("127.0.0.1", ssh_host.port), rtt_ms=2) as line:
        config, env = slow_host(ssh_host, tmp_path, line.port, f"exec-{fault.split()[0]}")
        argv = [sys.executable, "-m", "harness", "--config", str(config), "exec", "slow", "--", "sh", "-c", "echo started; sleep 60"]
        if fault == "master killed":  # the warm path (transport/warm_exec.py): a recipe first, from inputs older than its racy window
            time.sleep(2.2)
            assert subprocess.run(argv[:-3] + ["true"], env=env, capture_output=True, timeout=60).returncode == 0
            assert list(Path(env["HARNESS_CONTROL_DIR"]).glob("exec-*"))  # the recipe the next exec runs from
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline() == "started\n"
        started = time.monotonic()
        if fault == "stall":
            line.stall()
        else:
            os.kill(master_pid(Path(env["HARNESS_CONTROL_DIR"])), 9)
        out, err = proc.communicate(timeout=60)
        print(f"{fault}: ended {time.monotonic() - started:.1f} s after the fault; rc {proc.returncode}\n{err}")
        assert proc.returncode == 255 and err.splitlines() == [
            "harness: error: slow: the connection ended during the command (the link stalled or dropped, or its SSH master was stopped); "
            "the command may still be running there"], err


@pytest.mark.ssh
def test_a_server_held_over_a_link_that_stalls_ends_in_one_line_and_stops_on_the_box(ssh_host, tmp_path):
    """`harness tensorboard` (a server harness holds on the box over a connection, as `harness
    serve` holds vLLM: harness/host_server.py) on a link that stalls: harness ends within the
    keepalive's bound in one line, and the box stops the server while the link is still stalled
    (its session open: the test sshd sets no ClientAliveInterval), once the lifeline's beat has
    been silent for SILENCE_S."""
    from bench.delayline import DelayLine
    from harness.transport.base import SILENCE_S
    from tests.fixtures.requires import require_module
    from tests.test_tensorboard import assert_stopped_on_the_box, tensorboards_over, write_events

    require_module("tensorboard")
    logdir = tmp_path / "host" / "outputs" / "artifacts" / "train"  # every draft's logs (no RUN)
    write_events(logdir / ("a" * 20) / "logs", "only", [1.0, 0.5])
    with DelayLine(("127.0.0.1", ssh_host.port), rtt_ms=2) as line:
        config, env = slow_host(ssh_host, tmp_path, line.port, "server-stall")
        config.write_text(config.read_text() + f'python = "{sys.executable}"\n')
        proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "tensorboard", "slow", "--port", str(free_port())],
                                env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            assert proc.stdout.readline().startswith("http://127.0.0.1:"), proc.stderr.read() if proc.poll() is not None else ""
            assert tensorboards_over(logdir)
            line.stall()
            started = time.monotonic()
            out, err = proc.communicate(timeout=60)
            ended = time.monotonic() - started
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
        print(f"ended {ended:.1f} s after the stall; rc {proc.returncode}\n{err}")
        lines = [ln for ln in err.splitlines() if ln.startswith("harness: error:")]
        assert proc.returncode not in (0, None) and len(lines) == 1 and "slow" in lines[0], err
        assert ended < 30  # keepalive 1 s, 3 unanswered
        stopping = time.monotonic()
        assert_stopped_on_the_box(logdir)  # the line still holds its connections, stalled
        assert line.stalled and time.monotonic() - started < SILENCE_S + 30, f"stopped {time.monotonic() - stopping:.0f} s after harness ended"


# -------------------------------------------------------------------------------------------------
# The box: its disk during a stage, a reboot


# a stage as the real ones are made (common/events.run_stage): it writes its output until told to stop
FILLING_STAGE = textwrap.dedent("""
    import argparse, os, sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common.events import run_stage
    p = argparse.ArgumentParser()
    p.add_argument("--events")
    p.add_argument("--output")
    args, _ = p.parse_known_args()

    def run(args, events):
        os.makedirs(args.output, exist_ok=True)
        if os.environ.get("FILL_WITH") == "safetensors":  # extract's writer: its error is no OSError
            import numpy
            from safetensors.numpy import save_file
            save_file({"hidden_states": numpy.ones((16, 1 << 20), dtype=numpy.float32)}, os.path.join(args.output, "hs_0.safetensors"))
        with open(os.path.join(args.output, "shard.bin"), "wb") as f:
            for _ in range(64):
                f.write(os.urandom(1 << 20))
                f.flush()
        return {}

    sys.exit(run_stage("prepare", args, run))
""")


def box_project(tmp_path: Path, output: Path) -> Path:
    import shutil

    from tests.fixtures.job_project import write_project

    workdir = tmp_path / "work"
    config = write_project(tmp_path / "project", workdir, {"prepare": {"output": str(output)}})
    shutil.copytree(REPO / "remote_scripts" / "common", workdir / "remote_scripts" / "common")
    (workdir / "remote_scripts" / "prepare_data.py").write_text(FILLING_STAGE)
    return config


def harness(config: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "300"})


@pytest.mark.parametrize("writer", ["file", "safetensors"])
def test_a_stage_that_fills_the_box_disk_fails_in_one_line_naming_it(tmp_path, monkeypatch, writer):
    """Before: the stage's failure read `OSError: [Errno 28] No space left on device` (no disk named),
    or safetensors' own `SafetensorError: Error while serializing: IoError(...)`."""
    monkeypatch.setenv("FILL_WITH", writer)
    out = tmp_path / "data"
    with tmpfs(out, "8m"):
        config = box_project(tmp_path, out / "prepared")
        r = harness(config, "run", "box", "prepare")
        assert r.returncode == 1, r.stdout + r.stderr
        # the free space is what is left when the writer gave up: safetensors fails before it writes
        line = re.compile(re.escape(f"disk full: {out} on the host has ") + r"\d+\.\d MiB free; "
                          + re.escape("free space there (or point the output elsewhere) and run the stage again"))
        assert line.search(r.stdout + r.stderr), r.stdout + r.stderr
        status = harness(config, "status", "box", "last", "--json")
        assert '"state": "failed"' in status.stdout and line.search(status.stdout), status.stdout


def test_a_stage_that_fills_the_runs_own_disk_ends_the_run_in_one_line(tmp_path):
    """The workdir itself on the full disk: the supervisor's records need space too. Before: the
    supervisor died writing the stage's state; the row stayed `running` with its duration counting."""
    import json

    with tmpfs(tmp_path / "box", "8m") as box:
        config = box_project(box, box / "work" / "outputs" / "prepared")
        r = harness(config, "run", "box", "prepare")
        assert r.returncode == 1, r.stdout + r.stderr
        status = harness(config, "status", "box", "last")
        row = next(line for line in status.stdout.splitlines() if "prepare" in line)
        assert "failed" in row and "disk full" in row and "running" not in status.stdout, status.stdout
        run = json.loads(harness(config, "status", "box", "last", "--json").stdout)
        assert run["state"] == "failed" and [s["state"] for s in run["stages"]] == ["failed"], run


def test_a_box_reboot_under_a_run_shows_it_lost_never_running(tmp_path):
    """A reboot, as the run's record sees it: its supervisor and its stage killed at once (SIGKILL),
    nothing recorded. The run is `lost` (not `running` forever), and `logs -f` ends."""
    import json
    import signal

    from tests.fixtures.job_project import write_project

    config = write_project(tmp_path / "project", tmp_path / "work", {"prepare": {"lines": 100, "sleep": 100}})
    r = harness(config, "run", "box", "prepare", "--detach")
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    run_dir = tmp_path / "work" / "runs" / run_id
    deadline = time.monotonic() + 30
    while "pgid" not in json.loads((run_dir / "prepare" / "state.json").read_text() if (run_dir / "prepare" / "state.json").exists() else "{}"):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # the supervisor first: were the stage first, the supervisor could record its end before dying
    os.kill(json.loads((run_dir / "state.json").read_text())["pid"], signal.SIGKILL)
    os.killpg(json.loads((run_dir / "prepare" / "state.json").read_text())["pgid"], signal.SIGKILL)
    follow = harness(config, "logs", "box", run_id, "--follow")
    assert follow.returncode == 1 and follow.stderr.splitlines() == [
        f"harness: error: run {run_id} on box is lost: its supervisor ended without recording an outcome (the box rebooted or the "
        f"process was killed), and its stage may still be running: harness cancel box {run_id} stops what is provably the run's, then run it again"], follow
    status = harness(config, "status", "box", run_id)
    assert "lost" in status.stdout and "running" not in status.stdout, status.stdout  # the run, and its stage's row


@pytest.mark.ssh
@pytest.mark.parametrize("command", ["sync", "logs -f"])
def test_a_link_that_stalls_under_sync_or_logs_follow_ends_it_in_one_line(ssh_host, tmp_path, command):
    from bench.delayline import DelayLine
    from tests.fixtures.job_project import write_project

    with DelayLine(("127.0.0.1", ssh_host.port), rtt_ms=2, rate=2 * MiB) as line:
        config, env = slow_host(ssh_host, tmp_path, line.port, command.split()[0])
        project = tmp_path / "project"
        write_project(tmp_path / "unused", tmp_path / "host", {})  # the fake stages, on the host
        (project / "data").mkdir(parents=True)
        (project / "data" / "big.bin").write_bytes(os.urandom(8 * MiB))
        config.rename(project / "harness.toml")
        config = project / "harness.toml"
        config.write_text(config.read_text() + '[pipeline.stages.prepare]\nlines = 100\nsleep = 100\n[sync]\npaths = ["data"]\n')

        def harness_slow(*args: str, **kw) -> subprocess.Popen:
            return subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), *args], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)

        if command == "sync":
            proc = harness_slow("sync", "slow")
            deadline = time.monotonic() + 60
            while line.bytes_forwarded - line.bytes_to_client < 2 * MiB and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            started = harness_slow("run", "slow", "prepare", "--detach")
            run_id = started.communicate(timeout=60)[0].strip()
            assert started.returncode == 0 and run_id, started.stderr.read() if started.stderr else ""
            proc = harness_slow("logs", "slow", run_id, "--follow")
            assert "line 1 of 100" in proc.stdout.readline() + proc.stdout.readline()
        assert proc.poll() is None, proc.communicate()
        line.stall()
        out, err = proc.communicate(timeout=60)
        lines = err.strip().splitlines()
        print(f"{command}: rc {proc.returncode}: {err}")
        assert proc.returncode != 0 and len(lines) == 1 and lines[0].startswith("harness: error: ") and " slow" in lines[0], (proc.returncode, err)
        line.flow()
        if command == "sync":
            again = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "sync", "slow"], env=env, capture_output=True, text=True, timeout=60)
            assert again.returncode == 0, again.stderr
            assert sha(tmp_path / "host" / "data" / "big.bin") == sha(project / "data" / "big.bin")
        else:
            subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "cancel", "slow", run_id], env=env, capture_output=True, timeout=60)


# -------------------------------------------------------------------------------------------------
# The Docker engine restarted under a run: an engine of the test's own (the shared one serves the
# other lanes), with an image of a few files (a shell, sleep, cat and a `python` that sleeps)


def tiny_rootfs(root: Path) -> Path:
    import shutil

    for tool in ("sh", "sleep", "cat"):
        real = Path(os.path.realpath(shutil.which(tool)))
        libs = subprocess.run(["ldd", str(real)], capture_output=True, text=True).stdout
        for path in [str(real), *(w for w in libs.split() if w.startswith("/"))]:
            (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, root / path.lstrip("/"))
        (root / "bin").mkdir(exist_ok=True)
        if not (root / "bin" / tool).exists():
            (root / "bin" / tool).symlink_to(real)
    stage = root / "usr" / "bin" / "python3"
    stage.parent.mkdir(parents=True, exist_ok=True)
    stage.write_text('#!/bin/sh\n[ "$1" = -c ] && { echo "{}"; exit 0; }  # the supervisor\'s version probe\necho stage started\nexec sleep 120\n')
    stage.chmod(0o755)
    (root / "usr" / "bin" / "python").symlink_to("python3")
    for d in ("tmp", "proc", "sys", "dev", "etc"):
        (root / d).mkdir(exist_ok=True)
    return root


class PrivateEngine:
    def __init__(self, root: Path):
        self.root, self.sock = root, f"unix://{root}/d.sock"
        self.proc: subprocess.Popen | None = None
        # A bridge of its own: a dockerd started with `--bridge none` deletes the host's docker0,
        # the shared engine's network, under every other test.
        self.bridge = f"hfb{os.getpid()}"[:15]

    def start(self) -> None:
        if subprocess.run(["ip", "link", "show", self.bridge], capture_output=True).returncode != 0:
            for argv in (["link", "add", self.bridge, "type", "bridge"], ["addr", "add", "172.31.213.1/24", "dev", self.bridge], ["link", "set", self.bridge, "up"]):
                subprocess.run(["ip", *argv], capture_output=True, check=True)
        log = open(self.root / "dockerd.log", "ab")
        self.proc = subprocess.Popen(
            ["dockerd", "--host", self.sock, "--data-root", f"{self.root}/data", "--exec-root", f"{self.root}/x", "--pidfile", f"{self.root}/d.pid",
             "--bridge", self.bridge, "--iptables=false", "--ip6tables=false", "--ip-masq=false", "--storage-driver", "vfs",
             "--containerd-namespace", "harness-faults", "--containerd-plugins-namespace", "harness-faults-plugins"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while subprocess.run(["docker", "-H", self.sock, "info"], capture_output=True).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                bed_unavailable("private dockerd", (self.root / "dockerd.log").read_text()[-500:])
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(60)

    def crash(self) -> None:
        """The engine dies: dockerd, its containerd and the containers' shims, SIGKILL (each a
        process of this engine: its root is on their command lines)."""
        os.killpg(self.proc.pid, 9)
        self.proc.wait(60)
        for pid in subprocess.run(["pgrep", "-f", str(self.root)], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        time.sleep(0.3)
        # as a reboot leaves /run: a dockerd finding its containerd's pid file waits for that containerd
        (self.root / "x" / "containerd" / "containerd.pid").unlink(missing_ok=True)

    def remove(self) -> None:
        self.stop()
        subprocess.run(["umount", "-l", f"{self.root}/data"], capture_output=True)  # dockerd mounts its data root on itself
        shutil.rmtree(self.root, ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def detached_prepare_on(engine: "PrivateEngine", tmp_path: Path, path_first: Path | None = None) -> tuple[Path, dict, str, Path]:
    """`harness run box prepare --detach` in a container of the private engine, once its stage has
    started: (config, env, run id, stage directory). path_first: a directory put first on PATH."""
    from tests.fixtures.docker_engine import container_table
    from tests.fixtures.job_project import write_project

    tar = subprocess.run(["tar", "-C", str(tiny_rootfs(tmp_path / "rootfs")), "-c", "."], capture_output=True, check=True).stdout
    subprocess.run(["docker", "-H", engine.sock, "import", "-", "harness-fault-test:latest"], input=tar, capture_output=True, check=True, timeout=60)
    config = write_project(tmp_path / "project", tmp_path / "work", {}, host_table={"runtime": "docker"},
                           container=container_table("unused", image="harness-fault-test"))
    env = {**os.environ, "PYTHONPATH": str(REPO), "DOCKER_HOST": engine.sock, "COLUMNS": "300"}
    if path_first is not None:
        env["PATH"] = f"{path_first}:{env['PATH']}"
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "run", "box", "prepare", "--detach"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip()
    stage_dir = tmp_path / "work" / "runs" / run_id / "prepare"
    deadline = time.monotonic() + 30
    while "stage started" not in ((stage_dir / "log").read_text() if (stage_dir / "log").exists() else ""):
        assert time.monotonic() < deadline, list(stage_dir.iterdir())
        time.sleep(0.1)
    return config, env, run_id, stage_dir


@pytest.mark.docker
def test_a_docker_engine_restarted_under_a_run_shows_it_failed_not_running(tmp_path):
    import json
    import shutil
    import tempfile

    if not shutil.which("dockerd"):
        bed_unavailable("private dockerd", "dockerd is not installed")
    root = Path(tempfile.mkdtemp(prefix="hfd-"))  # short: the engine's sockets live under it
    engine = PrivateEngine(root)
    try:
        engine.start()
        config, env, run_id, stage_dir = detached_prepare_on(engine, tmp_path)
        engine.crash()  # the engine dies under the stage ...
        engine.start()  # ... and comes back (a restart)
        deadline = time.monotonic() + 60
        while (state := json.loads((stage_dir / "state.json").read_text()).get("state")) == "running":
            assert time.monotonic() < deadline, "the stage stayed running after the engine restarted"
            time.sleep(0.2)
        status = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "status", "box", run_id, "--json"], env=env,
                                capture_output=True, text=True, timeout=60)
        log = (stage_dir / "log").read_text()
        print(status.stdout, status.stderr, log)
        stage = json.loads(status.stdout)["stages"][0]
        if state == "ok":
            # The engine died (here as the container started: ci2 of 2026-12-06, a prepare of 1.6 s) and
            # came back while the container's processes still ran (containerd and the shim go on without
            # dockerd): it answered for the container again, and the container's own exit code, 0, ended
            # the stage
            assert stage["state"] == "ok" and stage["exit_code"] == 0, status.stdout
            assert re.search(r"^harness: the Docker engine went away under the stage \((docker start|docker wait): .+; its container may still be running", log, re.M), log
            return
        assert state == "failed" and stage["state"] == "failed", status.stdout
        # Which docker command loses the engine depends on when it dies: as the container starts or after.
        # Where the container's processes run without it, the supervisor waited for the engine: back, the
        # container had ended (or its processes were gone before it answered)
        assert re.match(r"the Docker engine went away under the stage \((docker start: .+\); its container is not running: run it again"
                        r"|(docker start|docker wait): .+\)( and came back; its container had ended \(exit \d+\): run it again"
                        r"|; its container ended while the engine was down \(its exit code is unknown: the stage's log says how it ended\)))$",
                        stage["last_event"]["error"]), status.stdout
    finally:
        engine.remove()


def cgroup_pids(container_id: str) -> list[int]:
    """The processes of a container, from their cgroups (the engine may be away)."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if container_id in Path(f"/proc/{entry}/cgroup").read_text():
                pids.append(int(entry))
    return pids


# `docker start` as it ends when dockerd dies after the container started but before its answer:
# the real start, then dockerd SIGKILLed, then the client's words for a connection cut short.
DOCKER_START_CUT = """#!/bin/sh
if [ "$1" = start ]; then
  "{docker}" "$@" > /dev/null || exit $?
  kill -9 "$(cat '{pidfile}')"
  echo 'error during connect: Post "http://%2Fd.sock/v1.41/containers/'"$2"'/start": EOF' >&2
  exit 1
fi
exec "{docker}" "$@"
"""


@pytest.mark.docker
@pytest.mark.parametrize("when", ["running", "starting"])
def test_a_killed_docker_engine_is_told_truly_and_cancel_still_stops_the_stage(tmp_path, when):
    """dockerd SIGKILLed under a stage (its containerd and the container live on): the run used to
    read `failed 125 ... its container is gone` within a second while the stage ran on to its end,
    its queue slot given away and cancel powerless. Now the stage stays running with a line that
    says its container may still run, `harness cancel` stops the container's processes, and once
    the engine is back `harness gc` removes the container left. `starting`: dockerd dies as
    `docker start` waits for its answer, the container already up (a race CI met). A private
    dockerd of the test's own (its own data and exec roots, socket and containerd): the shared
    engine is never touched."""
    import json
    import shutil
    import signal
    import tempfile

    if not shutil.which("dockerd"):
        bed_unavailable("private dockerd", "dockerd is not installed")
    root = Path(tempfile.mkdtemp(prefix="hfk-"))
    engine = PrivateEngine(root)
    container_id = "not yet"
    try:
        engine.start()
        shim = None
        if when == "starting":
            shim = tmp_path / "shim"
            shim.mkdir()
            (shim / "docker").write_text(DOCKER_START_CUT.format(docker=shutil.which("docker"), pidfile=root / "d.pid"))
            (shim / "docker").chmod(0o755)
        config, env, run_id, stage_dir = detached_prepare_on(engine, tmp_path, shim)

        def harness(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], env=env, capture_output=True, text=True, timeout=120)

        container_id = json.loads((stage_dir / "state.json").read_text())["container_id"]
        assert cgroup_pids(container_id)
        if when == "running":
            os.kill(engine.proc.pid, signal.SIGKILL)  # dockerd alone: its containerd and the container's shim live on
        engine.proc.wait(60)
        deadline = time.monotonic() + 30
        while "may still be running" not in (json.loads((stage_dir / "state.json").read_text()).get("error") or ""):
            assert time.monotonic() < deadline, (stage_dir / "state.json").read_text()
            time.sleep(0.2)
        stage = json.loads(harness("status", "box", run_id, "--json").stdout)["stages"][0]
        assert stage["state"] == "running", stage  # not failed while its container runs: its GPUs stay held
        assert stage["last_event"]["event"] == "warning", stage
        step = "docker start" if when == "starting" else "(docker start|docker wait)"  # (a race: CI met `docker start` too)
        assert re.match(rf"the Docker engine went away under the stage \({step}: .+\); its container may still be running: waiting for the engine "
                        r"\(harness cancel stops it\)$", stage["last_event"]["text"]), stage
        assert cgroup_pids(container_id)  # it does run on
        r = harness("cancel", "box", run_id)
        assert r.returncode == 0, r.stderr
        deadline = time.monotonic() + 60
        while json.loads((stage_dir / "state.json").read_text()).get("state") == "running":
            assert time.monotonic() < deadline, "the cancel did not end the stage"
            time.sleep(0.2)
        assert json.loads((stage_dir / "state.json").read_text())["state"] == "cancelled"
        assert cgroup_pids(container_id) == []  # cancel stopped the container's processes without the engine
        (root / "x" / "containerd" / "containerd.pid").unlink(missing_ok=True)  # its containerd died with it (dockerd's child)
        engine.start()  # the engine is back: the container it had is left, exited
        dry = harness("gc", "box", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        assert [c["name"] for c in json.loads(dry.stdout)["containers"]] == [f"harness-{run_id}-prepare"]
        assert harness("gc", "box").returncode == 0
        assert subprocess.run(["docker", "-H", engine.sock, "ps", "-aq"], capture_output=True, text=True, timeout=60).stdout.strip() == ""
    finally:
        for pid in cgroup_pids(container_id):  # the stage's own, should the cancel have failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        with contextlib.suppress(ProcessLookupError):
            engine.crash()  # every process of this engine (its containerd too), then its files
        for pid in subprocess.run(["pgrep", "-f", str(root)], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        for line in Path("/proc/mounts").read_text().splitlines():  # what the killed engine left mounted (network namespaces)
            if line.split()[1].startswith(str(root) + "/x/"):
                subprocess.run(["umount", "-l", line.split()[1]], capture_output=True)
        engine.remove()


@pytest.mark.ssh
def test_logs_follow_whose_ssh_master_is_killed_ends_in_the_link_line_and_255(ssh_host, tmp_path):
    """The SSH master under `logs -f` killed (the laptop's side of the link gone): not a silent exit
    0, but the connection line and 255; the run goes on on the box."""
    import signal

    from bench.delayline import DelayLine

    with DelayLine(("127.0.0.1", ssh_host.port), rtt_ms=2, rate=64 * MiB) as line:
        config, env = slow_stage_project(ssh_host, tmp_path, line.port, "master")

        def harness_cli(*args: str) -> subprocess.Popen:
            return subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), *args], env=env, stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

        started = harness_cli("run", "slow", "prepare", "--detach")
        run_id = started.communicate(timeout=60)[0].strip()
        assert started.returncode == 0 and run_id, started.stderr.read() if started.stderr else ""
        follow = harness_cli("logs", "slow", run_id, "--follow")
        assert "line 1 of 100" in follow.stdout.readline() + follow.stdout.readline()
        [socket_path] = [p for p in Path(env["HARNESS_CONTROL_DIR"]).rglob("*") if p.is_socket()]
        check = subprocess.run(["ssh", "-O", "check", "-S", str(socket_path), "x"], capture_output=True, text=True, timeout=30)
        master = int(check.stderr.split("pid=")[1].split(")")[0])
        os.kill(master, signal.SIGKILL)
        out, err = follow.communicate(timeout=60)
        assert follow.returncode == 255, (follow.returncode, err)
        assert err.strip().splitlines() == ["harness: error: the connection ended during supervisor.py on slow (the link dropped, or its SSH master "
                                            "was stopped); what it ran there may still be running (run the command again once the host answers "
                                            "(`harness doctor HOST`))"], err
        status = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "status", "slow", run_id], env=env, capture_output=True, text=True, timeout=60)
        assert "running" in status.stdout, status.stdout + status.stderr
        subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "cancel", "slow", run_id], env=env, capture_output=True, timeout=60)


@pytest.mark.ssh
def test_ctrl_c_while_a_run_starts_names_the_run_that_may_be_running(ssh_host, tmp_path):
    """Ctrl-C after the box made the run but before its answer came back (a slow link): not
    `harness: aborted`, but the run's id, where it may be running, and how to see and stop it."""
    import signal

    from bench.delayline import DelayLine

    with DelayLine(("127.0.0.1", ssh_host.port), rtt_ms=600, rate=64 * MiB) as line:
        config, env = slow_stage_project(ssh_host, tmp_path, line.port, "ctrl-c", keepalive=5)
        proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "run", "slow", "prepare"], env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while not list((tmp_path / "host" / "runs").glob("*/run.json")) if (tmp_path / "host" / "runs").is_dir() else True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        [run_dir] = (tmp_path / "host" / "runs").glob("*/run.json")
        run_id = run_dir.parent.name
        assert proc.returncode == 130, (out, err)
        assert err.strip().splitlines()[-1] == (f"harness: error: interrupted while starting run {run_id} on slow; it may be running there "
                                                f"(`harness status slow {run_id}` says; `harness cancel slow {run_id}` stops it)"), err
        subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "cancel", "slow", run_id], env=env, capture_output=True, timeout=60)

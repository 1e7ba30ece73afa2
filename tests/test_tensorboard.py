"""`harness tensorboard HOST [RUN]`: TensorBoard started on the box behind the test sshd over a
run's training-logger directory (real event files), read through the forward with urllib, out of
reach of another local user (no TCP port; its unix socket refuses them), and stopped on the box
when harness is stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.fixtures.requires import require_module
from tests.fixtures.sshd import free_port

pytestmark = pytest.mark.ssh
DEADLINE_S = 240
RUN_ID = "20260101-120000-abcdef"


def write_config(tmp_path: Path, ssh_host, container: dict | None = None) -> tuple[Path, Path]:
    """box over the test sshd; with `container`, runtime docker and that [hosts.box.container]."""
    from tests.fixtures.job_project import toml_value

    workdir = tmp_path / "work"
    config = tmp_path / "harness.toml"
    lines = ["[hosts.box]", f'ssh = "{ssh_host.alias}"', f'workdir = "{workdir}"', f'python = "{sys.executable}"']
    if container:
        lines += ['runtime = "docker"', "[hosts.box.container]", *(f"{k} = {toml_value(v)}" for k, v in container.items())]
    config.write_text("\n".join(lines) + "\n")
    return config, workdir


def write_events(logdir: Path, run: str, losses: list[float]) -> None:
    from torch.utils.tensorboard import SummaryWriter

    with SummaryWriter(str(logdir / run)) as w:
        for step, loss in enumerate(losses):
            w.add_scalar("train/loss", loss, step)



def get_json(url: str):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def test_tensorboard_of_a_run_is_served_through_the_forward_only_and_stopped_with_harness(ssh_host, tmp_path, other_user):
    require_module("tensorboard")
    config, workdir = write_config(tmp_path, ssh_host)
    serve_and_stop(config, workdir, ssh_host, other_user)


@pytest.mark.docker
def test_tensorboard_in_the_stages_container_is_reached_by_docker_exec_only_and_stopped(ssh_host, tmp_path, docker_base_image, harness_test_image, other_user):
    """runtime docker: TensorBoard runs in a container like the stages' (docker's bridge network,
    no port published), on a unix socket in the container, reached through `docker exec`. The test image has no ML stack: this
    interpreter (with tensorboard) is mounted into it read-only and named as the container's python."""
    require_module("tensorboard")
    from tests.fixtures.docker_engine import container_table

    # this environment (a virtualenv: its site-packages) and the interpreter it links to, unless
    # that is the system's /usr (the test image's own Python 3.11 then stands in for it)
    prefixes = sorted({Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()} - {Path("/usr")})
    mounts = [f"{prefix}:{prefix}:ro" for prefix in prefixes]
    config, workdir = write_config(tmp_path, ssh_host, container_table(docker_base_image, mounts=mounts, python=sys.executable))
    # Containers that mount this test's workdir: TensorBoard's, never another lane's (tests/fixtures/lanes.py).
    ours = ["docker", "ps", "-q", "--filter", f"volume={workdir}"]
    assert subprocess.run(ours, capture_output=True, text=True).stdout.split() == []
    serve_and_stop(config, workdir, ssh_host, other_user, expect_container=True)
    deadline = time.monotonic() + DEADLINE_S
    while subprocess.run(ours, capture_output=True, text=True).stdout.split():
        assert time.monotonic() < deadline, "TensorBoard's container outlived harness"
        time.sleep(0.5)


def serve_and_stop(config: Path, workdir: Path, ssh_host, other_user, expect_container: bool = False) -> None:
    # another draft's logs in the store, and the run's own draft (its train artifact, as its record names it)
    write_events(workdir / "outputs" / "artifacts" / "train" / DRAFTS[0] / "logs", "another", [2.0, 1.5])
    run_dir = workdir / "runs" / RUN_ID
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": RUN_ID, "workdir": str(workdir), "store": "outputs/artifacts", "recipes": {"train": {}},
                                                  "artifacts": {"train": {"key": DRAFTS[1], "role": "made", "made_by": RUN_ID}}}))
    logdir = workdir / "outputs" / "artifacts" / "train" / DRAFTS[1] / "logs"
    write_events(logdir, "recorded", [3.0, 2.0, 1.0])

    local = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "tensorboard", "box", RUN_ID, "--port", str(local)],
                            env=ssh_host.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.split()[:1] == [f"http://127.0.0.1:{local}"], (line, proc.stderr.read() if proc.poll() is not None else "")
        assert ("(container " in line) == expect_container, line
        runs = get_json(f"http://127.0.0.1:{local}/data/runs")
        assert runs == ["recorded"], runs  # the run's own draft's logs, not another's
        scalars = get_json(f"http://127.0.0.1:{local}/data/plugin/scalars/scalars?run=recorded&tag=train%2Floss")
        assert [(step, value) for _, step, value in scalars] == [(0, 3.0), (1, 2.0), (2, 1.0)]
        assert_out_of_reach(other_user, tensorboards_over(logdir))
    finally:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 0 and f"TensorBoard on box over {logdir}" in err, err
    assert_stopped_on_the_box(logdir)


def assert_out_of_reach(other_user, boards: list[int]) -> None:
    """TensorBoard (its one process on the box) listens on no TCP port, in whatever network
    namespace it runs (the host's, or its container's), and its unix socket refuses another uid
    (host: a 0700 directory; container: a path of the container's own file system)."""
    assert len(boards) == 1, boards
    pid = boards[0]
    family = {pid}
    for _ in range(3):  # its descendants (TensorBoard's fast loader is a server process of its own)
        family |= {child for child, (parent, _) in processes().items() if parent in family}
    held = set()
    for member in family:
        for fd in Path(f"/proc/{member}/fd").iterdir():
            try:
                held.add(os.readlink(fd))
            except OSError:
                pass  # closed meanwhile
    listening = set()
    for table in ("tcp", "tcp6"):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == "0A":  # LISTEN
                listening.add(f"socket:[{fields[9]}]")
    assert held & listening == set(), "TensorBoard listens on a TCP port"
    socket_path = served_socket(pid, held)
    assert other_user.connect_unix(socket_path) in ("EACCES", "ENOENT")  # the ENOENT of a path only the container has


def served_socket(pid: int, held: set[str]) -> str:
    """The path of the unix socket TensorBoard (pid) serves on: one of the sockets it holds, as its
    network namespace's table names it."""
    for row in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:]:
        fields = row.split()
        if len(fields) == 8 and fields[7].endswith("/tensorboard.sock") and f"socket:[{fields[6]}]" in held:
            return fields[7]
    raise AssertionError(f"TensorBoard ({pid}) holds no tensorboard.sock")


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process on this machine (the box)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                found[int(entry.name)] = (ppid, (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace"))
            except (OSError, IndexError, ValueError):
                pass  # it ended meanwhile
    return found


# TensorBoard's process on the box: the host helper, `python -c BOOT tensorboard_server.py SIZE`
# (harness/helpers.py), its request on stdin
SERVER = b"tensorboard_server.py"


def tensorboards_over(logdir: Path) -> list[int]:
    """TensorBoard's processes on the box over logdir: the helper whose working directory (the
    workdir it runs in: the host's, or the container's, mounted at the same path) holds logdir."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1] if entry.name.isdigit() else []
            if len(argv) == 5 and argv[1] == b"-c" and argv[3] == SERVER and str(logdir).startswith(os.readlink(entry / "cwd") + "/"):
                found.append(int(entry.name))
        except OSError:
            continue  # it ended meanwhile
    return found


def start_board(config: Path, ssh_host, logdir: Path, *run: str) -> tuple[subprocess.Popen, int]:
    """`harness tensorboard box [RUN]` in a session of its own (so that the test can end whatever
    it left); returns it once it printed its URL, with the local port."""
    local = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "tensorboard", "box", *run,
                             "--port", str(local)], start_new_session=True,
                            env=ssh_host.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    assert line.split()[:1] == [f"http://127.0.0.1:{local}"], (line, proc.stderr.read() if proc.poll() is not None else "")
    assert tensorboards_over(logdir), "no TensorBoard process on the box"
    return proc, local


def assert_stopped_on_the_box(logdir: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while tensorboards_over(logdir):
        assert time.monotonic() < deadline, f"TensorBoard still runs on the box: {tensorboards_over(logdir)}"
        time.sleep(0.5)


def end_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of this harness is left (its ssh clients)
    except ProcessLookupError:
        pass
    proc.wait(DEADLINE_S)


DRAFTS = ("a" * 20, "b" * 20)  # two trained drafts' artifact keys


def test_without_run_every_draft_of_the_store_is_served_and_a_killed_harness_stops_it(ssh_host, tmp_path):
    """No RUN: every trained draft's logger directory in the store (<output_dir>/artifacts/train/
    <key>/logs/), one TensorBoard run each. kill -9 of harness (no handler runs) still stops
    TensorBoard on the box."""
    require_module("tensorboard")
    config, workdir = write_config(tmp_path, ssh_host)
    logdir = workdir / "outputs" / "artifacts" / "train"
    write_events(logdir / DRAFTS[0] / "logs", "first", [2.0, 1.5])
    write_events(logdir / DRAFTS[1] / "logs", "second", [4.0, 3.0, 2.0])
    proc, local = start_board(config, ssh_host, logdir)
    try:
        second = f"{DRAFTS[1]}/logs/second"
        assert sorted(get_json(f"http://127.0.0.1:{local}/data/runs")) == [f"{DRAFTS[0]}/logs/first", second]
        scalars = get_json(f"http://127.0.0.1:{local}/data/plugin/scalars/scalars?run={urllib.parse.quote(second, safe='')}&tag=train%2Floss")
        assert [(step, value) for _, step, value in scalars] == [(0, 4.0), (1, 3.0), (2, 2.0)]
        proc.kill()
        proc.wait(DEADLINE_S)
        assert_stopped_on_the_box(logdir)
    finally:
        end_session(proc)


def test_a_dropped_link_stops_tensorboard_on_the_box(ssh_host, tmp_path):
    """The connection TensorBoard runs on goes away (its ssh client killed: the box sees the
    connection close, as when a laptop's link goes down and TCP says so): it stops on the box."""
    require_module("tensorboard")
    config, workdir = write_config(tmp_path, ssh_host)
    logdir = workdir / "outputs" / "artifacts" / "train"
    write_events(logdir / DRAFTS[0] / "logs", "only", [1.0])
    proc, _ = start_board(config, ssh_host, logdir)
    try:
        table = processes()
        ours = {proc.pid}
        for _ in range(4):  # harness's descendants
            ours |= {pid for pid, (ppid, _) in table.items() if ppid in ours}
        links = [pid for pid in ours if table[pid][1].startswith("ssh ") and SERVER.decode() in table[pid][1]]
        assert len(links) == 1, [table[pid][1] for pid in ours]
        os.kill(links[0], signal.SIGKILL)
        assert_stopped_on_the_box(logdir)
    finally:
        end_session(proc)

def test_no_logs_is_one_error_line(ssh_host, tmp_path):
    config, workdir = write_config(tmp_path, ssh_host)
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "tensorboard", "box"],
                       env=ssh_host.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 2
    assert r.stderr.splitlines() == [f'harness: error: no training logs at {workdir}/outputs/artifacts/train: '
                                     'train with loggers = ["tensorboard"] in [pipeline.stages.train]']


def test_tensorboard_missing_where_the_stages_run_is_one_error_line(ssh_host, tmp_path):
    # this interpreter without its site-packages (-S): the standard library only, no tensorboard
    python = tmp_path / "python-without-site-packages"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    assert subprocess.run([python, "-c", "import tensorboard"], capture_output=True).returncode != 0
    workdir = tmp_path / "work"
    write_events(workdir / "outputs" / "artifacts" / "train" / DRAFTS[0] / "logs", "a", [1.0])
    config = tmp_path / "harness.toml"
    config.write_text(f'[hosts.box]\nssh = "{ssh_host.alias}"\nworkdir = "{workdir}"\npython = "{python}"\n')
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "tensorboard", "box"],
                       env=ssh_host.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 2
    assert r.stderr.splitlines() == ['harness: error: tensorboard is not installed where the stages run: install it there (docker hosts: '
                                     'harness build, the ML image carries it)']

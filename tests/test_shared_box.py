"""The container path as a shared GPU box lives with it: the box user is not root but a member of
the docker group, and another uid (the neighbour) uses the same machine. What a stage, `exec`, `shell` or
the start check writes is the box user's and private to them; nothing of the neighbour's shared
memory is in a container's reach, and the container's own /dev/shm has the configured size."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.docker_engine import container_table
from tests.fixtures.job_project import run_in_pty, write_project

pytestmark = [pytest.mark.docker, pytest.mark.ssh]


def harness(config: Path, env: dict, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=timeout, env=env)


def not_private(root: Path, uid: int, synced: frozenset[str] = frozenset()) -> list[str]:
    """Every path under root that is not the user's, or that others may read, write or enter
    (a synced file keeps the laptop's permission bits, inside the 0700 workdir)."""
    found = []
    for path in [root, *root.rglob("*")]:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            continue
        if st.st_uid != uid or (st.st_mode & 0o077 and str(path.relative_to(root)) not in synced):
            found.append(f"{path} {st.st_uid}:{st.st_gid} {stat.filemode(st.st_mode)}")
    return found


def test_what_a_box_user_runs_in_the_container_is_theirs_and_private(tmp_path, ssh_host, box_user, other_user, harness_test_image, docker_base_image):
    """Before: every container ran as root: outputs/ and the HF cache root's (the box user could
    not remove them), files 0644, and `--ipc=host` put the neighbour's /dev/shm in reach."""
    home = Path(pwd.getpwnam(box_user.name).pw_dir)
    workdir = home / f"harness-{tmp_path.name}"
    hf_cache = home / ".cache" / "huggingface"
    shm = Path(f"/dev/shm/harness-neighbour-{os.getpid()}")
    config = write_project(tmp_path / "project", workdir, {"prepare": {"lines": 2}},
                           host_table={"local": False, "ssh": f"{box_user.name}@{ssh_host.alias}", "connect_timeout": 5, "runtime": "docker"},
                           container=container_table(docker_base_image))
    for path in [workdir, *workdir.rglob("*")]:  # the stand-in stages, as the box user's first sync would leave them
        shutil.chown(path, box_user.uid, box_user.gid)
        path.chmod(path.stat().st_mode & 0o700)
    shm.write_text("the neighbour's")
    os.chown(shm, other_user.uid, other_user.gid)
    shm.chmod(0o600)
    env = ssh_host.env()
    try:
        r = harness(config, env, "run", "box", "prepare")
        assert r.returncode == 0, r.stdout + r.stderr
        r = harness(config, env, "exec", "box", "--", "sh", "-c",
                    'mkdir -p outputs/by-exec && echo x > outputs/by-exec/file && echo x > "$HF_HOME/by-exec" && echo x > "$HOME/.rc" && '
                    'id -u && ls -a /dev/shm && df -k /dev/shm')
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == str(box_user.uid)  # the container ran as the box user
        assert shm.name not in r.stdout  # a private IPC namespace: the neighbour's shared memory is not there
        shm_kib = int(lines[-1].split()[1])
        assert 0.9 * 2**20 <= shm_kib <= 1.1 * 2**20, lines[-1]  # container.shm_size = "1g" took effect
        # `harness shell`, typed into a terminal as a person would, writes as the box user too
        code, out = run_in_pty([sys.executable, "-m", "harness", "--config", str(config), "shell", "box"],
                               b'mkdir -p outputs/by-shell && echo x > outputs/by-shell/file && echo "uid=$(id -u)"; exit\n', env=env)
        assert code == 0 and f"uid={box_user.uid}" in out, out
        assert (workdir / "outputs" / "by-shell" / "file").is_file()
        made = list((workdir / "outputs").rglob("made.json"))
        assert made, "the stage wrote no output"
        synced = frozenset(json.loads((workdir / ".harness" / "sync-manifest.json").read_text())["files"])
        assert "harness.toml" in synced
        assert not_private(workdir, box_user.uid, synced) == []
        assert not_private(hf_cache, box_user.uid) == []
        # the neighbour reads nothing of the run
        assert other_user.run(["cat", str(made[0])]).returncode != 0
        # and the box user removes what the stages wrote, without sudo or `harness exec`
        removed = box_user.run(["rm", "-rf", str(workdir / "outputs")])
        assert removed.returncode == 0, removed.stderr
    finally:
        shm.unlink(missing_ok=True)
        subprocess.run(["rm", "-rf", str(workdir), str(hf_cache / "by-exec")], check=False)


def containers_of(workdir: Path) -> list[str]:
    r = subprocess.run(["docker", "ps", "-a", "--filter", f"label=harness.workdir={workdir}", "--format", '{{.ID}} {{.Status}} {{.Label "harness.client"}}'],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def test_an_interrupted_exec_leaves_no_container(tmp_path, ssh_host, box_user, harness_test_image, docker_base_image):
    """Ctrl-C under `harness exec` without --pty ends the laptop's ssh; nothing signals the box's
    side, so `docker run` lived on until its next write and its container after it, unlabelled.
    Now every container harness starts carries the workdir (and a foreground one its client's pid),
    and a watcher beside the docker client removes the container once the session is gone."""
    import signal
    import time

    home = Path(pwd.getpwnam(box_user.name).pw_dir)
    workdir = home / f"harness-{tmp_path.name}"
    config = write_project(tmp_path / "project", workdir, {},
                           host_table={"local": False, "ssh": f"{box_user.name}@{ssh_host.alias}", "connect_timeout": 5, "runtime": "docker"},
                           container=container_table(docker_base_image))
    for path in [workdir, *workdir.rglob("*")]:
        shutil.chown(path, box_user.uid, box_user.gid)
    env = ssh_host.env()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "exec", "box", "--", "sh", "-c", "echo started; exec sleep 300"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:
            assert proc.stdout.readline() == b"started\n", proc.stderr.read1()
            running = containers_of(workdir)
            settle = time.monotonic() + 10  # dockerd may still say "Created" just after the process began (seen under load)
            while len(running) == 1 and " Up " not in f" {running[0]} " and time.monotonic() < settle:
                time.sleep(0.2)
                running = containers_of(workdir)
            assert len(running) == 1 and " Up " in f" {running[0]} " and running[0].split()[-1].isdigit(), running  # labelled: its workdir, its client's pid
            os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal's whole process group, ssh included
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while containers_of(workdir) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert containers_of(workdir) == []
    finally:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)

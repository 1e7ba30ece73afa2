"""The default workdir, `~/harness`, on a real sshd: run, status, logs and pull find it where the
host's shell puts `~`, and none of them needs SFTP (one SSH client path: OpenSSH).

The sshd here gives its sessions a home of the test's own (`SetEnv HOME=...`), so nothing is
written to the real home directory; SFTP would still start in the account's real home (sshd
changes to it before the subsystem starts), so a path that asked SFTP for `~` would land
elsewhere and fail these tests.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.sync import MANIFEST_PATH
from tests.fixtures.job_project import expected_log, log_lines, write_project
from tests.fixtures.sshd import start_sshd


@pytest.fixture(scope="module")
def home_box(ssh_host, tmp_path_factory):
    """An sshd whose sessions' HOME is a fresh directory; (home, sshd, ssh_config, known_hosts)."""
    root = tmp_path_factory.mktemp("homebox")
    home = root / "home"
    home.mkdir()
    server = start_sshd(root, "sshd", "127.0.0.1", ssh_host.root / "authorized_keys", log_level="DEBUG1", extra_config=f"SetEnv HOME={home}\n")
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"{server.known_hosts_name} {server.host_pub_line}\n")
    ssh_config = root / "ssh_config"
    ssh_config.write_text(f"Host homebox\n  HostName 127.0.0.1\n  Port {server.port}\n  User {ssh_host.user}\n  IdentityFile {ssh_host.key_path}\n"
                          f"  IdentitiesOnly yes\n  UserKnownHostsFile {known_hosts}\n")
    yield home, server, ssh_config, known_hosts
    server.stop()


@pytest.mark.ssh
def test_run_status_logs_and_pull_with_the_default_workdir(home_box, ssh_host, tmp_path):
    home, server, ssh_config, known_hosts = home_box
    workdir = home / "harness"
    # the fake stage scripts in the workdir; the config names no workdir: the default, ~/harness
    config = write_project(tmp_path / "project", workdir, {"prepare": {"lines": 2}, "train": {"lines": 3}}, host_table={"local": False, "ssh": "homebox", "connect_timeout": 5})
    config.write_text("\n".join(line for line in config.read_text().splitlines() if not line.startswith("workdir = ")) + "\n")
    env = ssh_host.env()
    env.update(HARNESS_SSH_CONFIG=str(ssh_config), HARNESS_KNOWN_HOSTS=str(known_hosts))

    def harness(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    connections = server.log_text().count("Connection from ")
    r = harness("run", "box", "prepare", "train")
    assert r.returncode == 0, r.stderr
    # train is distributed: its GPU probe rides the launch's client (the OpenSSH master), so the
    # start opened one connection, not a second one of paramiko's
    assert server.log_text().count("Connection from ") - connections == 1
    run_id = r.stdout.splitlines()[0]
    run_dir = workdir / "runs" / run_id
    record = json.loads((run_dir / "run.json").read_text())
    assert record["workdir"] == str(workdir)  # expanded on the host, in the launch itself
    # `harness run` synced first (over the same connection): the run records that sync's digest
    assert record["manifest_hash"] == json.loads((workdir / MANIFEST_PATH).read_text())["digest"]
    assert json.loads((run_dir / "train" / "spec.json").read_text())["command"][-2:] == ["--events", f"{run_dir}/train/events.jsonl"]
    assert "prepare_data: pid" in (run_dir / "prepare" / "log").read_text() and f"cwd {workdir}" in (run_dir / "prepare" / "log").read_text()

    status = harness("status", "box", "last", "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["state"] == "ok"
    logs = harness("logs", "box", run_id)
    assert log_lines(logs.stdout) == expected_log("prepare_data", 2) + expected_log("train_draft", 3)

    pulled = harness("pull", "box", "last", "out")
    assert pulled.returncode == 0, pulled.stderr
    assert (tmp_path / "out" / "run.json").read_bytes() == (run_dir / "run.json").read_bytes()
    assert (tmp_path / "out" / "train" / "log").read_bytes() == (run_dir / "train" / "log").read_bytes()
    by_default = harness("pull", "box", run_id, "--include", "log")
    assert by_default.returncode == 0, by_default.stderr
    pulled_to = config.parent / "runs" / run_id  # by default: runs/RUN_ID beside harness.toml, from any directory
    assert sorted(p.relative_to(pulled_to).as_posix() for p in pulled_to.rglob("*") if p.is_file()) == ["prepare/log", "train/log"]
    # one SSH client path: no command above opened SFTP (paramiko's home() or put_bytes)
    assert "subsystem request for sftp" not in server.log_text()

"""The product, not the user's ssh config, decides host-key checking: a user ssh_config that says
`StrictHostKeyChecking no` (or `accept-new`) still gets an unknown key refused, on every path that
connects: exec through OpenSSH (cold and with a master already up) and through paramiko, sync,
pull (its listing and each OpenSSH stream), shell, forward (its probe and its own `ssh -L`), and a
host behind an unknown jump host."""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from harness.config import HostConfig
from harness.errors import HostKeyError
from harness.transport import connect
from harness.transport.base import PortForward
from tests.fixtures.sshd import free_port, write_harness_config

pytestmark = pytest.mark.ssh


@pytest.fixture(params=["no", "accept-new"])
def weak_user(request, ssh_host, tmp_path):
    """The test bed as seen by a user whose ssh_config weakens host-key checking and whose
    known_hosts knows `behind` but not `box` (so `behind` is reached through an unknown jump)."""
    config = tmp_path / "ssh_config"
    config.write_text(ssh_host.ssh_config.read_text().replace(str(ssh_host.known_hosts), str(tmp_path / "known_hosts"))
                      + f"\nHost *\n  StrictHostKeyChecking {request.param}\n")
    known = tmp_path / "known_hosts"
    known.write_text(f"{ssh_host.behind.known_hosts_name} {ssh_host.behind.host_pub_line}\n")
    control = Path(tempfile.mkdtemp(prefix="hk-"))  # short: unix socket paths are limited
    bed = dataclasses.replace(ssh_host, ssh_config=config, known_hosts=known, control_dir=control)
    yield bed
    shutil.rmtree(control, ignore_errors=True)


def harness(config: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def assert_refused(r: subprocess.CompletedProcess, bed, what: str) -> None:
    assert r.returncode == 255, f"{what}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("harness: error:") and "unknown host key" in last, f"{what}: {r.stderr}"
    assert bed.known_hosts.read_text() == f"{bed.behind.known_hosts_name} {bed.behind.host_pub_line}\n", what  # nothing recorded


def test_every_command_refuses_an_unknown_key(weak_user, tmp_path):
    env = weak_user.env()
    config = write_harness_config(tmp_path, weak_user)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_bytes(b"x" * 1000)
    for what, args in [
        ("exec (OpenSSH master)", ["exec", "box", "--", "true"]),
        ("exec again", ["exec", "box", "--", "true"]),
        ("exec --pty (paramiko)", ["exec", "--pty", "box", "--", "true"]),
        ("exec behind an unknown jump host", ["exec", "behind", "--", "true"]),
        ("exec --pty behind an unknown jump host", ["exec", "--pty", "behind", "--", "true"]),
        ("sync", ["sync", "box"]),
        ("pull -j 4", ["pull", "box", str(tmp_path / "src"), str(tmp_path / "dest"), "-j", "4"]),
        ("shell", ["shell", "box"]),
        ("forward", ["forward", "box", "9"]),
        ("forward behind an unknown jump host", ["forward", "behind", "9"]),
    ]:
        assert_refused(harness(config, *args, env=env), weak_user, what)
    assert not (tmp_path / "dest" / "f").exists()
    assert not [p for p in weak_user.control_dir.iterdir() if p.is_socket()]  # no master was ever opened


def test_a_master_opened_with_the_key_known_is_not_reused_when_it_is_not(weak_user, ssh_host, tmp_path):
    """The warm path: a ControlMaster is up (opened by the same user with box's key known); a call
    whose known_hosts does not know box must not ride on it."""
    trusting = dataclasses.replace(ssh_host, control_dir=weak_user.control_dir)
    config = write_harness_config(tmp_path, weak_user)
    r = harness(config, "exec", "box", "--", "true", env=trusting.env())
    assert r.returncode == 0, r.stderr
    assert [p for p in weak_user.control_dir.iterdir() if p.is_socket()]  # the master is warm
    assert_refused(harness(config, "exec", "box", "--", "true", env=weak_user.env()), weak_user, "warm exec")
    subprocess.run(["ssh", "-S", str(next(p for p in weak_user.control_dir.iterdir() if p.is_socket())), "-O", "exit", "x"],
                   capture_output=True, timeout=10)


def test_every_openssh_command_line_refuses_an_unknown_key(weak_user, monkeypatch):
    """The OpenSSH command lines harness builds (bulk transfers through the master, and each
    pull stream's own connection) refuse by themselves, with no paramiko check in front."""
    monkeypatch.setenv("HARNESS_CONTROL_DIR", str(weak_user.control_dir))
    for name in ("box", "behind"):
        transport = connect(HostConfig(name=name, ssh=name), weak_user.connect_options())
        for argv in (transport.local_argv(["true"]), transport.own_connection_argv(["true"])):
            r = subprocess.run(argv, env=weak_user.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
            assert r.returncode == 255 and "Permanently added" not in r.stderr, (name, argv, r.stderr)
            if name == "box":  # (behind: a master's ProxyJump hop prints to /dev/null)
                assert "Host key verification failed" in r.stderr, (argv, r.stderr)
        with pytest.raises(HostKeyError, match="unknown host key"):  # the port forward's own `ssh -L`
            transport.forward([PortForward(free_port(), 9)])
        transport.close()
    assert weak_user.known_hosts.read_text() == f"{weak_user.behind.known_hosts_name} {weak_user.behind.host_pub_line}\n"

"""One host-key policy on every client path (issue #31, item 1): the same table of cases, run
against the real sshd (tests/fixtures/sshd.py) through each way harness connects, must give the
same verdict: paramiko (Transport.run), and OpenSSH as a channel of the master (Transport.stream),
a connection of its own (stream channel=OWN), a TCP channel of the master (stream_to: pull's
further streams), the exec path (exec_foreground: its own `ssh -f -N` master), the port
forward's own `ssh -L`, and `harness exec` itself, whose warm form runs from a recipe an earlier
exec left (transport/warm_exec.py): where a case opens a master first, this path leaves a
recipe too, which must then be refused. Both clients keep their own readers of ssh_config and known_hosts; this
table is what holds them to one rule. Nothing refused is ever recorded in known_hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar

import pytest

from harness.config import HostConfig
from harness.errors import HostKeyError
from harness.transport import ConnectOptions, connect
from harness.transport.base import OWN, PortForward
from harness.transport.warm_exec import RACY_NS
from tests.fixtures.streams import output_of
from tests.fixtures.sshd import SSHD, SSHHost, free_port, stop_control_masters

pytestmark = pytest.mark.ssh

UNKNOWN, CHANGED, OK = "unknown host key", "CHANGED", "ok"


def _paramiko(t, target: SSHD) -> None:
    r = t.run(["true"])
    assert r.ok, r


def _master_channel(t, target: SSHD) -> None:
    output_of(t.stream(["true"], stdin=False), "true")


def _own_connection(t, target: SSHD) -> None:
    output_of(t.stream(["true"], channel=OWN, stdin=False), "true")


def _tcp_channel(t, target: SSHD) -> None:
    proc = t.stream_to(target.address, target.port)  # to the host's own sshd: its banner says we got there
    try:
        if proc.stdout.read(4) != b"SSH-":
            raise proc.error(f"ssh -W {target.address}:{target.port}")
    finally:
        proc.stop()


def _exec(t, target: SSHD) -> None:
    assert t.exec_foreground(["true"]) == 0


def _forward(t, target: SSHD) -> None:
    t.forward([PortForward(free_port(), target.port, target.address)]).close()


def _harness_exec(t, target: SSHD) -> None:
    r = Files.current.harness_exec(t.name)
    error = r.stderr.decode().strip()
    if r.returncode != 0:
        raise (HostKeyError if "host key" in error else AssertionError)(error)


PATHS: dict[str, Callable] = {
    "paramiko": _paramiko,
    "openssh-master-channel": _master_channel,
    "openssh-own-connection": _own_connection,
    "openssh-tcp-channel": _tcp_channel,
    "openssh-exec-master": _exec,
    "openssh-forward": _forward,
    "harness-exec": _harness_exec,
}


@dataclass
class Files:
    """One case's client files: ssh_config, known_hosts, the control sockets' directory."""

    bed: SSHHost
    ssh_config: Path
    known_hosts: Path
    control_dir: Path
    harness_toml: Path
    with_recipe: bool = False  # warm_master also leaves a warm exec's recipe (the harness-exec path)
    current: ClassVar["Files"]  # the running case's (the path functions take a transport)

    def config(self, alias_to: SSHD, proxy_jump: str = "", extra: str = "") -> None:
        """The bed's `box` and `behind`, with `box` pointing at alias_to."""
        bed = self.bed
        self.ssh_config.write_text(
            f"Host box\n  HostName {alias_to.address}\n  Port {alias_to.port}\n  User {bed.user}\n"
            f"  IdentityFile {bed.key_path}\n  IdentitiesOnly yes\n"
            f"Host behind\n  HostName {bed.behind.address}\n  Port {bed.behind.port}\n  User {bed.user}\n"
            f"  IdentityFile {bed.key_path}\n  IdentitiesOnly yes\n  ProxyJump box\n" + extra)

    def know(self, *servers: SSHD, wrong: SSHD | None = None) -> None:
        lines = [f"{s.known_hosts_name} {s.host_pub_line}\n" for s in servers]
        if wrong is not None:
            wrong_pub = " ".join(Path(str(self.bed.wrong_key_path) + ".pub").read_text().split()[:2])
            lines.append(f"{wrong.known_hosts_name} {wrong_pub}\n")
        self.known_hosts.write_text("".join(lines))

    def transport(self, alias: str):
        return connect(HostConfig(name=alias, ssh=alias, connect_timeout=5),
                       ConnectOptions(known_hosts=str(self.known_hosts), ssh_config=str(self.ssh_config)))

    def warm_master(self, alias: str) -> None:
        """A live OpenSSH master for alias, opened while its key is known (and, with_recipe, a
        warm exec's recipe over it: made once the files are older than its racy window)."""
        if self.with_recipe:
            time.sleep(RACY_NS / 1e9 + 0.2)
            r = self.harness_exec(alias)
            assert r.returncode == 0 and list(self.control_dir.glob("exec-*")), r.stderr
        else:
            with self.transport(alias) as t:
                _master_channel(t, None)
        assert any(p.is_socket() for p in self.control_dir.iterdir())

    def harness_exec(self, alias: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        env.update(HARNESS_SSH_CONFIG=str(self.ssh_config), HARNESS_KNOWN_HOSTS=str(self.known_hosts), HARNESS_CONTROL_DIR=str(self.control_dir))
        return subprocess.run([sys.executable, "-m", "harness", "--config", str(self.harness_toml), "exec", alias, "--", "true"],
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=60)


# Each case: set the files up (and do what comes before), then return (alias, target sshd, verdict).
def known_key(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.box, f.bed.behind)
    return "box", f.bed.box, OK


def unknown_key(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.behind)
    return "box", f.bed.box, UNKNOWN


def changed_key(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.behind, wrong=f.bed.box)
    return "box", f.bed.box, CHANGED


def removed_key_with_a_live_master(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.box)
    f.warm_master("box")
    f.know()  # the user removed the line: the master opened under it must not carry on
    return "box", f.bed.box, UNKNOWN


def proxyjump_hop_with_an_unknown_key(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.behind)  # the host is known, the jump host is not
    return "behind", f.bed.behind, UNKNOWN


def strict_checking_off_in_the_users_config(f: Files):
    f.config(f.bed.box, extra="Host *\n  StrictHostKeyChecking no\n")
    f.know(f.bed.behind)
    return "box", f.bed.box, UNKNOWN


def changed_key_of_a_proxyjump_hop(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.behind, wrong=f.bed.box)
    return "behind", f.bed.behind, CHANGED


def repointed_alias(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.box)
    f.warm_master("box")
    f.config(f.bed.behind)  # `box` now names another machine, whose key is not known
    return "box", f.bed.behind, UNKNOWN


CASES = [known_key, unknown_key, changed_key, removed_key_with_a_live_master, proxyjump_hop_with_an_unknown_key,
         changed_key_of_a_proxyjump_hop, strict_checking_off_in_the_users_config, repointed_alias]


@pytest.fixture
def files(ssh_host, tmp_path, monkeypatch):
    control = Path(tempfile.mkdtemp(prefix="hkt-"))  # short: unix socket paths are limited
    monkeypatch.setenv("HARNESS_CONTROL_DIR", str(control))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    work = tmp_path / "work"  # made now: an exec making it would change the directory the ssh_config is in
    work.mkdir()
    toml = tmp_path / "harness.toml"
    toml.write_text("".join(f'[hosts.{a}]\nssh = "{a}"\nworkdir = "{work}"\nconnect_timeout = 5\n' for a in ("box", "behind")))
    f = Files(ssh_host, tmp_path / "ssh_config", tmp_path / "known_hosts", control, toml)
    Files.current = f
    yield f
    stop_control_masters(control)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_every_client_path_gives_the_same_verdict(case, path, files, capfd):
    files.with_recipe = path == "harness-exec"
    alias, target, verdict = case(files)
    recorded = files.known_hosts.read_text()
    t = files.transport(alias)
    try:
        if verdict == OK:
            PATHS[path](t, target)
        else:
            with pytest.raises(HostKeyError, match=verdict):
                PATHS[path](t, target)
    finally:
        t.close()
    assert files.known_hosts.read_text() == recorded  # nothing refused was recorded, nothing rewritten


# The two readers of ssh_config (paramiko's for the paramiko path, `ssh -G` for every OpenSSH
# path) must agree on where an alias leads: user, host name, port, jump hosts.
READER_CONFIGS = {
    "alias": "Host box\n  HostName 127.0.0.1\n  Port 2201\n  User alice\n",
    "defaults from Host *": "Host box\n  HostName 127.0.0.1\nHost *\n  Port 2202\n  User bob\n",
    "first value wins": "Host box\n  Port 2203\nHost b*\n  Port 2299\n  HostName 127.0.0.3\n",
    "Match host": "Host box\n  HostName 127.0.0.4\nMatch host 127.0.0.4\n  User carol\n  Port 2204\n",
    "ProxyJump": "Host box\n  HostName 127.0.0.5\n  ProxyJump jump1,jump2\nHost jump*\n  User dave\n",
    "%h token": "Host box\n  HostName %h.internal\n",
}


@pytest.mark.parametrize("text", READER_CONFIGS.values(), ids=list(READER_CONFIGS))
def test_both_ssh_config_readers_resolve_an_alias_alike(text, tmp_path, monkeypatch):
    from harness.transport import openssh

    monkeypatch.setenv("HARNESS_CONTROL_DIR", tempfile.mkdtemp(prefix="hkt-"))
    config = tmp_path / "ssh_config"
    config.write_text(text)
    t = connect(HostConfig(name="box", ssh="box"), ConnectOptions(known_hosts=str(tmp_path / "kh"), ssh_config=str(config)))
    resolved = openssh.resolve_config(t._openssh_options())
    conn = t.connection  # (not opened)
    jumps = [f"{c.user}@{c.host}:{c.port}" for c in t._hops()[:-1]]
    dash_g_jumps = [h for h in resolved.get("proxyjump", ("none",))[0].split(",") if h != "none"]
    resolved_jumps = []
    for hop in dash_g_jumps:
        hop_options = openssh.OpenSSHOptions(target=openssh.SSHTarget.parse(hop), ssh_config=str(config))
        hop_resolved = openssh.resolve_config(hop_options)
        resolved_jumps.append(f"{hop_resolved['user'][0]}@{hop_resolved['hostname'][0]}:{hop_resolved['port'][0]}")
    assert (conn.user, conn.host, str(conn.port), jumps) == (resolved["user"][0], resolved["hostname"][0], resolved["port"][0], resolved_jumps)

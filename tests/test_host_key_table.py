"""One host-key decision on every client path: both SSH clients
take the host's settings from one reading of ssh_config (`ssh -G`: openssh.resolve_host) and
accept a key only where ONE function says so (transport/host_keys.py `decide`: paramiko's
missing-host-key policy, OpenSSH's KnownHostsCommand). The table of cases is run twice: against
that function itself (test_the_one_decision_gives_each_verdict), and end to end against the real
sshd (tests/fixtures/sshd.py) through each way harness connects, which must give the same verdict
in the function's own words (the presented key's fingerprint): paramiko (Transport.run), and
OpenSSH as a channel of the master (Transport.stream), a connection of its own (stream
connection=OWN), a TCP channel of the master (stream_to: pull's further streams), the exec path
(exec_foreground: its own `ssh -f -N` master), the port forward's own `ssh -L`, and `harness
exec` itself, whose warm form runs from a recipe an earlier exec left (transport/warm_exec.py):
where a case opens a master first, this path leaves a recipe too, which must then be refused.
Nothing refused is ever recorded in known_hosts."""

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
from harness.transport import ConnectOptions, connect, host_keys, openssh
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
    output_of(t.stream(["true"], connection=OWN, stdin=False), "true")


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


# Each case: set the files up (and do what comes before), then return (alias, target sshd, verdict,
# the sshd whose key is refused: the host's, or its jump host's).
def known_key(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.box, f.bed.behind)
    return "box", f.bed.box, OK, None


def unknown_key(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.behind)
    return "box", f.bed.box, UNKNOWN, f.bed.box


def changed_key(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.behind, wrong=f.bed.box)
    return "box", f.bed.box, CHANGED, f.bed.box


def removed_key_with_a_live_master(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.box)
    f.warm_master("box")
    f.know()  # the user removed the line: the master opened under it must not carry on
    return "box", f.bed.box, UNKNOWN, f.bed.box


def proxyjump_hop_with_an_unknown_key(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.behind)  # the host is known, the jump host is not
    return "behind", f.bed.behind, UNKNOWN, f.bed.box


def strict_checking_off_in_the_users_config(f: Files):
    f.config(f.bed.box, extra="Host *\n  StrictHostKeyChecking no\n")
    f.know(f.bed.behind)
    return "box", f.bed.box, UNKNOWN, f.bed.box


def changed_key_of_a_proxyjump_hop(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.behind, wrong=f.bed.box)
    return "behind", f.bed.behind, CHANGED, f.bed.box


def repointed_alias(f: Files):
    f.config(f.bed.box)
    f.know(f.bed.box)
    f.warm_master("box")
    f.config(f.bed.behind)  # `box` now names another machine, whose key is not known
    return "box", f.bed.behind, UNKNOWN, f.bed.behind


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


def fingerprint(server: SSHD) -> str:
    return host_keys.fingerprint(server.host_pub_line.split()[1])


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_the_one_decision_gives_each_verdict(case, files):
    """host_keys.decide itself, on the case's files, for the host and each of its hops as `ssh -G`
    resolves them, with the key each sshd presents: the first refusal is the case's verdict, in
    one line naming the refused key's fingerprint; --accept-new-host-key records an unknown key
    (then known) and never a changed one."""
    alias, _, verdict, refused_by = case(files)
    options = files.transport(alias)._openssh_options()
    host = openssh.resolve_host(options)
    chain = [openssh.resolve_host(openssh.hop_options(options, hop)) for hop in host.proxy_jump] + [host]
    servers = {(s.address, s.port): s for s in (files.bed.box, files.bed.behind)}

    def decisions(accept_new: bool) -> list[host_keys.Decision]:
        out = []
        for r in chain:
            key_type, key = servers[(r.hostname, r.port)].host_pub_line.split()[:2]
            out.append(host_keys.decide(r.known_hosts, r.known_hosts_name, key_type, key, accept_new=accept_new))
        return out

    refused = [d for d in decisions(accept_new=False) if not d.accepted]
    if verdict == OK:
        assert refused == []
        return
    first = refused[0]
    assert first.kind == {UNKNOWN: host_keys.UNKNOWN, CHANGED: host_keys.CHANGED}[verdict]
    assert verdict in first.message and fingerprint(refused_by) in first.message and "\n" not in str(first.error(alias))
    assert first.name == f"[{refused_by.address}]:{refused_by.port}"
    before = files.known_hosts.read_text()
    accepted = decisions(accept_new=True)
    if verdict == CHANGED:
        assert not all(d.accepted for d in accepted) and files.known_hosts.read_text() == before  # never recorded
    else:
        assert [d.kind for d in accepted if d.kind != host_keys.KNOWN] == [host_keys.RECORDED]
        assert all(d.kind == host_keys.KNOWN for d in decisions(accept_new=False))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_every_client_path_gives_the_same_verdict(case, path, files, capfd):
    files.with_recipe = path == "harness-exec"
    alias, target, verdict, refused_by = case(files)
    recorded = files.known_hosts.read_text()
    t = files.transport(alias)
    try:
        if verdict == OK:
            PATHS[path](t, target)
        else:
            with pytest.raises(HostKeyError, match=verdict) as refusal:
                PATHS[path](t, target)
            # the one decision's words, whichever client asked it: the refused key's fingerprint
            assert fingerprint(refused_by) in str(refusal.value), str(refusal.value)
    finally:
        t.close()
    assert files.known_hosts.read_text() == recorded  # nothing refused was recorded, nothing rewritten


# One reading of ssh_config for both clients: the paramiko connection goes where `ssh -G` says
# an alias leads (user, host name, port, jump hosts).
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

"""SSHTransport against a real sshd (tests/fixtures/sshd.py)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from harness.config import HostConfig
from harness.errors import AuthError, ConnectError, ForwardRefusedError, HostKeyError, RemoteCommandError, UsageError
from harness.transport import connect
from harness.transport.base import OWN, SHARED
from tests.fixtures.streams import output_of
from tests.fixtures.processes import processes_showing
from tests.fixtures.sshd import free_port

pytestmark = pytest.mark.ssh

TRICKY = ["a b", "it's", 'say "hi"', "$HOME", "`id`", "a;b", "x\ny", "héllo ✓", "*", "", "-n", "\\"]


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, ssh_host):
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # keys from the test files only
    monkeypatch.setenv("HARNESS_CONTROL_DIR", str(ssh_host.control_dir))  # masters die with the test bed


@pytest.fixture
def box(ssh_host):
    t = connect(HostConfig(name="box", ssh="box"), ssh_host.connect_options())
    yield t
    t.close()


def fingerprint(pub_line: str) -> str:
    out = subprocess.run(["ssh-keygen", "-lf", "-"], input=pub_line.encode(), capture_output=True, check=True).stdout.decode()
    return out.split()[1]


def test_exit_codes_and_capture(box):
    assert box.run(["true"]).exit_code == 0
    r = box.run(["sh", "-c", "echo out; echo err >&2; exit 42"])
    assert (r.exit_code, r.stdout, r.stderr) == (42, b"out\n", b"err\n")
    assert box.run(["no-such-command-xyz"]).exit_code == 127


def test_arguments_arrive_intact(box):
    r = box.run(["printf", "%s\\0", *TRICKY])
    assert r.ok
    assert r.stdout.decode().split("\0")[:-1] == TRICKY


def test_cwd_stdin_and_env(box, tmp_path):
    r = box.run(["sh", "-c", 'pwd; cat; printf "%s" "$X1"'], cwd=str(tmp_path), stdin=b"input\n", env={"X1": "va l'ue $x"})
    assert r.stdout.decode() == f"{tmp_path}\ninput\nva l'ue $x"
    assert box.run(["pwd"], cwd="~").text.strip() == box.home()


def test_env_value_with_newline_is_refused(box):
    with pytest.raises(UsageError, match="X2 contains a newline"):
        box.run(["true"], env={"X2": "a\nb"})


def test_output_streams_before_the_command_ends(box, tmp_path):
    """The command waits for a file the test creates only after it has SEEN the first line."""
    flag = tmp_path / "go"
    seen: list[bytes] = []

    def sink(chunk: bytes) -> None:
        seen.append(chunk)
        if b"first" in b"".join(seen):
            flag.touch()

    script = 'echo first; i=0; while [ ! -e "$1" ]; do i=$((i+1)); [ $i -gt 200 ] && exit 9; sleep 0.05; done; echo second'
    r = box.run(["sh", "-c", script, "sh", str(flag)], stdout=sink)
    assert r.exit_code == 0, "stdout was not delivered while the command ran"
    assert b"".join(seen) == b"first\nsecond\n"


def test_env_values_never_on_a_command_line(box, ssh_host):
    secret = f"s3cret-{uuid.uuid4().hex}"
    found: list[str] = []
    result = {}

    def run():
        result["r"] = box.run(["sh", "-c", 'printf "%s" "$HARNESS_T_SECRET" > "$0"; sleep 2', str(ssh_host.root / "seen")],
                              env={"HARNESS_T_SECRET": secret})

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while not (ssh_host.root / "seen").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    found += processes_showing(secret.encode())
    t.join()
    assert result["r"].ok
    assert (ssh_host.root / "seen").read_text() == secret  # the command did get the value
    assert found == []
    assert secret not in ssh_host.box.log_text()


def test_files_put_get_stat(box, tmp_path):
    target = tmp_path / "a" / "b" / "f.bin"
    box.put_bytes(b"\x00data", str(target), mode=0o640)
    assert target.read_bytes() == b"\x00data"
    assert (target.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"]  # no temp file left
    box.put_bytes(b"new", str(target))  # replaces atomically
    assert box.get_bytes(str(target)) == b"new"
    s = box.stat(str(target))
    assert s and s.size == 3 and not s.is_dir and not s.is_link
    (tmp_path / "link").symlink_to(target)
    assert box.stat(str(tmp_path / "link")).is_link
    assert box.stat(str(tmp_path / "a")).is_dir
    assert box.stat(str(tmp_path / "missing")) is None
    with pytest.raises(FileNotFoundError):
        box.get_bytes(str(tmp_path / "missing"))


def test_alias_resolution_from_ssh_config(box, ssh_host):
    # "box" is only an alias: HostName/Port/User/IdentityFile come from the ssh_config file
    conn = box.run(["sh", "-c", 'echo "$SSH_CONNECTION"; id -un']).text.split("\n")
    assert conn[0].split()[2:] == ["127.0.0.1", str(ssh_host.port)]
    assert conn[1] == ssh_host.user
    assert box.address() == conn[0].split()[2]  # where a group's peers meet this host


def test_user_host_port_spec(ssh_host, tmp_path):
    empty = tmp_path / "empty_config"
    empty.write_text("")
    host = HostConfig(name="raw", ssh=f"{ssh_host.user}@127.0.0.1:{ssh_host.port}", identity_file=str(ssh_host.key_path))
    opts = ssh_host.connect_options(ssh_config=str(empty))
    with connect(host, opts) as t:
        assert t.run(["true"]).ok


def test_proxyjump_goes_through_the_jump_host(ssh_host):
    pattern = f", target 127.0.0.2 port {ssh_host.behind.port}"  # sshd: server_request_direct_tcpip: originator ..., target ...
    before = ssh_host.box.log_text().count(pattern)
    with connect(HostConfig(name="behind", ssh="behind"), ssh_host.connect_options()) as t:
        conn = t.run(["sh", "-c", 'echo "$SSH_CONNECTION"']).text.split()
        assert t.address() == "127.0.0.2"  # the host's own, not the jump host's
    assert conn[2:] == ["127.0.0.2", str(ssh_host.behind.port)]
    assert ssh_host.box.log_text().count(pattern) == before + 1


def test_proxyjump_hops_are_taken_in_order(ssh_host, tmp_path):
    """`ProxyJump box,behind`: box first, behind through box, the host through behind, as OpenSSH
    does (fabric alone chains a list of hops the other way round). The host is behind's own
    address: only behind's log shows which hop made the last leg."""
    cfg = tmp_path / "ssh_config"
    cfg.write_text(ssh_host.ssh_config.read_text() + f"\nHost twohops\n  HostName 127.0.0.2\n  Port {ssh_host.behind.port}\n"
                   f"  User {ssh_host.user}\n  IdentityFile {ssh_host.key_path}\n  IdentitiesOnly yes\n  ProxyJump box,behind\n")
    to_behind, to_box = f", target 127.0.0.2 port {ssh_host.behind.port}", f", target 127.0.0.1 port {ssh_host.port}"
    before = (ssh_host.box.log_text().count(to_behind), ssh_host.behind.log_text().count(to_behind), ssh_host.behind.log_text().count(to_box))
    with connect(HostConfig(name="two", ssh="twohops"), ssh_host.connect_options(ssh_config=str(cfg))) as t:
        assert t.run(["true"]).ok
    after = (ssh_host.box.log_text().count(to_behind), ssh_host.behind.log_text().count(to_behind), ssh_host.behind.log_text().count(to_box))
    assert after == (before[0] + 1, before[1] + 1, before[2])


def test_unknown_host_key_refused_then_accepted_once(ssh_host, tmp_path):
    known = tmp_path / "kh" / "known_hosts"
    host = HostConfig(name="box", ssh="box")
    with pytest.raises(HostKeyError) as e:
        connect(host, ssh_host.connect_options(known_hosts=str(known))).open()
    msg = str(e.value)
    assert "ssh-ed25519" in msg and fingerprint(ssh_host.box.host_pub_line) in msg
    assert "--accept-new-host-key" in msg and "\n" not in msg
    assert not known.exists()
    with connect(host, ssh_host.connect_options(known_hosts=str(known), accept_new_host_key=True)) as t:
        assert t.run(["true"]).ok
    lines = known.read_text().splitlines()
    assert lines == [f"[127.0.0.1]:{ssh_host.port} {ssh_host.box.host_pub_line}"]
    with connect(host, ssh_host.connect_options(known_hosts=str(known))) as t:  # now known
        assert t.run(["true"]).ok
    # and OpenSSH agrees with what we recorded
    ssh = subprocess.run(["ssh", "-F", str(ssh_host.ssh_config), "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                          "-o", f"UserKnownHostsFile={known}", "box", "true"], capture_output=True)
    assert ssh.returncode == 0, ssh.stderr


def test_changed_host_key_always_refused(ssh_host, tmp_path):
    known = tmp_path / "known_hosts"
    wrong_pub = " ".join(Path(str(ssh_host.wrong_key_path) + ".pub").read_text().split()[:2])
    known.write_text(f"[127.0.0.1]:{ssh_host.port} {wrong_pub}\n")
    for accept in (False, True):
        with pytest.raises(HostKeyError, match="CHANGED"):
            connect(HostConfig(name="box", ssh="box"), ssh_host.connect_options(known_hosts=str(known), accept_new_host_key=accept)).open()
    assert known.read_text() == f"[127.0.0.1]:{ssh_host.port} {wrong_pub}\n"


def test_wrong_key_is_a_clear_auth_error(ssh_host, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host b\n  HostName 127.0.0.1\n  Port {ssh_host.port}\n  User {ssh_host.user}\n  IdentityFile {ssh_host.wrong_key_path}\n  IdentitiesOnly yes\n")
    opts = ssh_host.connect_options(ssh_config=str(cfg))
    with pytest.raises(AuthError, match="authentication failed") as e:
        connect(HostConfig(name="b", ssh="b"), opts).open()
    assert "\n" not in str(e.value)


def test_closed_port_fails_without_waiting_for_the_timeout(ssh_host):
    port = free_port()
    start = time.monotonic()
    with pytest.raises(ConnectError, match="Connection refused"):
        connect(HostConfig(name="c", ssh=f"root@127.0.0.1:{port}", connect_timeout=120), ssh_host.connect_options()).open()
    assert time.monotonic() - start < 60  # refused at once, not after the 120 s timeout (generous: a loaded CI box)


def test_unresponsive_host_fails_within_the_timeout(ssh_host):
    """A listener whose accept queue is full drops SYNs: the TCP connect itself hangs."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        fillers = []
        for _ in range(3):  # fill the backlog (connects beyond it hang in SYN_SENT)
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", port))
            fillers.append(s)
        time.sleep(0.2)
        start = time.monotonic()
        with pytest.raises(ConnectError, match="timed out|handshake failed") as e:
            connect(HostConfig(name="slow", ssh=f"root@127.0.0.1:{port}", connect_timeout=2), ssh_host.connect_options()).open()
        elapsed = time.monotonic() - start
        for s in fillers:
            s.close()
    assert elapsed >= 1.5, elapsed  # it did wait for the connection, and gave up on its own:
    assert re.match(r"slow \(", str(e.value)) and "after 2 s" in str(e.value)  # the 2 s timeout, named


def test_one_connection_serves_every_operation(box, ssh_host):
    before = ssh_host.box.log_text().count("Accepted publickey")
    for _ in range(3):
        box.run(["true"])
    box.put_bytes(b"x", str(ssh_host.root / "one-conn"))
    box.stat(str(ssh_host.root / "one-conn"))
    assert ssh_host.box.log_text().count("Accepted publickey") == before + 1


def test_local_argv_uses_openssh(box, ssh_host):
    argv = box.local_argv(["printf", "%s|", "a b", "$x"])
    out = subprocess.run(argv, capture_output=True, env=ssh_host.env(), timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"a b|$x|"


def _bulk_cipher(transport, ssh_host) -> str:
    """The cipher a bulk stream's connection negotiates (ssh -v names it)."""
    argv = transport.own_connection_argv(["true"])
    out = subprocess.run([argv[0], "-v", *argv[1:]], capture_output=True, env=ssh_host.env(), timeout=30)
    assert out.returncode == 0, out.stderr
    return re.search(rb"kex: server->client cipher: (\S+)", out.stderr).group(1).decode()


def test_bulk_streams_prefer_aes_gcm_unless_the_user_sets_ciphers(box, ssh_host, tmp_path):
    assert _bulk_cipher(box, ssh_host) == "aes128-gcm@openssh.com"
    config = tmp_path / "ssh_config"
    config.write_text(ssh_host.ssh_config.read_text() + "\nHost *\n  Ciphers aes256-ctr,chacha20-poly1305@openssh.com\n")
    theirs = connect(HostConfig(name="box", ssh="box"), ssh_host.connect_options(ssh_config=str(config)))
    assert _bulk_cipher(theirs, ssh_host) == "aes256-ctr"


def test_ctrl_c_during_run_hangs_up_the_session_and_keeps_the_connection(box, ssh_host):
    """KeyboardInterrupt while waiting closes that session and re-raises at once (as ssh(1)
    without -t); the connection serves the next command without a new login."""
    import signal

    def sink(chunk: bytes) -> None:
        if b"READY" in chunk:
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()

    assert box.run(["true"]).ok
    logins = ssh_host.box.log_text().count("Accepted publickey")
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        box.run(["sh", "-c", "echo READY; sleep 300"], stdout=sink)
    assert time.monotonic() - start < 120  # returned long before the command would have ended
    assert box.run(["echo", "next"]).text == "next\n"
    assert ssh_host.box.log_text().count("Accepted publickey") == logins


def test_accepted_key_is_hashed_when_hashknownhosts_is_on(ssh_host, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host hashed\n  HostName 127.0.0.1\n  Port {ssh_host.port}\n  User {ssh_host.user}\n"
                   f"  IdentityFile {ssh_host.key_path}\n  IdentitiesOnly yes\n  HashKnownHosts yes\n")
    known = tmp_path / "known_hosts"
    opts = ssh_host.connect_options(ssh_config=str(cfg), known_hosts=str(known), accept_new_host_key=True)
    with connect(HostConfig(name="h", ssh="hashed"), opts) as t:
        assert t.run(["true"]).ok
    line = known.read_text()
    assert line.startswith("|1|") and "127.0.0.1" not in line
    found = subprocess.run(["ssh-keygen", "-F", f"[127.0.0.1]:{ssh_host.port}", "-f", str(known)], capture_output=True)
    assert found.returncode == 0  # OpenSSH finds the hashed entry


# -- Transport.stream / stream_to: the handle types its own failures ----------------------------


def test_a_stream_types_the_remote_exit_and_keeps_stderr_inside(box):
    proc = box.stream(["sh", "-c", 'read x; echo "got $x"; echo "oops $x" >&2; exit 3'])
    code, out = proc.communicate(b"it's\n")
    assert (code, out) == (3, b"got it's\n")
    error = proc.error("the test command")
    assert type(error) is RemoteCommandError and error.remote_exit_code == 3 and "oops it's" in str(error)
    # a remote command that exits 255 itself (ssh's own failure code) is still the command's exit
    with pytest.raises(RemoteCommandError, match="exit code 255"):
        output_of(box.stream(["sh", "-c", "echo 'Connection refused' >&2; exit 255"], stdin=False), "exits 255")
    assert output_of(box.stream(["printf", "%s|", "a b", "$x"], connection=OWN), "printf") == b"a b|$x|"


def test_a_stream_types_the_clients_own_failures(ssh_host, tmp_path):
    cfg = tmp_path / "ssh_config"
    cfg.write_text(f"Host b\n  HostName 127.0.0.1\n  Port {ssh_host.port}\n  User {ssh_host.user}\n"
                   f"  IdentityFile {ssh_host.wrong_key_path}\n  IdentitiesOnly yes\n")
    for connection in (SHARED, OWN):
        with connect(HostConfig(name="b", ssh="b"), ssh_host.connect_options(ssh_config=str(cfg))) as t:
            with pytest.raises(AuthError, match="authentication failed"):
                output_of(t.stream(["true"], connection=connection, stdin=False), "true")
        closed = HostConfig(name="c", ssh=f"root@127.0.0.1:{free_port()}", connect_timeout=5)
        with connect(closed, ssh_host.connect_options()) as t:
            with pytest.raises(ConnectError, match="Connection refused"):
                output_of(t.stream(["true"], connection=connection, stdin=False), "true")


def test_a_refused_forward_is_typed(box, ssh_host, tmp_path):
    """Nothing listens on the port, or the sshd forbids forwarding: ForwardRefusedError."""
    from tests.fixtures.sshd import start_sshd

    proc = box.stream_to("127.0.0.1", free_port())
    assert proc.stdout.read() == b""
    with pytest.raises(ForwardRefusedError, match="refused"):  # (a channel of the master: "Session open refused by peer")
        raise proc.error("ssh -W")
    server = start_sshd(tmp_path, "noforward", "127.0.0.1", ssh_host.root / "authorized_keys", tcp_forwarding="no")
    try:
        known = tmp_path / "known_hosts"
        known.write_text(f"{server.known_hosts_name} {server.host_pub_line}\n")
        host = HostConfig(name="nf", ssh=f"{ssh_host.user}@127.0.0.1:{server.port}", identity_file=str(ssh_host.key_path))
        with connect(host, ssh_host.connect_options(known_hosts=str(known))) as t:
            proc = t.stream_to("127.0.0.1", server.port)
            assert proc.stdout.read() == b""
            with pytest.raises(ForwardRefusedError, match="administratively prohibited"):
                raise proc.error("ssh -W")
    finally:
        server.stop()

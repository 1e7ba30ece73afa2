"""`harness exec` and `harness doctor` end to end: `python -m harness` against the real sshd."""

from __future__ import annotations

import json
import os
import pty
import shutil
import select
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.fixtures.job_project import run_in_pty
from tests.fixtures.sshd import free_port, stop_control_masters, write_harness_config

pytestmark = pytest.mark.ssh

TRICKY = ["a b", "it's", 'say "hi"', "$HOME", "`id`", "a;b", "x\ny", "héllo ✓", "*", "", "--", "-n"]


def harness(config: Path, *args: str, env: dict[str, str], **kw) -> subprocess.CompletedProcess:
    kw.setdefault("stdin", subprocess.DEVNULL)
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], env=env, capture_output=True, timeout=60, **kw)


@pytest.fixture
def env(ssh_host):
    return ssh_host.env()


def test_exit_code_and_output(harness_config, env, ssh_host):
    r = harness(harness_config, "exec", "box", "--", "sh", "-c", "echo out; echo err >&2; pwd; exit 7", env=env)
    assert r.returncode == 7
    assert r.stdout.decode().splitlines() == ["out", str(harness_config.parent / "work" / "box")]  # the workdir, created
    assert r.stderr == b"err\n"
    assert harness(harness_config, "exec", "box", "--", "true", env=env).returncode == 0


def test_arguments_arrive_intact(harness_config, env):
    for host in ("box", "local"):
        r = harness(harness_config, "exec", host, "--", "printf", "%s\\0", *TRICKY, env=env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.decode().split("\0")[:-1] == TRICKY, host


def test_warm_path_reuses_a_master_connection(harness_config, env, ssh_host):
    log = ssh_host.box.log_text
    harness(harness_config, "exec", "box", "--", "true", env=env)
    before = log().count("Accepted publickey")
    for _ in range(3):
        assert harness(harness_config, "exec", "box", "--", "true", env=env).returncode == 0
    assert log().count("Accepted publickey") == before  # no new authentication: one connection


def test_output_streams_while_the_command_runs(harness_config, env, tmp_path):
    flag = tmp_path / "go"
    script = 'echo first; i=0; while [ ! -e "$1" ]; do i=$((i+1)); [ $i -gt 300 ] && exit 9; sleep 0.05; done; echo second'
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(harness_config), "exec", "box", "--", "sh", "-c", script, "sh", str(flag)],
                            env=env, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    assert proc.stdout.readline() == b"first\n"
    flag.touch()
    assert proc.stdout.read() == b"second\n"
    assert proc.wait(30) == 0


def command_lines_holding(secret: str) -> list[tuple[int, list[str]]]:
    """(pid, argv) of every process on this machine (harness, its ssh, sshd and the remote shell
    alike: the sshd is local) whose command line holds the secret in ANY form: raw, shell-quoted
    (`'tok-..'"'"'with'"'"'..'`), escaped or split across arguments. The secret's random part
    survives every quoting shlex or a printf %q does, so it alone identifies a leak."""
    marker = secret.split()[0].encode()  # "tok-" + 32 random hex digits
    assert len(marker) >= 32
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            found.append((int(pid), [a.decode(errors="replace") for a in cmdline.split(b"\0")]))
    return found


def test_the_leak_finder_sees_a_shell_quoted_secret():
    """The finder above catches what a leak looks like (a quoted value on an ssh command line)."""
    secret = f"tok-{uuid.uuid4().hex} 'with' $pecial"
    quoted = shlex.quote(secret)
    assert secret not in quoted  # the raw value never matches a quoted leak
    with subprocess.Popen([sys.executable, "-c", "import time; print(flush=True); time.sleep(30)", f"export HARNESS_T_TOKEN={quoted}; true"],
                          stdout=subprocess.PIPE) as holder:
        try:
            holder.stdout.readline()  # running
            assert [pid for pid, _ in command_lines_holding(secret)] == [holder.pid]
        finally:
            holder.kill()


def test_env_passthrough_values_stay_off_command_lines(tmp_path, ssh_host, env):
    config = write_harness_config(tmp_path, ssh_host)
    config.write_text(config.read_text().replace("[hosts.box]\n", '[hosts.box]\nenv = ["HARNESS_T_TOKEN"]\n'))
    secret = f"tok-{uuid.uuid4().hex} 'with' $pecial"
    env = {**env, "HARNESS_T_TOKEN": secret}
    seen = tmp_path / "seen"
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "exec", "box", "--", "sh", "-c",
                             'printf "%s" "$HARNESS_T_TOKEN" > "$0"; cat; sleep 2', str(seen)],
                            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc.stdin.write(b"stdin still flows\n")
    proc.stdin.close()
    deadline = time.monotonic() + 20
    while not seen.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    leaks = command_lines_holding(secret)  # while the remote command still runs (its sleep)
    out = proc.stdout.read()
    assert proc.wait(30) == 0
    assert seen.read_text() == secret
    assert out == b"stdin still flows\n"
    assert leaks == []


def test_unknown_host_key_refused_then_accept_flag(tmp_path, ssh_host, env):
    config = write_harness_config(tmp_path, ssh_host)
    known = tmp_path / "known_hosts"
    env = {**env, "HARNESS_KNOWN_HOSTS": str(known)}
    r = harness(config, "exec", "box", "--", "true", env=env)
    assert r.returncode == 255
    lines = r.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "unknown host key" in lines[0] and "SHA256:" in lines[0] and "--accept-new-host-key" in lines[0]
    r = harness(config, "--accept-new-host-key", "exec", "box", "--", "echo", "ok", env=env)
    assert (r.returncode, r.stdout) == (0, b"ok\n"), r.stderr
    assert known.read_text().count("ssh-ed25519") == 1
    r = harness(config, "exec", "box", "--", "echo", "again", env=env)
    assert (r.returncode, r.stdout) == (0, b"again\n"), r.stderr


def test_changed_host_key_refused_even_with_the_flag(tmp_path, ssh_host, env):
    config = write_harness_config(tmp_path, ssh_host)
    known = tmp_path / "known_hosts"
    wrong_pub = " ".join(Path(str(ssh_host.wrong_key_path) + ".pub").read_text().split()[:2])
    known.write_text(f"[127.0.0.1]:{ssh_host.port} {wrong_pub}\n")
    env = {**env, "HARNESS_KNOWN_HOSTS": str(known)}
    for flag in ([], ["--accept-new-host-key"]):
        r = harness(config, *flag, "exec", "box", "--", "true", env=env)
        assert r.returncode == 255
        assert len(r.stderr.decode().strip().splitlines()) == 1 and "CHANGED" in r.stderr.decode()


def test_wrong_key_and_closed_port_are_one_line_errors(tmp_path, ssh_host, env):
    port = free_port()
    config = tmp_path / "harness.toml"
    config.write_text(
        f'[hosts.wrong]\nssh = "{ssh_host.user}@127.0.0.1:{ssh_host.port}"\nidentity_file = "{ssh_host.wrong_key_path}"\n'
        f'[hosts.closed]\nssh = "root@127.0.0.1:{port}"\nconnect_timeout = 120\n'
    )
    empty = tmp_path / "empty_ssh_config"
    empty.write_text("Host *\n  IdentitiesOnly yes\n")
    env = {**env, "HARNESS_SSH_CONFIG": str(empty)}
    r = harness(config, "exec", "wrong", "--", "true", env=env)
    assert r.returncode == 255 and "authentication failed" in r.stderr.decode()
    assert len(r.stderr.decode().strip().splitlines()) == 1
    start = time.monotonic()
    r = harness(config, "exec", "closed", "--", "true", env=env)
    assert r.returncode == 255 and "cannot connect" in r.stderr.decode() and "Connection refused" in r.stderr.decode()
    assert len(r.stderr.decode().strip().splitlines()) == 1
    assert time.monotonic() - start < 60  # refused at once, not after the 120 s timeout (generous: loaded CI)


def test_proxyjump_host(harness_config, env, ssh_host):
    r = harness(harness_config, "exec", "behind", "--", "sh", "-c", 'echo "$SSH_CONNECTION"', env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[2:] == [b"127.0.0.2", str(ssh_host.behind.port).encode()]


def test_pty_exit_code(harness_config, env):
    r = harness(harness_config, "exec", "box", "--pty", "--", "sh", "-c", "test -t 0 && echo tty; exit 5", env=env)
    assert r.returncode == 5
    assert b"tty" in r.stdout


def test_pty_keeps_env_values_off_the_screen_and_bytes_unchanged(tmp_path, ssh_host, env):
    """A PTY echoes what it receives: the values are sent only once the remote side has turned
    echo off. Output is the remote bytes exactly (multi-byte characters across many reads)."""
    config = write_harness_config(tmp_path, ssh_host)
    config.write_text(config.read_text().replace("[hosts.box]\n", '[hosts.box]\nenv = ["HARNESS_T_TOKEN"]\n'))
    secret = f"tok-{uuid.uuid4().hex}"
    text = "héllo ✓ " * 3000
    script = 'printf "%s" "$HARNESS_T_TOKEN" | od -An -tx1 | tr -d " \\n"; echo; printf "%s" "$0"; exit 3'
    r = harness(config, "exec", "--pty", "box", "--", "sh", "-c", script, text, env={**env, "HARNESS_T_TOKEN": secret})
    assert r.returncode == 3, r.stderr
    assert secret.encode() not in r.stdout
    assert secret.encode().hex().encode() + b"\r\n" in r.stdout  # the program did get the value
    assert r.stdout.endswith(text.encode())
    assert b"pty-ready" not in r.stdout


def test_pty_ctrl_c_reaches_the_remote_program(harness_config, env):
    """Run harness under a real terminal; ^C typed there interrupts the REMOTE program."""
    pid, fd = pty.fork()
    if pid == 0:  # child: harness on the pty
        os.execve(sys.executable, [sys.executable, "-m", "harness", "--config", str(harness_config), "exec", "--pty", "box", "--",
                                   "sh", "-c", 'trap "echo GOT-INT; exit 7" INT; echo READY; sleep 30 & wait'], env)
    out = b""
    deadline = time.monotonic() + 30
    sent = False
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        if b"READY" in out and not sent:
            os.write(fd, b"\x03")
            sent = True
    _, status = os.waitpid(pid, 0)
    assert b"GOT-INT" in out, out
    assert os.waitstatus_to_exitcode(status) == 7


def test_unknown_host_is_a_usage_error(harness_config, env):
    r = harness(harness_config, "exec", "nope", "--", "true", env=env)
    assert r.returncode == 2
    assert r.stderr.decode().strip() == f"harness: error: {harness_config.resolve()}: unknown host 'nope' (configured: behind, box, local)"


def test_doctor_json_end_to_end(harness_config, env):
    r = harness(harness_config, "doctor", "box", "--json", env=env)
    report = json.loads(r.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["connect"]["status"] == "ok"
    assert checks["python3"]["status"] == "ok" and "3." in checks["python3"]["message"]
    assert checks["disk"]["status"] in ("ok", "warn")
    assert checks["gpus"]["status"] == "warn"  # this machine has no nvidia-smi
    assert all(c["status"] in ("ok", "warn", "fail") and c["message"] for c in report["checks"])
    assert r.returncode == (1 if any(c["status"] == "fail" for c in report["checks"]) else 0)


def test_doctor_unreachable_host_fails(tmp_path, env):
    config = tmp_path / "harness.toml"
    config.write_text(f'[hosts.closed]\nssh = "root@127.0.0.1:{free_port()}"\nconnect_timeout = 3\n')
    r = harness(config, "doctor", "closed", "--json", env=env)
    assert r.returncode == 255  # unreachable: as every other command (harness.errors.EXIT_CONNECTION)
    checks = json.loads(r.stdout)["checks"]
    assert checks[0]["name"] == "connect" and checks[0]["status"] == "fail" and checks[0]["fix"]


def test_exec_through_the_master_delivers_env_and_exit_code(ssh_host, monkeypatch, capfd):
    """The warm path in process: `ssh -S` on the master, env values on its stdin."""
    from harness.config import HostConfig
    from harness.transport import ConnectOptions, connect

    for k, v in ssh_host.env({}).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    transport = connect(HostConfig(name="box", ssh="box"), ConnectOptions())
    for _ in range(2):  # a new master, then the one now up
        code = transport.exec_foreground(["sh", "-c", 'printf "%s" "$T_FB"; exit 6'], env={"T_FB": "v a'l"})
        assert not transport.is_connected  # paramiko never connected: OpenSSH did it all
        assert code == 6
        assert capfd.readouterr().out == "v a'l"


def test_a_key_held_only_by_a_running_ssh_agent_is_used(tmp_path, ssh_host):
    """No key file anywhere harness looks: the key lives only in ssh-agent. Both the OpenSSH path
    (exec through a master) and paramiko (exec --pty) authenticate with it; without the agent,
    the same call is refused."""
    sock = Path(tempfile.mkdtemp(prefix="hagent-")) / "agent.sock"
    control = Path(tempfile.mkdtemp(prefix="hac-"))
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            assert time.monotonic() < deadline and agent.poll() is None, "ssh-agent did not start"
            time.sleep(0.05)
        key = tmp_path / "agent_only_key"
        shutil.copy(ssh_host.key_path, key)
        os.chmod(key, 0o600)
        subprocess.run(["ssh-add", "-q", str(key)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)}, check=True, timeout=30)
        key.unlink()  # from now on only the agent holds it
        ssh_config = tmp_path / "ssh_config"
        ssh_config.write_text(f"Host agentbox\n  HostName 127.0.0.1\n  Port {ssh_host.port}\n  User {ssh_host.user}\n"
                              f"  UserKnownHostsFile {ssh_host.known_hosts}\n")
        config = tmp_path / "harness.toml"
        config.write_text(f'[hosts.agentbox]\nssh = "agentbox"\nworkdir = "{tmp_path / "work"}"\nconnect_timeout = 30\n')
        env = {**ssh_host.env(), "HARNESS_SSH_CONFIG": str(ssh_config), "HARNESS_CONTROL_DIR": str(control)}
        without = harness(config, "exec", "agentbox", "--", "true", env=env)
        assert without.returncode == 255 and "authentication failed" in without.stderr.decode(), without.stderr
        env["SSH_AUTH_SOCK"] = str(sock)
        for args in (["exec", "agentbox", "--", "echo", "via-agent"], ["exec", "--pty", "agentbox", "--", "echo", "via-agent"]):
            r = harness(config, *args, env=env)
            assert r.returncode == 0 and b"via-agent" in r.stdout, (args, r.stderr)
    finally:
        stop_control_masters(control)
        agent.terminate()
        agent.wait(10)
# ---------------------------------------------------------------------------------------------
# The warm path's master connection follows the user's SSH files


def _own_ssh_files(tmp_path: Path, ssh_host, env: dict[str, str], hostname: str, port: int) -> tuple[Path, Path, dict[str, str]]:
    """An ssh_config whose `box` points at hostname:port, and a copy of the known_hosts, both
    this test's own (it edits them)."""
    config, known = tmp_path / "ssh_config", tmp_path / "known_hosts"
    known.write_text(ssh_host.known_hosts_lines())
    _point_box_at(config, ssh_host, hostname, port)
    return config, known, {**env, "HARNESS_SSH_CONFIG": str(config), "HARNESS_KNOWN_HOSTS": str(known)}


def _point_box_at(config: Path, ssh_host, hostname: str, port: int) -> None:
    config.write_text(f"Host box\n  HostName {hostname}\n  Port {port}\n  User {ssh_host.user}\n"
                      f"  IdentityFile {ssh_host.key_path}\n  IdentitiesOnly yes\n")


def _server_address(config: Path, env: dict[str, str]) -> list[bytes]:
    r = harness(config, "exec", "box", "--", "sh", "-c", 'echo "$SSH_CONNECTION"', env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()[2:]


def test_master_is_not_reused_after_the_host_leaves_known_hosts(tmp_path, ssh_host, env):
    config = write_harness_config(tmp_path, ssh_host)
    _, known, env = _own_ssh_files(tmp_path, ssh_host, env, "127.0.0.1", ssh_host.port)
    assert harness(config, "exec", "box", "--", "true", env=env).returncode == 0  # a master is now alive
    known.write_text(f"{ssh_host.behind.known_hosts_name} {ssh_host.behind.host_pub_line}\n")
    r = harness(config, "exec", "box", "--", "echo", "reached", env=env)
    assert r.returncode == 255 and r.stdout == b""
    assert "unknown host key" in r.stderr.decode()


def test_master_follows_an_edited_ssh_config(tmp_path, ssh_host, env):
    config = write_harness_config(tmp_path, ssh_host)
    ssh_config, _, env = _own_ssh_files(tmp_path, ssh_host, env, "127.0.0.1", ssh_host.port)
    assert _server_address(config, env) == [b"127.0.0.1", str(ssh_host.port).encode()]
    _point_box_at(ssh_config, ssh_host, "127.0.0.2", ssh_host.behind.port)  # the alias now names another box
    assert _server_address(config, env) == [b"127.0.0.2", str(ssh_host.behind.port).encode()]
    _point_box_at(ssh_config, ssh_host, "127.0.0.1", ssh_host.port)
    assert _server_address(config, env) == [b"127.0.0.1", str(ssh_host.port).encode()]


# ---------------------------------------------------------------------------------------------
# A host that was never synced: no workdir yet


def test_a_fresh_host_answers_exec_inspect_doctor_and_shell(tmp_path, ssh_host, env, monkeypatch):
    config = tmp_path / "harness.toml"
    config.write_text(f'[hosts.box]\nssh = "box"\nworkdir = "{tmp_path}/never-synced/work"\npython = "{sys.executable}"\n')
    r = harness(config, "inspect", "box", "json.dumps", "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["qualname"] == "dumps"
    r = harness(config, "doctor", "box", "--json", env=env)
    checks = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
    assert "did not answer" not in json.dumps(checks), r.stdout  # the stage interpreter answered
    assert "can't cd" not in json.dumps(checks)
    (tmp_path / "never-synced").rename(tmp_path / "gone")  # fresh again, for the shell
    for key, value in ssh_host.env({}).items():  # run_in_pty passes on this process's environment
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    code, out = run_in_pty([sys.executable, "-m", "harness", "--config", str(config), "shell", "box"], b"pwd; exit 3\n")
    assert code == 3, out
    assert f"{tmp_path}/never-synced/work" in out
    (tmp_path / "never-synced").rename(tmp_path / "gone-again")
    r = harness(config, "exec", "box", "--", "pwd", env=env)
    assert (r.returncode, r.stdout.decode()) == (0, f"{tmp_path}/never-synced/work\n"), r.stderr

"""transport/host_keys.py, the one host-key decision, on known_hosts files written here: the line
forms OpenSSH reads (hashed names, wildcards, negation, @revoked, [host]:port, HostKeyAlias), and
its KnownHostsCommand side (what ssh is told, the refusal line the transport reads back). The
same function against the real sshd, on every client path: tests/test_host_key_table.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.errors import HostKeyError
from harness.transport import host_keys
from harness.transport.host_keys import CHANGED, KNOWN, RECORDED, REVOKED, UNKNOWN, KnownHosts, decide

ED = "ssh-ed25519"


def key(n: int) -> str:
    """A distinct ed25519 public key blob (base64), as known_hosts holds it."""
    import base64

    return base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + bytes([n]) * 32).decode()


@pytest.fixture
def known(tmp_path):
    return KnownHosts([str(tmp_path / "known_hosts"), str(tmp_path / "global")], str(tmp_path / "known_hosts"))


def write(known: KnownHosts, text: str, which: int = 0) -> None:
    with open(known.files[which], "w") as f:
        f.write(text)


@pytest.mark.parametrize("line, name, verdict", [
    (f"[10.0.0.1]:2222 {ED} {key(1)}", "[10.0.0.1]:2222", KNOWN),
    (f"10.0.0.1 {ED} {key(1)}", "[10.0.0.1]:2222", UNKNOWN),  # port 22's line is not port 2222's
    (f"gpu.example.com,10.0.0.1 {ED} {key(1)}", "GPU.example.com", KNOWN),  # names are case-insensitive
    (f"*.example.com {ED} {key(1)}", "gpu.example.com", KNOWN),
    (f"*.example.com,!gpu.example.com {ED} {key(1)}", "gpu.example.com", UNKNOWN),  # negation rules the line out
    (f"gpu? {ED} {key(1)}", "gpu1", KNOWN),
    (f"myalias {ED} {key(1)}", "myalias", KNOWN),  # HostKeyAlias: the alias is the name
    (f"[10.0.0.1]:2222 {ED} {key(2)}", "[10.0.0.1]:2222", CHANGED),
    (f"[10.0.0.1]:2222 ecdsa-sha2-nistp256 {key(3)}", "[10.0.0.1]:2222", CHANGED),  # recorded keys, none of them this one
    (f"@revoked * {ED} {key(1)}\n[10.0.0.1]:2222 {ED} {key(1)}", "[10.0.0.1]:2222", REVOKED),
    (f"@cert-authority * {ED} {key(2)}", "[10.0.0.1]:2222", UNKNOWN),  # host certificates are not used
    (f"# [10.0.0.1]:2222 {ED} {key(1)}\n\n", "[10.0.0.1]:2222", UNKNOWN),
])
def test_the_line_forms_openssh_reads(known, line, name, verdict):
    write(known, line + "\n")
    decision = decide(known, name, ED, key(1), accept_new=False)
    assert decision.kind == verdict, decision
    assert decision.accepted == (verdict == KNOWN)
    if not decision.accepted:
        error = decision.error("gpu")
        assert isinstance(error, HostKeyError) and "\n" not in str(error) and str(error).startswith("gpu: ")
        assert host_keys.fingerprint(key(1)) in str(error)


def test_the_global_file_counts_and_a_hashed_name_matches(known):
    write(known, f"{host_keys._hashed('[10.0.0.1]:2222')} {ED} {key(1)}\n", which=1)
    assert decide(known, "[10.0.0.1]:2222", ED, key(1), accept_new=False).kind == KNOWN
    assert decide(known, "[10.0.0.1]:2223", ED, key(1), accept_new=False).kind == UNKNOWN


def test_accept_new_records_once_hashed_when_asked_and_never_a_changed_key(known, tmp_path):
    hashed = KnownHosts(known.files, known.record_to, hash_names=True)
    first = decide(hashed, "[10.0.0.1]:2222", ED, key(1), accept_new=True)
    assert first.kind == RECORDED and host_keys.fingerprint(key(1)) in first.message
    text = open(known.record_to).read()
    assert text.startswith("|1|") and "10.0.0.1" not in text and text.count("\n") == 1
    assert decide(hashed, "[10.0.0.1]:2222", ED, key(1), accept_new=True).kind == KNOWN  # not recorded twice
    assert decide(hashed, "[10.0.0.1]:2222", ED, key(2), accept_new=True).kind == CHANGED
    assert open(known.record_to).read() == text
    found = subprocess.run(["ssh-keygen", "-F", "[10.0.0.1]:2222", "-f", known.record_to], capture_output=True)
    assert found.returncode == 0  # OpenSSH finds what was recorded


def test_the_recorded_types_are_asked_for_first(known):
    write(known, f"[h]:2 ssh-rsa {key(1)}\n[h]:2 {ED} {key(2)}\nother {ED} {key(3)}\n")
    assert host_keys.preferred_types(known, "[h]:2") == ["ssh-rsa", ED]


def test_as_openssh_s_known_hosts_command(known, tmp_path):
    """What ssh runs (openssh.safety_config): it is told the lines the decision accepts, and a
    refusal is one line on stderr that the transport reads back (refusal_in)."""
    write(known, f"[h]:2 {ED} {key(1)}\n")
    plan = tmp_path / "plan"
    plan.write_text(host_keys.plan_text(False, KnownHosts([str(tmp_path / "none")], str(tmp_path / "none")), {"[H]:2": known}))

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-S", "-I", host_keys.__file__, str(plan), *args], capture_output=True, text=True, timeout=60)

    assert run("ORDER", "[h]:2", "NONE", "NONE").stdout == f"[h]:2 {ED} {key(1)}\n"
    ok = run("HOSTNAME", "[h]:2", ED, key(1))
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, f"[h]:2 {ED} {key(1)}\n", "")
    changed = run("HOSTNAME", "[h]:2", ED, key(2))
    assert changed.stdout == f"[h]:2 {ED} {key(1)}\n"  # ssh compares with the recorded key: it refuses too
    message, hint = host_keys.refusal_in(changed.stderr)
    assert "CHANGED" in message and host_keys.fingerprint(key(2)) in message and "remove its old line" in hint
    unknown = run("HOSTNAME", "[other]:2", ED, key(1))  # a name the plan does not list: the default files
    assert unknown.stdout == "" and "unknown host key for [other]:2" in host_keys.refusal_in(unknown.stderr)[0]


@pytest.mark.parametrize("meanwhile, verdict", [(1, KNOWN), (2, CHANGED)])
def test_a_key_recorded_while_the_recorder_waits_for_the_lock_is_seen(known, tmp_path, meanwhile, verdict):
    """Two connections to a new host at once, each told to record its key: the one that gets the
    lock second must look again (under the lock) at what the first recorded. Here the first is
    this test, holding the lock while writing; the second, ssh's KnownHostsCommand (a process of
    its own), is caught waiting on the lock (/proc/locks) after its check found nothing. Then:
    the same key -> KNOWN, not written twice; another key -> CHANGED, not recorded beside it."""
    import fcntl
    import time

    plan = tmp_path / "plan"
    plan.write_text(host_keys.plan_text(True, known, {}))
    with open(known.record_to, "ab") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        recorder = subprocess.Popen([sys.executable, "-S", "-I", host_keys.__file__, str(plan), "HOSTNAME", "[h]:2", ED, key(1)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not _waits_for_a_lock(recorder.pid):
            assert recorder.poll() is None and time.monotonic() < deadline, "the recorder did not wait for the lock"
            time.sleep(0.01)
        held.write(f"[h]:2 {ED} {key(meanwhile)}\n".encode())
        held.flush()
    out, err = recorder.communicate(timeout=30)
    assert open(known.record_to).read() == f"[h]:2 {ED} {key(meanwhile)}\n"  # one line: the first recorder's
    assert decide(known, "[h]:2", ED, key(1), accept_new=False).kind == verdict
    if verdict == KNOWN:
        assert (out, err) == (f"[h]:2 {ED} {key(1)}\n", "")  # accepted, nothing recorded
    else:
        assert out == f"[h]:2 {ED} {key(2)}\n" and "CHANGED" in host_keys.refusal_in(err)[0]


def _waits_for_a_lock(pid: int) -> bool:
    """Whether process pid is blocked on a file lock (a `->` line of /proc/locks)."""
    with open("/proc/locks") as f:
        return any(line.split()[1] == "->" and line.split()[5] == str(pid) for line in f if len(line.split()) > 5)

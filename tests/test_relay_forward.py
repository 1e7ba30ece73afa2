"""harness.relay_forward on this machine's LocalTransport (the SSH path and `docker exec` are the same
helper, exercised by test_tensorboard.py and test_serve_vllm.py): each connection to the local port
is one relay.py started through harness.helpers, which moves raw bytes both ways after its request
line, to a unix socket (its only target: never a TCP port); and a HostServer whose argv is a host
helper gets its payload ahead of the lifeline's beats."""

from __future__ import annotations

import hashlib
import os
import socket
import sys
import threading
import time

from harness import helpers
from harness.config import HostConfig
from harness.relay_forward import Relay, RelayForwarding
from harness.runtime.host import HostRuntime
from harness.transport.local import LocalTransport


def runtime(tmp_path) -> HostRuntime:
    workdir = str(tmp_path / "work")
    return HostRuntime(HostConfig(name="local", local=True, python=sys.executable, workdir=workdir), workdir)


def digest_server(listener: socket.socket) -> None:
    """Per connection: a greeting first (the server speaks before the client), then everything
    it got until the client's half-close, answered with its length and SHA-256."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        with conn:
            conn.sendall(b"hello\n")
            got = hashlib.sha256()
            size = 0
            while data := conn.recv(65536):
                got.update(data)
                size += len(data)
            conn.sendall(f"{size} {got.hexdigest()}\n".encode())


def through(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
        writer = threading.Thread(target=lambda: (c.sendall(data), c.shutdown(socket.SHUT_WR)))
        writer.start()
        out = b""
        while chunk := c.recv(65536):
            out += chunk
        writer.join()
        return out


def test_each_connection_is_relayed_both_ways_as_raw_bytes(tmp_path):
    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen(8)
    threading.Thread(target=digest_server, args=(listener,), daemon=True).start()
    forwarding = RelayForwarding(LocalTransport(), Relay(runtime(tmp_path), path), 0)
    try:
        port = forwarding.addresses[0][1]
        data = os.urandom(3 << 20) + b"\n{not json}\n\x00"  # binary, and lines that look like a request
        answers = [None, None]

        def fetch(i: int) -> None:
            answers[i] = through(port, data)

        both = [threading.Thread(target=fetch, args=(i,)) for i in range(2)]  # a relay each
        for t in both:
            t.start()
        for t in both:
            t.join(120)
        assert answers == [f"hello\n{len(data)} {hashlib.sha256(data).hexdigest()}\n".encode()] * 2
    finally:
        forwarding.close()
        listener.close()


def test_a_relay_to_where_nothing_listens_closes_the_connection_with_one_warning(tmp_path, capfd):
    forwarding = RelayForwarding(LocalTransport(), Relay(runtime(tmp_path), str(tmp_path / "none.sock")), 0)
    said = ""
    try:
        for _ in range(2):
            assert through(forwarding.addresses[0][1], b"x") == b""
        deadline = time.monotonic() + 30  # the relay's thread writes the warning after its helper ends
        while "a forwarded connection failed" not in said and time.monotonic() < deadline:
            time.sleep(0.1)
            said += capfd.readouterr().err
        time.sleep(0.5)  # room for a second warning, were there one
    finally:
        forwarding.close()
    warnings = [line for line in (said + capfd.readouterr().err).splitlines() if "a forwarded connection failed" in line]
    assert len(warnings) == 1 and f"relay: {tmp_path}/none.sock" in warnings[0], warnings


# A helper of the test's own, held as a server: it says its request, then lives until stopped.
HELD = """
import json, sys, time
request = json.load(sys.stdin)
print(json.dumps(request), flush=True)
time.sleep(600)
"""


def test_a_host_server_that_is_a_helper_gets_its_payload_then_ends_with_its_stdin(tmp_path, monkeypatch):
    from harness import host_helpers
    from harness.host_server import HostServer

    real = host_helpers.source
    monkeypatch.setattr(host_helpers, "source", lambda name: HELD if name == "held.py" else real(name))
    (tmp_path / "work").mkdir()
    request = {"said": "a\nb " + "x" * 70000}  # more than a pipe holds: read whole before the beats
    server = HostServer(LocalTransport(), runtime(tmp_path), helpers.command("held.py", sys.executable), stdout=True,
                        payload=helpers.payload("held.py", request))
    try:
        import json

        assert json.loads(server._proc.stdout.readline()) == request
        assert server.alive()
    finally:
        started = time.monotonic()
        server.close()
    assert not server.alive() and time.monotonic() - started < 10

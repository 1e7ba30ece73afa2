"""The further streams of a pull on a long link: direct-tcpip channels of the master (`ssh -W`) to
the first helper's loopback listener, behind a token; exec channels where the sshd forbids
forwarding. All through the real test sshd, with a delay line (bench/delayline.py) where the pull
must see a long link (the streams it opens depend on the round trip it measures)."""

from __future__ import annotations

import hashlib
import errno
import json
import os
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import zlib
from contextlib import contextmanager
from pathlib import Path

import pytest

from harness.pull import PART_SUFFIX, PullOptions, pull
from harness.pull.host import start_send
from harness.pull.streams import FirstStream

MiB = 1 << 20
LONG_RTT_MS = 30  # above the pull's short-link threshold (15 ms): it opens several streams at once
FRAME = struct.Struct(">BQ")

pytestmark = pytest.mark.ssh


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def direct_tcpip_channels(log: str) -> int:
    """Forwarded connections the sshd opened (LogLevel DEBUG1; a refused one logs its request only)."""
    return log.count(": new direct-tcpip")


def big_file(directory: Path, size: int) -> Path:
    directory.mkdir(parents=True)
    path = directory / "model.safetensors"
    with open(path, "wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
    return path


@contextmanager
def slow_transport(tmp_path: Path, port: int, host_pub_line: str, ssh_host, monkeypatch):
    """An SSHTransport to 127.0.0.1:port (a delay line in front of a test sshd), with its own
    ControlMaster directory."""
    from harness.config import HostConfig
    from harness.transport import ConnectOptions, connect
    from tests.fixtures.sshd import stop_control_masters
    from tests.test_pull import _slow_link_files

    config, known_hosts = _slow_link_files(ssh_host, tmp_path, port, host_pub_line)
    control = Path(tempfile.mkdtemp(prefix="hps-"))  # short: control socket paths are limited
    monkeypatch.setenv("HARNESS_CONTROL_DIR", str(control))
    try:
        with connect(HostConfig(name="slow", ssh="slow"), ConnectOptions(known_hosts=str(known_hosts), ssh_config=str(config))) as t:
            yield t
    finally:
        stop_control_masters(control)


def check_pulled(report, src: Path, dest: Path) -> None:
    assert report.ok, (report.failed, report.refused)
    assert sha(dest / src.name) == sha(src)
    assert not list(dest.rglob(f"*{PART_SUFFIX}*"))


def test_a_long_link_pull_runs_its_further_streams_through_the_listener(ssh_host, tmp_path, monkeypatch):
    from bench.delayline import DelayLine

    src = big_file(tmp_path / "host", 48 * MiB)
    dest = tmp_path / "dest"
    before = direct_tcpip_channels(ssh_host.box.log_text())
    with DelayLine(("127.0.0.1", ssh_host.port), rtt_ms=LONG_RTT_MS) as line:
        with slow_transport(tmp_path, line.port, ssh_host.box.host_pub_line, ssh_host, monkeypatch) as t:
            report = pull(t, str(src), dest, PullOptions(streams=4, piece_size=4 * MiB))
    check_pulled(report, src, dest)
    assert report.streams > 1
    # every further stream was a forwarded connection (the first is the exec channel with the listing)
    assert direct_tcpip_channels(ssh_host.box.log_text()) - before == report.streams - 1


def _frames(data: bytes) -> list[tuple[int, bytes]]:
    frames, at = [], 0
    while at < len(data):
        status, length = FRAME.unpack_from(data, at)
        frames.append((status, data[at + FRAME.size: at + FRAME.size + length]))
        at += FRAME.size + length
    return frames


def _answer(s: socket.socket) -> bytes:
    """Everything the peer sends before it closes (a reset, from a close with our bytes unread, ends it too)."""
    got = b""
    try:
        while chunk := s.recv(1 << 16):
            got += chunk
    except OSError as e:  # a reset, or a socket the peer already closed
        if e.errno not in (errno.ECONNRESET, errno.ENOTCONN):
            raise
    return got


def _connect_refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            return False
    except ConnectionRefusedError:
        return True


def test_the_listener_serves_only_with_its_token_and_ends_with_its_helper(ssh_host, tmp_path, monkeypatch):
    from tests.test_sync import ssh_transport

    src = tmp_path / "host" / "secret.bin"
    src.parent.mkdir()
    src.write_bytes(os.urandom(3 * MiB + 5))
    st = src.stat()
    request = (json.dumps(str(src.parent)) + "\n" + json.dumps([src.name, 0, 0, st.st_size, st.st_size, st.st_mtime_ns]) + "\n").encode()
    with ssh_transport(ssh_host, monkeypatch) as t:
        first = FirstStream(lambda: start_send(t, "python3"), listen=True)
        first.probe(short_s=1.0)
        first.join()
        assert first.ok and first.listener is not None
        listener = first.listener
        assert listener.token.hex() not in repr(listener)
        forward = t.stdio_forward_argv("127.0.0.1", listener.port)
        try:
            # through the master, a wrong token: closed unanswered
            wrong = subprocess.run(forward, input=bytes(len(listener.token)) + request, capture_output=True, timeout=60)
            assert wrong.stdout == b""
            # anyone else on the box (the box is this machine): straight to the port, no token
            with socket.create_connection(("127.0.0.1", listener.port), timeout=30) as s:
                try:
                    s.sendall(os.urandom(len(listener.token)) + request)
                    s.shutdown(socket.SHUT_WR)
                except OSError as e:  # the listener may close on the wrong token before we are done: the refusal itself
                    assert e.errno in (errno.ENOTCONN, errno.EPIPE, errno.ECONNRESET), e
                assert _answer(s) == b""
            # the token: the send protocol, the file's bytes and the CRC-32 of the piece
            right = subprocess.run(forward, input=listener.token + request, capture_output=True, timeout=60)
            frames = _frames(right.stdout)
            assert frames[0] == (3, b"") and frames[-1] == (2, zlib.crc32(src.read_bytes()).to_bytes(4, "big"))
            assert b"".join(data for status, data in frames if status == 0) == src.read_bytes()
        finally:
            first.stop()
        # the listener ends with the helper that opened it (the pull's first stream)
        deadline = time.monotonic() + 30
        while not _connect_refused(listener.port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _connect_refused(listener.port)


def test_where_the_sshd_forbids_forwarding_the_streams_are_exec_channels(ssh_host, tmp_path, monkeypatch):
    from bench.delayline import DelayLine
    from tests.fixtures.sshd import start_sshd

    server = start_sshd(tmp_path, "noforward", "127.0.0.1", ssh_host.root / "authorized_keys", log_level="DEBUG1", tcp_forwarding="no")
    try:
        src = big_file(tmp_path / "host", 48 * MiB)
        dest = tmp_path / "dest"
        with DelayLine(("127.0.0.1", server.port), rtt_ms=LONG_RTT_MS) as line:
            with slow_transport(tmp_path, line.port, server.host_pub_line, ssh_host, monkeypatch) as t:
                report = pull(t, str(src), dest, PullOptions(streams=4, piece_size=4 * MiB))
                check_pulled(report, src, dest)
                assert report.streams > 1
                log = server.log_text()
                assert "refused local port forward" in log and direct_tcpip_channels(log) == 0
                # and a second pull of a changed file still works the same way (each stream fell back on its own)
                with open(src, "r+b") as f:
                    f.write(os.urandom(MiB))
                shutil.rmtree(dest)
                check_pulled(pull(t, str(src), dest, PullOptions(streams=4, piece_size=4 * MiB)), src, dest)
    finally:
        server.stop()

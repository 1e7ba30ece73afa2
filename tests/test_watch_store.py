"""The group watchdog's store (remote_scripts/common/watch_store.py): a caller that does not know
the run's secret gets nothing and changes nothing; it listens on the address it was given only."""

from __future__ import annotations

import socket
import sys

import pytest

from tests.fixtures.pipeline_data import SCRIPTS_DIR
from tests.fixtures.sshd import free_port

sys.path.insert(0, str(SCRIPTS_DIR))


def test_a_caller_without_the_secret_can_neither_read_nor_post():
    from common.watch_store import WatchStoreClient, WatchStoreServer

    port = free_port()
    server = WatchStoreServer("127.0.0.1", port, b"the-run-secret")
    try:
        ours = WatchStoreClient("127.0.0.1", port, b"the-run-secret", timeout=5)
        assert ours.add("hb/0", 1) == 1 and ours.get("outcome/1") is None
        stranger = WatchStoreClient("127.0.0.1", port, b"a-guess", timeout=5)
        with pytest.raises(ConnectionError):
            stranger.set("outcome/1", "failed")  # what would stop every node
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:  # no handshake at all
            raw.recv(100)  # the nonce
            raw.sendall(b'{"op": "get", "key": "hb/0"}\n')
            assert raw.recv(100) == b""  # closed, nothing answered
        assert ours.get("outcome/1") is None and ours.add("hb/0", 0) == 1
        with pytest.raises(OSError):  # only the address it was given: not the wildcard's others
            socket.create_connection(("127.0.0.2", port), timeout=5).close()
    finally:
        server.close()

"""The group watchdog's store (node_launcher.py): counters and strings on node 0, for callers that
prove they know the run's secret.

torch's TCPStore, which it replaces here, listens on every interface and answers anyone, so anyone
who reached it could post "failed" and stop every node. This one listens on the rendezvous address
only, and a connection gets nothing until it has answered a challenge: the server sends a random
nonce, the client returns HMAC-SHA256(secret, nonce); the secret itself never crosses the wire.
(The link is not encrypted: someone who can rewrite the group's traffic can still meddle; the
rendezvous network is trusted that far, as NCCL's is.)

Wire: lines. After the handshake each request is a JSON line, {"op": "add", "key", "n"} (returns
the new value), {"op": "set", "key", "value"} or {"op": "get", "key"} (the value or null), and
each reply a JSON line {"value": ...}. Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import threading

SECRET_ENV = "HARNESS_WATCH_SECRET"  # the per-run secret, handed to every node in its environment


def _proof(secret: bytes, nonce: bytes) -> str:
    return hmac.new(secret, nonce, hashlib.sha256).hexdigest()


class WatchStoreServer:
    """The store, listening on (address, port) until close(); a thread per connection."""

    def __init__(self, address: str, port: int, secret: bytes):
        self.secret = secret
        self.values: dict[str, object] = {}
        self.lock = threading.Lock()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock = socket.create_server((address, port), family=family)
        threading.Thread(target=self._accept, name="watch-store-server", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(30)
            try:
                nonce = os.urandom(32)
                conn.sendall(nonce.hex().encode() + b"\n")
                lines = conn.makefile("rb")
                if not hmac.compare_digest(lines.readline(200).strip(), _proof(self.secret, nonce).encode()):
                    return  # a caller without the secret: nothing, not even an error
                conn.settimeout(None)
                for line in lines:
                    conn.sendall(json.dumps({"value": self._apply(json.loads(line))}).encode() + b"\n")
            except (OSError, ValueError, KeyError, TypeError):
                return

    def _apply(self, request: dict):
        op, key = request["op"], str(request["key"])
        with self.lock:
            if op == "add":
                self.values[key] = int(self.values.get(key, 0)) + int(request["n"])
            elif op == "set":
                self.values[key] = str(request["value"])
            elif op != "get":
                raise ValueError(op)
            return self.values.get(key)

    def close(self) -> None:
        self.sock.close()


class WatchStoreClient:
    """One connection to the store; a failed call closes it and the next one connects anew."""

    def __init__(self, host: str, port: int, secret: bytes, timeout: float):
        self.address, self.secret, self.timeout = (host, port), secret, timeout
        self.conn: socket.socket | None = None
        self.lines = None
        self.lock = threading.Lock()  # the prober and post() share the connection
        self._connect()

    def _connect(self) -> None:
        conn = socket.create_connection(self.address, timeout=self.timeout)
        try:
            lines = conn.makefile("rb")
            nonce = bytes.fromhex(lines.readline(200).decode().strip())
            conn.sendall(_proof(self.secret, nonce).encode() + b"\n")
        except (OSError, ValueError):
            conn.close()
            raise
        self.conn, self.lines = conn, lines

    def _call(self, **request):
        with self.lock:
            return self._exchange(request)

    def _exchange(self, request: dict):
        if self.conn is None:
            self._connect()
        try:
            self.conn.sendall(json.dumps(request).encode() + b"\n")
            reply = self.lines.readline()
            if not reply:
                raise ConnectionError("the watch store closed the connection (a wrong secret?)")
            return json.loads(reply)["value"]
        except (OSError, ValueError, KeyError):
            self.conn.close()
            self.conn = None
            raise

    def add(self, key: str, n: int) -> int:
        return int(self._call(op="add", key=key, n=n))

    def set(self, key: str, value: str) -> None:
        self._call(op="set", key=key, value=value)

    def get(self, key: str) -> str | None:
        return self._call(op="get", key=key)

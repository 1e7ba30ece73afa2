"""A byte relay for one forwarded connection (run by harness.relay_forward, on the host or by
`docker exec` in a container).

stdin: the request line {"socket": PATH} (harness/helpers.py), then the connection's bytes from
this machine; stdout: the server's bytes back, as they come. It connects to the server's unix
socket (never a TCP port: docs/security.md) and moves bytes both ways until the server closes;
this machine closing stdin half-closes the server's side. Exit 1 when nothing listens there
(stderr names it).
"""

import json
import socket
import sys
import threading


def up(stdin, server):
    """This machine's bytes to the server. read1: what the bootstrap's buffer already holds
    first, then what has come, never waiting for more than one read."""
    while True:
        data = stdin.read1(65536)
        if not data:
            break
        server.sendall(data)
    try:
        server.shutdown(socket.SHUT_WR)
    except OSError:
        pass


def main():
    stdin = sys.stdin.buffer
    where = json.loads(stdin.readline())["socket"]
    server = socket.socket(socket.AF_UNIX)
    try:
        server.connect(where)
    except OSError as e:
        sys.exit(f"relay: {where}: {e}")
    threading.Thread(target=up, args=(stdin, server), daemon=True).start()
    out = sys.stdout.buffer
    while True:
        data = server.recv(65536)
        if not data:
            break
        out.write(data)
        out.flush()


if __name__ == "__main__":
    main()

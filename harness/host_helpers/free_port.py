"""A free port pair on this host, for a group run's rendezvous (run by harness.multinode).

stdin: {"port": N} (harness/helpers.py)  stdout: {"port": P}: N itself when N and N+1 are free
(0: none wanted), else a free pair P, P+1 (P for torchrun's rendezvous, P+1 for the watchdogs'
store). Exit 1 when no pair was found.
"""

import json
import socket
import sys


def free(port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def main(want):
    if want and free(want) and free(want + 1):
        return want
    for _ in range(50):
        s = socket.socket()
        s.bind(("", 0))
        port = s.getsockname()[1]
        s.close()
        if port < 65535 and free(port) and free(port + 1):
            return port
    return None


if __name__ == "__main__":
    request = json.loads(sys.stdin.read())  # harness/helpers.py
    port = main(int(request.get("port") or 0))
    if port is None:
        print("no free port pair found", file=sys.stderr)
        sys.exit(1)
    json.dump({"port": port}, sys.stdout)

"""The local address this host would use to reach ADDRESS:PORT (run by `harness doctor GROUP`).

stdin: {"address": ..., "port": N} (harness/helpers.py)  stdout: {"via": LOCAL_ADDRESS}. A UDP
connect only picks a route: no packet is sent. Exit 1, saying why on stderr, when there is none.
"""

import json
import socket
import sys


def main(address, port):
    s = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.connect((address, port))
        return s.getsockname()[0]
    finally:
        s.close()


if __name__ == "__main__":
    request = json.loads(sys.stdin.read())  # harness/helpers.py
    try:
        via = main(request["address"], int(request["port"]))
    except OSError as e:
        print("no route: %s" % e, file=sys.stderr)
        sys.exit(1)
    json.dump({"via": via}, sys.stdout)

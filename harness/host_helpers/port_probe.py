"""Where ports of this host listen (run by harness.port_forward; stdlib only, one round trip).

stdin: {"ports": [PORT, ...]} (harness/helpers.py)  stdout: {"PORT": {"address": ..., "where": ...,
"uid": the listener's owner on the host, or null} or null}. `uid` is read from the kernel's
listener tables (/proc/net/tcp, tcp6): a port another user took first answers like ours, and
harness.port_forward refuses it. Loopback first; else a
running container's address: a container on docker's bridge network (the stages' default)
publishes no port on the host, yet the host reaches it at the container's own address (a server
of your own started there, e.g. by `harness exec`, listening on 0.0.0.0; the servers harness
starts in a container listen on its loopback only, reached by `docker exec`: harness.relay_forward).
"""

import json
import os
import shutil
import socket
import subprocess
import sys


def listens(address, port):
    try:
        with socket.create_connection((address, port), timeout=1):
            return True
    except OSError:
        return False


def listener_uid(port):
    """The uid owning the socket that listens on `port` in this host's network (any address), or None."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 7 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                return int(fields[7])
    return None


def container_addresses():
    """[(container name, address)] of the running containers this user may ask docker about."""
    if shutil.which("docker") is None:
        return []
    try:
        ids = subprocess.run(["docker", "ps", "-q"], capture_output=True, text=True, timeout=30).stdout.split()
        if not ids:
            return []
        fmt = "{{.Name}} {{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}"
        out = subprocess.run(["docker", "inspect", "-f", fmt, *ids], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in out.splitlines():
        name, *addresses = line.split()
        found += [(name.lstrip("/"), a) for a in addresses]
    return found


def main(ports):
    located = {}
    containers = None
    for port in ports:
        if listens("127.0.0.1", port):
            located[port] = {"address": "127.0.0.1", "where": "the host", "uid": listener_uid(port), "our_uid": os.getuid()}
            continue
        if containers is None:
            containers = container_addresses()
        located[port] = next(({"address": a, "where": "container " + n} for n, a in containers if listens(a, port)), None)
    json.dump({str(p): v for p, v in located.items()}, sys.stdout)


if __name__ == "__main__":
    request = json.loads(sys.stdin.read())  # harness/helpers.py
    main([int(p) for p in request["ports"]])

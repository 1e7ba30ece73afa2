"""common/private_network.py on this machine's kernel: a process started through it listens on a
loopback of its own, which the box's network does not show, keeping its uid; for root and for an
unprivileged uid alike. (vLLM in it, end to end: tests/test_serve_vllm.py, tests/test_vllm_online.py.)"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from tests.fixtures.other_user import PYTHON
from tests.fixtures.pipeline_data import SCRIPTS_DIR

sys.path.insert(0, str(SCRIPTS_DIR))
from common import private_network  # noqa: E402

# listen on the loopback and answer every connection with argv[1] (a nonce: who reaches THIS
# server, not another on the same port, reads it); reach it from its own network; say where:
# port, network namespace, uid; then serve until stdin closes
LISTENER = """
import os, socket, sys, threading
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
def serve():
    while True:
        c, _ = s.accept(); c.sendall(sys.argv[1].encode()); c.close()
threading.Thread(target=serve, daemon=True).start()
with socket.create_connection(s.getsockname()) as c:  # reached from its own network
    assert c.recv(64) == sys.argv[1].encode()
print(s.getsockname()[1], os.readlink("/proc/self/ns/net"), os.getuid(), flush=True)
sys.stdin.read()
"""


def _serve(argv: list[str]):
    """Start the LISTENER command line argv; (the process, port, namespace, uid, nonce)."""
    nonce = uuid.uuid4().hex
    child = subprocess.Popen([*argv, nonce], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    port, namespace, uid = child.stdout.readline().split()
    return child, int(port), namespace, int(uid), nonce


def _stop(child) -> None:
    child.stdin.close()
    assert child.wait(timeout=30) == 0, child.stderr.read()


def _check_listener(argv: list[str], uid: int, other_user) -> None:
    child, port, namespace, seen_uid, nonce = _serve(argv)
    try:
        assert namespace != os.readlink("/proc/self/ns/net") and seen_uid == uid
        # What the box's users can do: connect to its port on the box's loopback. Neither another
        # uid nor this one reaches it (a refusal, or another server that happens to hold the port).
        assert other_user.reach_tcp(port, nonce) != "reached"
        assert other_user.reach_tcp(port, nonce, as_this_uid=True) != "reached"
    finally:
        _stop(child)


def test_the_probe_reaches_a_server_in_the_box_s_own_network(other_user):
    """The probe's control: the same listener, started plainly, is reached by another uid."""
    child, port, _, _, nonce = _serve([sys.executable, "-c", LISTENER])
    try:
        assert other_user.reach_tcp(port, nonce) == "reached"
    finally:
        _stop(child)
    assert other_user.reach_tcp(port, nonce) != "reached"  # (ECONNREFUSED, unless the port was taken again meanwhile)


def test_a_server_in_a_network_of_its_own_listens_where_the_box_does_not_see_it(other_user):
    assert private_network.unavailable() is None  # this test bed allows user namespaces
    _check_listener(private_network.wrap([sys.executable, "-c", LISTENER]), os.getuid(), other_user)
    as_other = ["setpriv", f"--reuid={other_user.uid}", f"--regid={other_user.gid}", "--clear-groups", "--reset-env",
                PYTHON, private_network.__file__, "--", PYTHON, "-c", LISTENER]
    _check_listener(as_other, other_user.uid, other_user)


def test_a_command_line_without_a_command_is_refused():
    done = subprocess.run([sys.executable, private_network.__file__, "--"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == "usage: private_network.py --check | -- ARGV..."

"""common/private_network.py on this machine's kernel: a process started through it listens on a
loopback of its own, which the box's network does not show, keeping its uid; for root and for an
unprivileged uid alike. (vLLM in it, end to end: tests/test_serve_vllm.py, tests/test_vllm_online.py.)"""

from __future__ import annotations

import os
import subprocess
import sys

from tests.fixtures.other_user import PYTHON
from tests.fixtures.pipeline_data import SCRIPTS_DIR

sys.path.insert(0, str(SCRIPTS_DIR))
from common import private_network  # noqa: E402
from common.vllm_server import listening_sockets  # noqa: E402

# listen on the loopback, connect to it, and say where: port, network namespace, uid; then wait for stdin to close
LISTENER = """
import os, socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
socket.create_connection(s.getsockname()).close()
print(s.getsockname()[1], os.readlink("/proc/self/ns/net"), os.getuid(), flush=True)
sys.stdin.read()
"""


def _check_listener(argv: list[str], uid: int) -> None:
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port, namespace, seen_uid = child.stdout.readline().split()
        assert namespace != os.readlink("/proc/self/ns/net") and int(seen_uid) == uid
        ports = {int(address.rsplit(":", 1)[1], 16) for address in listening_sockets().values()}
        assert int(port) not in ports  # listening now, but not in the box's network
    finally:
        child.stdin.close()
        assert child.wait(timeout=30) == 0, child.stderr.read()


def test_a_server_in_a_network_of_its_own_listens_where_the_box_does_not_see_it(other_user):
    assert private_network.unavailable() is None  # this test bed allows user namespaces
    _check_listener(private_network.wrap([sys.executable, "-c", LISTENER]), os.getuid())
    as_other = ["setpriv", f"--reuid={other_user.uid}", f"--regid={other_user.gid}", "--clear-groups", "--reset-env",
                PYTHON, private_network.__file__, "--", PYTHON, "-c", LISTENER]
    _check_listener(as_other, other_user.uid)


def test_a_command_line_without_a_command_is_refused():
    done = subprocess.run([sys.executable, private_network.__file__, "--"], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.strip() == "usage: private_network.py --check | -- ARGV..."

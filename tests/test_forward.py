"""`harness forward`: a real HTTP server on the box behind the test sshd, fetched from here
through the forward (directly and through ProxyJump); a taken local port and a port where nothing
listens are one line each; a server in a container on docker's bridge network is found and
forwarded the same way. (An unknown host key: tests/test_host_key_safety.py.)"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.port_forward import PortSpec
from tests.fixtures.sshd import free_port, listening

pytestmark = pytest.mark.ssh
DEADLINE_S = 60


def start_forward(config: Path, env: dict[str, str], *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "forward", *args], env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_urls(proc: subprocess.Popen, count: int) -> list[str]:
    """The first `count` stdout lines (`URL  ->  where`), once the forward is up."""
    lines = [proc.stdout.readline() for _ in range(count)]
    assert all(lines), proc.communicate(timeout=DEADLINE_S)
    return [line.split()[0] for line in lines]


def stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=DEADLINE_S)
    return proc.returncode, err


@pytest.fixture
def http_server(tmp_path):
    """python -m http.server on the box's loopback (the box is this machine, behind its sshd)."""
    root = tmp_path / "served"
    root.mkdir()
    (root / "hello.txt").write_text("hello through the tunnel\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory", str(root), str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + DEADLINE_S
    while not listening(port):
        assert time.monotonic() < deadline and proc.poll() is None, "http.server did not start"
        time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait()



def test_port_specs():
    assert PortSpec.parse("6006") == PortSpec(6006, 6006)
    assert PortSpec.parse("8000:18000") == PortSpec(8000, 18000)
    for bad in ("0", "70000", "x", "80:", ":80", "1:2:3"):
        with pytest.raises(UsageError):
            PortSpec.parse(bad)


@pytest.mark.parametrize("host", ["box", "behind"])  # behind: through ProxyJump box
def test_a_real_http_server_is_fetched_through_the_forward(ssh_host, harness_config, http_server, host):
    local = free_port()
    proc = start_forward(harness_config, ssh_host.env(), host, f"{http_server}:{local}")
    [url] = read_urls(proc, 1)
    assert url == f"http://127.0.0.1:{local}"
    with urllib.request.urlopen(f"{url}/hello.txt", timeout=DEADLINE_S) as r:
        assert r.read() == b"hello through the tunnel\n"
    code, err = stop(proc)
    assert code == 0 and "forwarding stopped" in err and "warning" not in err, err
    assert not listening(local)  # the tunnel ended with the command


def test_a_taken_local_port_is_one_error_line(ssh_host, harness_config, http_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "harness", "--config", str(harness_config), "forward", "box", f"{http_server}:{port}"],
                           env=ssh_host.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=DEADLINE_S)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines() == [f"harness: error: local port {port} is already in use on this machine (pick another: REMOTE_PORT:LOCAL_PORT)"]


def test_a_port_where_nothing_listens_is_said_in_one_line(ssh_host, harness_config):
    remote, local = free_port(), free_port()
    proc = start_forward(harness_config, ssh_host.env(), "box", f"{remote}:{local}")
    read_urls(proc, 1)
    code, err = stop(proc)
    assert code == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("harness: warning:")]
    assert warnings == [f"harness: warning: nothing listens on port {remote} of box yet; the forward stays open for when something does"], err


@pytest.mark.docker
def test_a_server_in_a_bridge_network_container_is_found_and_forwarded(ssh_host, harness_config, docker_base_image):
    """The stages' containers are on docker's bridge network (no port published on the host):
    the forward finds the container whose address answers and tunnels to it."""
    import secrets

    port, local = free_port(), free_port()
    name = f"harness-forward-test-{secrets.token_hex(3)}"
    script = f"echo in the container > /tmp/c.txt && cd /tmp && exec python3 -m http.server {port}"
    subprocess.run(["docker", "run", "-d", "--rm", "--pull=never", "--name", name, docker_base_image, "sh", "-c", script],
                   check=True, capture_output=True, timeout=DEADLINE_S)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:  # until the server in the container answers
            proc = start_forward(harness_config, ssh_host.env(), "box", f"{port}:{local}")
            line = proc.stdout.readline()
            if f"(container {name})" in line or time.monotonic() > deadline:
                break
            stop(proc)
            time.sleep(0.5)
        assert line.split()[0] == f"http://127.0.0.1:{local}" and f"port {port} of box (container {name})" in line, (line, stop(proc))
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/c.txt", timeout=DEADLINE_S) as r:
            assert r.read() == b"in the container\n"
        assert stop(proc)[0] == 0
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, timeout=DEADLINE_S)


def test_the_local_host_needs_no_tunnel(ssh_host, harness_config, http_server):
    proc = start_forward(harness_config, ssh_host.env(), "local", f"{http_server}:{free_port()}")
    [url] = read_urls(proc, 1)
    assert url == f"http://127.0.0.1:{http_server}"  # the server's own address, said directly
    with urllib.request.urlopen(f"{url}/hello.txt", timeout=DEADLINE_S) as r:
        assert r.read() == b"hello through the tunnel\n"
    assert stop(proc)[0] == 0

"""What a neighbour on the box (another uid: tests/fixtures/other_user.py) can do to a harness
user there, tried as that uid: read the run's files, take its locks, squat the port it forwards,
make its compile cache first; and another user of the laptop squatting the ssh control directory.
Each is refused by what the other uid can actually do (open, flock, connect), not by reading our
own modes back."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from harness.config import load_config
from harness.runtime.base import CACHE_DIRS
from harness.transport import connect
from tests.fixtures.job_project import write_project
from tests.fixtures.other_user import PYTHON
from tests.fixtures.sshd import free_port, listening

DEADLINE_S = 60

# as the other uid: open PATH for reading, or take its flock; prints "ok" or the errno's name
TRY = r"""
import errno, fcntl, os, sys
what, path = sys.argv[1], sys.argv[2]
try:
    if what == "read":
        open(path, "rb").read(1)
    elif what == "list":
        os.listdir(path)
    else:
        fd = os.open(path, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("ok")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e)))
"""


def as_other(other_user, what: str, path: Path) -> str:
    done = other_user.run([PYTHON, "-c", TRY, what, str(path)])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_neighbour_reads_nothing_of_a_run_and_takes_none_of_its_locks(tmp_path, other_user):
    """After a run: the workdir is 0700 (made so by the sync, also when it existed open), so the
    other uid lists nothing, opens no log, record, artifact or lock there: it cannot block the
    queue by holding queue.lock. What the stages wrote is private too (the supervisor's umask)."""
    workdir = tmp_path / "work"
    workdir.mkdir(mode=0o755)
    workdir.chmod(0o755)  # as an older harness left it
    tmp_path.chmod(0o755)
    config = write_project(tmp_path / "project", workdir, {"train": {"print_env": "TORCHINDUCTOR_CACHE_DIR"}},
                           host_table={"python": sys.executable})
    env = {k: v for k, v in os.environ.items() if k not in CACHE_DIRS}  # torch in this process may have set them
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "run", "box", "prepare", "train"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.splitlines()[0]
    run_dir = workdir / "runs" / run_id
    assert workdir.stat().st_mode & 0o777 == 0o700
    for path in (workdir / ".harness" / "queue.lock", run_dir / "train" / "log", run_dir / "run.json"):
        assert path.exists()
        assert as_other(other_user, "lock" if path.name.endswith(".lock") else "read", path) == "EACCES", path
    assert as_other(other_user, "list", workdir) == "EACCES"
    # inside, what the supervisor and the stages made has no bits for others either (the workdir
    # may be opened later by its owner; the files stay theirs alone)
    made = [p for p in [run_dir, *run_dir.rglob("*"), *(workdir / "outputs" / "artifacts").rglob("*")] if not p.is_symlink()]
    assert made and [str(p) for p in made if p.stat().st_mode & 0o077] == []
    # a stage's compile caches are under the workdir, not in a /tmp another uid can make first
    digest = hashlib.sha256(f"{workdir}/.harness/cache/torchinductor".encode()).hexdigest()
    assert f"env TORCHINDUCTOR_CACHE_DIR sha256 {digest}" in (run_dir / "train" / "log").read_text()


def test_a_stage_keeps_a_compile_cache_the_host_names_itself(tmp_path, monkeypatch):
    """The cache directories are defaults: a value the host's environment sets wins."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/mine")
    config = write_project(tmp_path / "project", tmp_path / "work", {"prepare": {"print_env": "TORCHINDUCTOR_CACHE_DIR"}},
                           host_table={"python": sys.executable})
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(config), "run", "box", "prepare"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"env TORCHINDUCTOR_CACHE_DIR sha256 {hashlib.sha256(b'/mine').hexdigest()}" in r.stdout


@pytest.mark.ssh
def test_forward_refuses_a_port_another_user_listens_on(ssh_host, harness_config, other_user, tmp_path):
    """The other uid listens first on the port a user's server would take: `harness forward`
    says so in one line and connects nothing (its look-alike would get the user's requests)."""
    port = free_port()
    squatter = subprocess.Popen(["setpriv", f"--reuid={other_user.uid}", f"--regid={other_user.gid}", "--clear-groups", PYTHON,
                                 "-m", "http.server", "--bind", "127.0.0.1", str(port)], cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not listening(port):
            assert time.monotonic() < deadline and squatter.poll() is None, "the squatter did not start"
            time.sleep(0.1)
        local = free_port()
        r = subprocess.run([sys.executable, "-m", "harness", "--config", str(harness_config), "forward", "box", f"{port}:{local}"],
                           env=ssh_host.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=DEADLINE_S)
        assert r.returncode == 2, r.stderr
        assert r.stderr.splitlines() == [f"harness: error: box: port {port} listens for another user (uid {other_user.uid}), not for you: "
                                         "not forwarded (start your server on another port (or find who holds it: ss -ltnp))"]
        assert not listening(local)
    finally:
        squatter.terminate()
        squatter.wait()


def test_a_squatted_control_directory_on_the_laptop_is_passed_over(tmp_path, other_user, monkeypatch):
    """Another laptop user makes the shared /tmp name of our ssh control directory first (before
    our first command): harness neither trusts it nor stops, it keeps its sockets in a directory of
    its own, and every later command finds the same one."""
    from harness.transport import control_dir

    shared = Path(tempfile.mkdtemp(prefix="harness-test-tmp-", dir="/tmp"))  # a /tmp of the test's own: sticky, open to all
    try:
        shared.chmod(0o1777)
        squatted = shared / f"harness-ssh-{os.getuid()}"
        made = other_user.run(["mkdir", "-m", "777", str(squatted)])
        assert made.returncode == 0, made.stderr
        monkeypatch.setattr(control_dir, "SHARED", str(shared / "harness-ssh-{uid}"))
        monkeypatch.delenv("HARNESS_CONTROL_DIR", raising=False)
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
        monkeypatch.setenv("HOME", str(tmp_path / "home"))
        chosen = control_dir.ensure()
        assert chosen == str(tmp_path / "home" / ".cache" / "harness" / "ssh") == control_dir.path()
        assert os.stat(chosen).st_mode & 0o777 == 0o700 and os.stat(squatted).st_uid == other_user.uid  # theirs, untouched
    finally:
        shutil.rmtree(shared)


@pytest.mark.ssh
def test_the_serve_key_is_handed_over_in_a_directory_no_one_else_enters(ssh_host, harness_config, other_user, tmp_path):
    """harness serve writes vLLM's key on the box before serve_draft.py reads and removes it: into
    <output_dir>/serve made 0700 first (also when it existed open), so no other uid opens it,
    not even in the instant between its creation and its chmod (an inotify watcher did, before)."""
    from harness.serve import private_dir, serve_dir_of

    config = load_config(harness_config)
    transport = connect(config.host("box"), ssh_host.connect_options())
    try:
        workdir = transport.expand(config.host("box").workdir)
        serve_dir = Path(serve_dir_of(workdir, "outputs"))
        serve_dir.mkdir(parents=True, exist_ok=True)
        serve_dir.chmod(0o777)
        Path(workdir).chmod(0o755)
        private_dir(transport, str(serve_dir))
        transport.put_bytes(b"the-key", str(serve_dir / ".api-key-test"), mode=0o600)
        assert as_other(other_user, "read", serve_dir / ".api-key-test") == "EACCES"
        assert as_other(other_user, "list", serve_dir) == "EACCES"
    finally:
        transport.close()


def test_serve_draft_makes_its_socket_directory_itself_and_says_where(tmp_path, other_user):
    """--private-socket: serve_draft.py makes the directory (mkdtemp: a random name, 0700) before
    anything names it, and reports the socket as an artifact event (harness relays to it once
    told): no one can make the directory first from a name read off `ps`, nor connect to it."""
    from tests.test_serve_check import _fake_export

    repo = Path(__file__).resolve().parents[1]
    loading = f"{sys.executable} -c 'import time; time.sleep(120)'"  # a vLLM that takes its time to load
    proc = subprocess.Popen([sys.executable, str(repo / "remote_scripts" / "serve_draft.py"), "--export", str(_fake_export(tmp_path, heads=2)),
                             "--private-socket", "--vllm-command", loading, "--log", str(tmp_path / "vllm.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=repo)
    try:
        socket_path = None
        for line in proc.stdout:
            event = json.loads(line)
            assert event["event"] != "finished", (event, proc.stderr.read())
            if event["event"] == "artifact" and event["kind"] == "socket":
                socket_path = event["path"]
                break
        from harness.serve import SOCKET_RE

        assert socket_path and SOCKET_RE.match(socket_path), socket_path
        directory = Path(socket_path).parent
        assert directory.stat().st_mode & 0o777 == 0o700 and directory.stat().st_uid == os.getuid()
        assert str(directory) not in Path(f"/proc/{proc.pid}/cmdline").read_text()  # serve_draft's own command line names no directory
        assert other_user.connect_unix(socket_path) == "EACCES"
    finally:
        proc.terminate()
        proc.wait(timeout=DEADLINE_S)
    deadline = time.monotonic() + DEADLINE_S
    while directory.exists():  # removed with the server, once it is stopped
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_serve_refuses_a_socket_path_that_is_not_one_serve_draft_makes():
    from harness.serve import SOCKET_RE

    assert SOCKET_RE.match("/tmp/harness-serve-a1b2_c3d4/vllm.sock")
    for bad in ("/tmp/harness-serve-x/../../etc/vllm.sock", "/home/user/.ssh/vllm.sock", "relative/vllm.sock", "/tmp/harness-serve-x/other.sock"):
        assert not SOCKET_RE.match(bad), bad

"""LocalTransport: the same contract as SSHTransport, with subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import UsageError
from harness.transport.local import LocalTransport

TRICKY = ["a b", "it's", 'say "hi"', "$HOME", "`id`", "a;b", "x\ny", "héllo ✓", "*", "", "-n"]


@pytest.fixture
def local():
    return LocalTransport("local")


def test_exit_codes_capture_and_missing_command(local):
    r = local.run(["sh", "-c", "echo out; echo err >&2; exit 42"])
    assert (r.exit_code, r.stdout, r.stderr) == (42, b"out\n", b"err\n")
    assert local.run(["no-such-command-xyz"]).exit_code == 127


def test_arguments_are_not_interpreted(local):
    r = local.run(["printf", "%s\\0", *TRICKY])
    assert r.stdout.decode().split("\0")[:-1] == TRICKY


def test_cwd_env_stdin(local, tmp_path):
    r = local.run(["sh", "-c", 'pwd; cat; printf "%s" "$X1"'], cwd=str(tmp_path), stdin=b"in\n", env={"X1": "v $x"})
    assert r.stdout.decode() == f"{tmp_path}\nin\nv $x"
    missing = local.run(["true"], cwd=str(tmp_path / "missing"))
    assert missing.exit_code != 0 and b"missing" in missing.stderr
    with pytest.raises(UsageError):
        local.run(["true"], env={"X": "a\nb"})


def test_streaming_sink_sees_output_before_the_end(local, tmp_path):
    flag = tmp_path / "go"
    seen: list[bytes] = []

    def sink(chunk: bytes) -> None:
        seen.append(chunk)
        flag.touch()

    script = 'echo first; i=0; while [ ! -e "$1" ]; do i=$((i+1)); [ $i -gt 200 ] && exit 9; sleep 0.05; done; echo second'
    r = local.run(["sh", "-c", script, "sh", str(flag)], stdout=sink)
    assert r.exit_code == 0 and b"".join(seen) == b"first\nsecond\n"


def test_timeout_kills(local):
    r = local.run(["sleep", "30"], timeout=0.5)
    assert r.exit_code != 0


def test_files(local, tmp_path):
    path = tmp_path / "d" / "e" / "f"
    local.put_bytes(b"abc", str(path))
    assert path.read_bytes() == b"abc"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask
    local.put_bytes(b"x", str(path), mode=0o600)
    assert path.stat().st_mode & 0o777 == 0o600
    assert os.listdir(path.parent) == ["f"]
    assert local.get_bytes(str(path)) == b"x"
    assert local.stat(str(path)).size == 1 and local.stat(str(tmp_path)).is_dir
    (tmp_path / "l").symlink_to(path)
    assert local.stat(str(tmp_path / "l")).is_link
    assert local.stat(str(tmp_path / "nope")) is None
    with pytest.raises(FileNotFoundError):
        local.get_bytes(str(tmp_path / "nope"))


def test_home_and_expand(local, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert local.home() == str(tmp_path)
    assert local.expand("~/x") == f"{tmp_path}/x" and local.expand("/abs") == "/abs"
    assert local.local_argv(["cat", "f"]) == ["cat", "f"]


def test_the_transport_package_stands_without_the_config_module():
    """transport/ takes a ConnectionSpec, never harness.config (the layer above it)."""
    from harness.transport import ConnectionSpec, connect

    modules = sorted(p.stem for p in (Path(__file__).parents[1] / "harness" / "transport").glob("*.py") if p.stem != "__init__")
    code = f"import sys; import {', '.join('harness.transport.' + m for m in modules)}; print('harness.config' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "False\n"), r.stderr
    with connect(ConnectionSpec("here", local=True)) as t:
        assert t.run(["echo", "ok"]).text == "ok\n"


def test_a_silent_255_is_the_links_end_when_the_master_stops_answering_a_moment_later(tmp_path):
    """A mux client whose master was killed exits 255 and says nothing; the master's socket can
    still take a connection for a moment while the kernel tears the process down. RemoteProcess
    asks the link again before it calls the 255 the command's own."""
    from harness.errors import LinkLostError, RemoteCommandError
    from harness.transport.process import RemoteProcess

    def ended(answers: list[bool]):
        log = tmp_path / f"client-{len(answers)}.log"
        log.write_text("")  # the client said nothing
        asked = iter(answers)
        proc = RemoteProcess(["sh", "-c", "exit 255"], lambda what, code, said: RemoteCommandError(what, code, said), "box",
                             stdin=False, stdout=False, client_log=str(log), link_up=lambda: next(asked))
        return proc.error("supervisor.py on box")

    assert isinstance(ended([True, False]), LinkLostError)  # still answering, then gone: the link
    assert isinstance(ended([False]), LinkLostError)
    assert isinstance(ended([True, True]), RemoteCommandError)  # it stands: the command's own 255

"""harness.helpers: one way to call a host helper (on this machine's LocalTransport; the SSH path is
the same local_argv, exercised by test_home_workdir.py, test_jobs.py and the others)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from harness import helpers, host_helpers
from harness.config import HostConfig
from harness.runtime.host import HostRuntime
from harness.transport.local import LocalTransport

# A helper of the test's own: it echoes what it got (request, argv, cwd, one env value), then
# exits with the code the request asks for, or sleeps.
ECHO = """
import json, os, sys, time
request = json.loads(sys.stdin.read())
if request.get("sleep"):
    time.sleep(request["sleep"])
json.dump({"request": request, "argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "env": os.environ.get("HARNESS_TEST_VALUE")}, sys.stdout)
sys.exit(request.get("code", 0))
"""


@pytest.fixture
def echo_helper(monkeypatch):
    real = host_helpers.source
    monkeypatch.setattr(host_helpers, "source", lambda name: ECHO if name == "echo.py" else real(name))


class Recording(LocalTransport):
    def __init__(self):
        super().__init__("local")
        self.argvs: list[list[str]] = []

    def local_argv(self, argv):
        self.argvs.append(list(argv))
        return super().local_argv(argv)


def test_request_on_stdin_reply_on_stdout_exit_code_and_nothing_on_the_command_line(echo_helper):
    transport = Recording()
    secret = "value-" + "x" * 8
    result = helpers.call(transport, "echo.py", {"code": 3, "secret": secret}, python=sys.executable)
    assert result.exit_code == 3
    reply = result.json()
    assert reply["request"] == {"code": 3, "secret": secret} and reply["argv"] == ["echo.py"] and reply["name"] == "__main__"
    assert len(transport.argvs) == 1 and not any(secret in a or "import json" in a for a in transport.argvs[0])
    with pytest.raises(Exception, match="echo"):
        result.checked("echo")


def test_in_a_runtime_the_helper_runs_in_the_workdir_with_env_values_off_the_command_line(echo_helper, tmp_path):
    transport = Recording()
    runtime = HostRuntime(HostConfig(name="local", local=True, python=sys.executable, workdir=str(tmp_path / "work")))
    result = helpers.call(transport, "echo.py", {}, where=runtime, env={"HARNESS_TEST_VALUE": "s3cr3t"})
    assert result.exit_code == 0, result.error
    assert result.json()["cwd"] == str(tmp_path / "work") and result.json()["env"] == "s3cr3t"
    assert not any("s3cr3t" in a for a in transport.argvs[0])


def test_a_streamed_reply_and_a_timeout(echo_helper):
    chunks: list[bytes] = []
    result = helpers.call(LocalTransport(), "echo.py", {}, python=sys.executable, stdout=chunks.append)
    assert result.stdout == b"" and json.loads(b"".join(chunks))["request"] == {}
    started = time.monotonic()
    slow = helpers.call(LocalTransport(), "echo.py", {"sleep": 30}, python=sys.executable, timeout=1)
    assert slow.exit_code == 124 and "timed out" in slow.error and time.monotonic() - started < 20


def test_prefetched_answers_commands_asked_ahead_in_one_call():
    """helpers.Prefetched (a run's start: docker's image check and the GPU probe): one helper call
    runs the commands in order with the home token put in, stops after the first that fails, and
    answers transport.run with their exact bytes; an argv not asked ahead goes to the transport."""
    import os

    class Counting(Recording):
        runs: list[list[str]] = []

        def run(self, argv, **kwargs):
            self.runs.append(list(argv))
            return super().run(argv, **kwargs)

    transport = Counting()
    argvs = [["sh", "-c", "printf 'a\\377'; echo err >&2"], ["sh", "-c", "echo @home@/x"], ["sh", "-c", "exit 3"], ["echo", "after"]]
    prefetched = helpers.Prefetched(transport, argvs, python=sys.executable, home_token="@home@")
    assert len(transport.argvs) == 1 and transport.runs == []  # one helper call, no transport.run
    first = prefetched.run(argvs[0])
    assert (first.exit_code, first.stdout, first.stderr) == (0, b"a\xff", b"err\n")
    assert prefetched.run(argvs[1]).text == os.path.expanduser("~") + "/x\n"
    assert prefetched.run(argvs[2]).exit_code == 3
    assert transport.runs == []
    assert prefetched.run(argvs[3]).text == "after\n" and transport.runs == [argvs[3]]  # not run after the failure: asked now


# A streaming helper of the test's own: the request line, then the caller's stream on the same stdin.
ECHO_STREAM = """
import json, sys
request = json.loads(sys.stdin.buffer.readline())
rest = sys.stdin.buffer.read()
json.dump({"request": request, "rest": rest.decode(), "argv": sys.argv, "no_site": sys.flags.no_site}, sys.stdout)
"""


def test_a_streaming_helper_reads_the_request_line_then_the_callers_stream(monkeypatch):
    """helpers.start (sync, pull): the same command line and payload as helpers.call, stdin left
    open for the caller's stream after the request line; `before` runs first and execs the helper."""
    real = host_helpers.source
    monkeypatch.setattr(host_helpers, "source", lambda name: ECHO_STREAM if name == "echo_stream.py" else real(name))
    transport = Recording()
    first = 'printf "%s\\0" "$1"; shift; exec "$@"'  # as sync's `cat` of the manifest
    proc = helpers.start(transport, "echo_stream.py", {"mode": "a\nb"}, python=sys.executable, before=["sh", "-c", first, "sh", "said first"])
    proc.stdin.write(b"stream {not json}\n\x00tail")
    code, out = proc.communicate()
    assert code == 0, proc.stderr_text()
    said, _, reply = out.partition(b"\0")
    assert said == b"said first"
    reply = json.loads(reply)
    assert reply["request"] == {"mode": "a\nb"} and reply["rest"] == "stream {not json}\n\x00tail"
    assert reply["argv"] == ["echo_stream.py"] and reply["no_site"] == 1  # started with -S on the host's python
    assert transport.argvs[0][:5] == ["sh", "-c", first, "sh", "said first"] and not any("json.dump" in a for a in transport.argvs[0])


def _module_text(path) -> str:
    return path.read_text(encoding="utf-8")


def test_every_module_ships_and_starts_host_helpers_through_harness_helpers():
    """The one way stays the one way: only harness/helpers.py reads a helper's source or knows how
    the host's python starts one (host_helpers is imported nowhere else, but for its wire
    contract, host_helpers/wire.py, which is no helper), no other module builds a
    `python -S -c` command line or any `-c` line but a shell's (a Python program sent inline is a
    host helper's job), and every module that names a helper imports harness.helpers."""
    import ast
    from pathlib import Path

    package = Path(helpers.__file__).resolve().parent
    names = {p.name for p in host_helpers.DIR.glob("*.py") if p.name != "__init__.py"}
    assert {"supervisor.py", "sync_apply.py", "pull_helper.py"} <= names
    named: dict[str, set[str]] = {}
    offences: list[str] = []
    for path in sorted(package.rglob("*.py")):
        if host_helpers.DIR in path.parents or path == package / "helpers.py":
            continue
        rel = str(path.relative_to(package.parent))
        tree = ast.parse(_module_text(path), rel)
        imports_helpers = False
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "harness" and any(a.name == "host_helpers" for a in node.names):
                offences.append(f"{rel}:{node.lineno}: imports harness.host_helpers")
            if isinstance(node, ast.ImportFrom) and node.module == "harness.host_helpers" and any(a.name != "wire" for a in node.names):
                offences.append(f"{rel}:{node.lineno}: imports harness.host_helpers")
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                wire_only = isinstance(node, ast.ImportFrom) and node.module == "harness.host_helpers"  # judged above
                if not wire_only and any(m.startswith("harness.host_helpers") and m != "harness.host_helpers.wire" for m in modules):
                    offences.append(f"{rel}:{node.lineno}: imports harness.host_helpers")
                if any(m == "harness.helpers" for m in modules) or (isinstance(node, ast.ImportFrom) and node.module == "harness"
                                                                   and any(a.name == "helpers" for a in node.names)):
                    imports_helpers = True
            if isinstance(node, (ast.List, ast.Tuple)):
                items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
                if any(a == "-S" and b == "-c" for a, b in zip(items, items[1:])):
                    offences.append(f"{rel}:{node.lineno}: builds a `python -S -c` command line")
                elif any(b == "-c" and a not in ("sh", "bash") for a, b in zip([None, *items], items)):
                    offences.append(f"{rel}:{node.lineno}: an inline `-c` program other than a shell's: make it a host helper")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if "-S -c" in node.value:
                    offences.append(f"{rel}:{node.lineno}: a shell line with `python -S -c`")
                if node.value in names:
                    named.setdefault(rel, set()).add(node.value)
        if rel in named and not imports_helpers:
            offences.append(f"{rel}: names {sorted(named[rel])} but does not go through harness.helpers")
    assert offences == []
    companions = {c for shipped in host_helpers.COMPANIONS.values() for c in shipped}  # they travel inside the helper that imports them
    assert set().union(*named.values()) == names - {"commands.py", host_helpers.WIRE} - companions  # commands.py: named in helpers.py itself (Prefetched)

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

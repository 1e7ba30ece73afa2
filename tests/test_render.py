"""The status tables (harness/cli/render.py): text from the remote side shows as written.

Pure rendering of status objects built here; the commands that fill them from real hosts are
tested end to end in test_jobs.py and test_multinode.py."""

from __future__ import annotations

import pytest

from harness.cli.render import print_group_table, print_run_table
from harness.jobs import RunStatus, StageStatus
from harness.multinode import GroupStatus, NodeStatus

# Remote text that rich would read as markup: a style it does not know, a closing tag without
# an opening one, a package extra, a trailing backslash.
CAUSE = "[rank1]: RuntimeError: torch[cuda] missing [/red] C:\\"
ERROR = "ConnectError: [Errno 111] Connection refused [bold]"


@pytest.fixture(autouse=True)
def wide(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # no wrapping: each text stays on one line


def failed_run(run_id: str) -> RunStatus:
    finished = {"event": "finished", "status": "failed", "error": CAUSE}
    stages = [StageStatus("train[x]", "failed", started=100.0, finished=160.0, exit_code=1, last_event=finished),
              StageStatus("evaluate", "[weird]")]
    return RunStatus(run_id, "failed", stages, record={"host": "gpu[1]", "runtime": "host"})


def test_group_table_shows_remote_text_as_written(capsys):
    status = GroupStatus("cluster", "r1", [
        NodeStatus("n0", 0, status=failed_run("r1")),
        NodeStatus("n1", 1, error=ERROR),
    ], first_failure=f"n0: train failed: {CAUSE}")
    print_group_table(status)
    out = capsys.readouterr().out
    assert out.count(CAUSE) == 2  # the stage's last event and the caption
    assert ERROR in out and "train[x]" in out and "[weird]" in out
    assert "unreachable" in out


def test_host_table_shows_remote_text_as_written(capsys):
    print_run_table(failed_run("r2"))
    out = capsys.readouterr().out
    assert "run r2 on gpu[1]: failed" in out and "train[x]" in out and "[weird]" in out
    assert f"finished: failed ({CAUSE})" in out  # the failure's own line, as written

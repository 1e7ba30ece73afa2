"""The run queue, over the real sshd test bed: one run at a time per GPU set on a host, a later run
`queued` with its place and started by its own supervisor, cancel while queued, disjoint GPU sets
at once, `--now`, and a dead supervisor never blocking the queue. States are waited for with
generous deadlines (a loaded 2-core CI machine), never fixed sleeps. Every run makes its stage
anew (fresh): the queue is under test here, not the store (tests/test_artifacts.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config import load_config, parse_config
from harness.host import Host
from harness.jobs import Jobs, RunStatus, queue_gpus
from harness.transport import connect
from tests.fixtures.job_project import expected_log, log_lines
from tests.test_jobs import collect, ssh_project

pytestmark = pytest.mark.ssh

LONG = {"prepare": {"lines": 200, "sleep": 200}}  # cancelled by the tests once they are done with it
DEADLINE_S = 90


def wait_state(jobs: Jobs, run_id: str, wanted: str, timeout: float = DEADLINE_S) -> RunStatus:
    deadline = time.monotonic() + timeout
    while (status := jobs.status(run_id)).state != wanted:
        assert time.monotonic() < deadline, f"run {run_id} never {wanted!r}: {status.state}"
        time.sleep(0.3)
    return status


def wait_line(jobs: Jobs, run_id: str, text: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while text not in collect(jobs, run_id):
        assert time.monotonic() < deadline, f"no {text!r} in the log of {run_id}"
        time.sleep(0.3)


@pytest.fixture
def box(tmp_path, ssh_host):
    """(config path, Jobs over SSH for host `box`, env for CLI calls)."""

    def make(stages: dict, **host_table):
        config_path = ssh_project(tmp_path, ssh_host, stages, **host_table)
        config = load_config(config_path)
        host = config.host("box")
        transport = connect(host, ssh_host.connect_options())
        opened.append(transport)
        return config_path, Host(config, host, lambda _name: transport).jobs

    opened: list = []
    yield make
    for t in opened:
        t.close()


def harness(config, ssh_host, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=120, env={**ssh_host.env(), "COLUMNS": "200"})


def words(table: str) -> str:
    """A rich table's text with its wrapping undone (a title may wrap at the table's width)."""
    return " ".join(table.replace("│", " ").split())


def test_second_run_waits_with_place_then_starts_by_itself(box, ssh_host, tmp_path):
    release = tmp_path / "release"  # the first run ends once the test has seen the queue
    config, jobs = box({"prepare": {"lines": 3, "until_file": str(release)}})
    first = jobs.launch(["prepare"], fresh=["all"]).run_id
    wait_line(jobs, first, "line 3 of 3")
    r = harness(config, ssh_host, "run", "box", "prepare", "--fresh", "--detach")
    assert r.returncode == 0, r.stderr
    second = r.stdout.strip()
    assert f"run {second} queued on box (place 1 for all GPUs)" in r.stderr
    queued = jobs.status(second)
    assert (queued.state, queued.queue_place) == ("queued", 1)
    assert all(s.state == "pending" for s in queued.stages)
    status = harness(config, ssh_host, "status", "box", second)
    assert status.returncode == 0 and "queued (place 1 for all GPUs)" in words(status.stdout), status.stdout
    runs = harness(config, ssh_host, "runs", "box")
    assert "queued (place 1 for all GPUs)" in words(runs.stdout) and first in runs.stdout, runs.stdout
    as_json = json.loads(harness(config, ssh_host, "status", "box", second, "--json").stdout)
    assert (as_json["state"], as_json["queue_place"], as_json["exit_code"]) == ("queued", 1, None)
    # a third run queues behind the second
    third = jobs.launch(["prepare"], fresh=["all"]).run_id
    assert jobs.status(third).queue_place == 2
    assert jobs.status(first).state == "running"  # (the queue was seen while the first held the GPUs)
    release.touch()
    done = jobs.wait(first, timeout=DEADLINE_S)
    assert done.state == "ok"
    for run_id in (second, third):  # no laptop involved: each supervisor starts its own run
        st = jobs.wait(run_id, timeout=DEADLINE_S)
        assert st.state == "ok", st
        assert log_lines(collect(jobs, run_id)) == expected_log("prepare_data", 3)
    s1, s2, s3 = (jobs.status(r) for r in (first, second, third))
    assert s2.started >= s1.finished and s3.started >= s2.finished  # one after another


def test_cancel_while_queued(box, ssh_host):
    config, jobs = box(LONG)
    first = jobs.launch(["prepare"], fresh=["all"], grace_s=1).run_id
    second = jobs.launch(["prepare", "train"], fresh=["all"]).run_id
    third = jobs.launch(["prepare"], fresh=["all"], grace_s=1).run_id
    assert jobs.status(third).queue_place == 2
    r = harness(config, ssh_host, "cancel", "box", second)
    assert r.returncode == 0 and f"run {second}: cancelled" in r.stdout, r.stderr
    st = jobs.status(second)
    assert st.state == "cancelled" and [(s.stage, s.state) for s in st.stages] == [("prepare", "cancelled"), ("train", "cancelled")]
    assert st.stages[0].started is None  # it never ran
    assert jobs.status(third).queue_place == 1  # moved up
    assert jobs.cancel_run(first).states[jobs.name] == "cancelled"
    wait_line(jobs, third, "line 1 of 200")  # the GPUs are free: the third starts
    assert jobs.cancel_run(third).states[jobs.name] == "cancelled"


def test_disjoint_gpu_sets_run_at_once_overlapping_wait(box):
    _, jobs = box(LONG, gpus=[0])
    on = {gpus: Host(jobs.config, dataclasses.replace(jobs.host, gpus=list(gpus)), lambda _name: jobs.transport).jobs for gpus in ((0,), (1,), (1, 2))}
    assert queue_gpus(on[(1, 2)].host) == [1, 2]
    zero = on[(0,)].launch(["prepare"], fresh=["all"], grace_s=1).run_id
    one = on[(1,)].launch(["prepare"], fresh=["all"], grace_s=1).run_id
    assert jobs.status(one).state == "running"  # GPU 1 is free while GPU 0 is busy
    wait_line(jobs, zero, "line 1 of 200")
    wait_line(jobs, one, "line 1 of 200")
    both = on[(1, 2)].launch(["prepare"], fresh=["all"], grace_s=1).run_id
    st = jobs.status(both)
    assert (st.state, st.queue_place) == ("queued", 1) and "GPUs 1,2" in st.queue_note  # overlaps GPU 1
    assert jobs.cancel_run(one).states[jobs.name] == "cancelled"
    wait_line(jobs, both, "line 1 of 200")
    assert jobs.status(zero).state == "running"  # untouched throughout
    for run_id in (zero, both):
        assert jobs.cancel_run(run_id).states[jobs.name] == "cancelled"


def test_now_bypasses_the_queue(box, ssh_host):
    config, jobs = box(LONG)
    first = jobs.launch(["prepare"], fresh=["all"], grace_s=1).run_id
    r = harness(config, ssh_host, "run", "box", "prepare", "--fresh", "--detach", "--now", "--grace", "1")
    assert r.returncode == 0, r.stderr
    now = r.stdout.strip()
    assert f"run {now} started on box" in r.stderr
    wait_line(jobs, now, "line 1 of 200")
    assert jobs.status(first).state == "running"
    # a run without --now still waits (for both)
    queued = jobs.launch(["prepare"], fresh=["all"]).run_id
    assert jobs.status(queued).state == "queued"
    for run_id in (queued, first, now):
        assert jobs.cancel_run(run_id).states[jobs.name] == "cancelled"


def test_killed_supervisors_do_not_block_the_queue(box, tmp_path):
    """kill -9 of a running run's supervisor and of a queued run's: the run behind them starts."""
    _, jobs = box(LONG)
    running = jobs.launch(["prepare"], fresh=["all"], grace_s=1).run_id
    queued = jobs.launch(["prepare"], fresh=["all"], grace_s=1).run_id
    behind = jobs.launch(["prepare"], fresh=["all"], grace_s=1).run_id
    wait_line(jobs, running, "line 1 of 200")
    assert jobs.status(behind).queue_place == 2
    runs = tmp_path / "work" / "runs"
    for run_id in (queued, running):
        os.kill(json.loads((runs / run_id / "state.json").read_text())["pid"], signal.SIGKILL)
    wait_state(jobs, queued, "lost")
    wait_state(jobs, running, "lost")
    wait_line(jobs, behind, "line 1 of 200")  # its own supervisor noticed: no laptop call needed
    assert jobs.status(behind).state == "running"
    for run_id in (behind, running, queued):  # cancel also stops the lost run's orphaned stage
        assert jobs.cancel_run(run_id).states[jobs.name] == "cancelled"
    assert not [n for n in os.listdir(tmp_path / "work" / ".harness" / "queue") if n.endswith(".json")]


@pytest.mark.parametrize("runtime, gpus, expected", [
    ("host", [3, 1], [1, 3]), ("host", None, "all"),
    ("docker", [2, 0], [0, 2]), ("docker", "all", "all"), ("docker", 2, "all"), ("docker", "none", "all"),
])
def test_queue_gpus_pins_only_explicit_lists(tmp_path, runtime, gpus, expected):
    """A count lets docker pick the devices and "none" still shares the box: both are the whole host."""
    host: dict = {"local": True, "workdir": str(tmp_path), "runtime": runtime}
    if runtime == "host" and gpus is not None:
        host["gpus"] = gpus
    if runtime == "docker":
        host["container"] = {"gpus": gpus}
    config = parse_config({"hosts": {"box": host}}, Path(tmp_path / "harness.toml"))
    assert queue_gpus(config.host("box")) == expected

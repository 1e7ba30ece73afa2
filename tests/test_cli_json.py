"""`--json` on status, runs, hosts, doctor and pull, against the real sshd test bed: stdout is one
JSON document (json.loads of all of it), its keys are docs/json.md's and its
values are the real run's, read back from the run's own files on the host; errors stay one
`harness: error:` line with a non-zero exit and nothing on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.pipeline import STAGES
from tests.fixtures.job_project import FAKE_STAGE, toml_value, write_project

pytestmark = pytest.mark.ssh

STATUS_KEYS = {"run_id", "host", "state", "started", "finished", "exit_code", "stages", "stages_done", "at_stage", "queue_place", "record"}
STAGE_KEYS = {"stage", "state", "started", "finished", "exit_code", "last_event", "tau", "artifact", "reused_from"}
RUN_KEYS = {"run_id", "state", "started", "finished", "stages", "stages_done", "at_stage", "queue_place"}
PULL_KEYS = {"host", "remote", "local", "run_id", "dry_run", "ok", "fetched", "identical", "links", "planned", "missing", "notes", "refused", "failed",
             "bytes_received", "bytes_resumed", "streams", "seconds"}


def harness(config: Path, ssh_host, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True,
                          env=ssh_host.env(), timeout=120, cwd=cwd)


def as_json(r: subprocess.CompletedProcess) -> dict:
    assert not r.stdout.startswith("harness:"), r.stdout
    return json.loads(r.stdout)  # the whole of stdout: nothing else is printed there


def wait_final(config: Path, ssh_host, where: str, run_id: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        status = as_json(harness(config, ssh_host, "status", where, run_id, "--json"))
        if status["state"] not in ("running", "starting"):
            return status
        assert time.monotonic() < deadline, status
        time.sleep(0.5)


def test_status_runs_pull_and_hosts_as_json(tmp_path, ssh_host):
    work = tmp_path / "work"
    config = write_project(tmp_path / "project", work, {"prepare": {"lines": 2}, "train": {"lines": 3, "tau_at": 2, "exit_code": 3}},
                           host_table={"local": False, "ssh": ssh_host.alias, "connect_timeout": 5, "env": ["HARNESS_TEST_TOKEN"]})
    started = harness(config, ssh_host, "run", "box", "prepare", "train", "--detach")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    run_dir = work / "runs" / run_id

    status = wait_final(config, ssh_host, "box", run_id)
    again = harness(config, ssh_host, "status", "box", run_id, "--json")
    assert again.returncode == 1  # a failed run (harness.errors.EXIT_FAILED), as without --json
    assert set(status) == STATUS_KEYS and all(set(s) == STAGE_KEYS for s in status["stages"])
    assert (status["run_id"], status["host"], status["state"], status["exit_code"]) == (run_id, "box", "failed", 1)
    assert status["record"] == json.loads((run_dir / "run.json").read_text())
    for stage, name in zip(status["stages"], ("prepare", "train")):
        on_disk = json.loads((run_dir / name / "state.json").read_text())
        assert stage["stage"] == name and (stage["state"], stage["exit_code"], stage["started"], stage["finished"]) == \
            (on_disk["state"], on_disk["exit_code"], on_disk["started"], on_disk["finished"])
        events = [json.loads(line) for line in (run_dir / name / "events.jsonl").read_text().splitlines()]
        assert stage["last_event"] == events[-1]
    assert [s["state"] for s in status["stages"]] == ["ok", "failed"]
    assert status["stages"][1]["tau"] == {"step": 2, "tau": 2.5}
    assert (status["stages_done"], status["at_stage"]) == (1, "train")

    other = harness(config, ssh_host, "run", "box", "prepare", "--detach").stdout.strip()
    wait_final(config, ssh_host, "box", other)
    runs = harness(config, ssh_host, "runs", "box", "--json")
    assert runs.returncode == 0, runs.stderr
    listing = as_json(runs)
    assert listing["host"] == "box" and all(set(r) == RUN_KEYS for r in listing["runs"])
    assert [r["run_id"] for r in listing["runs"]] == sorted(p.name for p in (work / "runs").iterdir()) == [run_id, other]
    first = listing["runs"][0]
    assert (first["state"], first["stages"], first["stages_done"], first["at_stage"]) == ("failed", ["prepare", "train"], 1, "train")
    assert listing["runs"][1]["state"] == "ok" and listing["runs"][1]["at_stage"] is None

    out = tmp_path / "pulled"
    pull = harness(config, ssh_host, "pull", "box", run_id, str(out), "--json", cwd=tmp_path)
    assert pull.returncode == 0, pull.stderr
    report = as_json(pull)
    assert set(report) == PULL_KEYS
    assert (report["host"], report["remote"], report["local"], report["run_id"], report["ok"], report["dry_run"]) == \
        ("box", str(run_dir), str(out), run_id, True, False)
    on_disk = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert sorted(report["fetched"]) == on_disk and "train/events.jsonl" in on_disk
    assert report["bytes_received"] == sum((out / name).stat().st_size for name in on_disk)
    assert "outputs/eval" in report["missing"]  # the fake stages made no report
    again = as_json(harness(config, ssh_host, "pull", "box", run_id, str(out), "--json", cwd=tmp_path))
    assert again["fetched"] == [] and sorted(again["identical"]) == on_disk and again["bytes_received"] == 0
    dry = as_json(harness(config, ssh_host, "pull", "box", "last", "--dry-run", "--json", cwd=tmp_path))
    assert dry["dry_run"] is True and dry["run_id"] == other and dry["local"] == f"project/runs/{other}" and dry["planned"]  # beside harness.toml
    assert not (tmp_path / "runs").exists() and not (tmp_path / "project" / "runs").exists()

    hosts = harness(config, ssh_host, "hosts", "--json")
    assert hosts.returncode == 0, hosts.stderr
    configured = as_json(hosts)
    box = configured["hosts"]["box"]
    assert (box["ssh"], box["workdir"], box["runtime"], box["env"]) == (ssh_host.alias, str(work), "host", ["HARNESS_TEST_TOKEN"])
    assert configured["config"] == str(config) and configured["groups"] == {}


def test_json_errors_stay_one_line_with_nothing_on_stdout(tmp_path, ssh_host):
    config = write_project(tmp_path / "project", tmp_path / "work", {}, host_table={"local": False, "ssh": ssh_host.alias, "connect_timeout": 5})
    for args in (("status", "box", "20200101-000000-abcdef", "--json"), ("pull", "box", "last", "--json"), ("runs", "nohost", "--json")):
        r = harness(config, ssh_host, *args, cwd=tmp_path)
        assert r.returncode != 0 and r.stdout == "", (args, r.stdout)
        assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("harness: error: "), (args, r.stderr)


def group_project(tmp_path: Path, ssh_host) -> Path:
    """Two hosts, both the test bed's sshd with their own workdir, as the group `pair`."""
    lines = []
    for name in ("a", "b"):
        scripts = tmp_path / "work" / name / "remote_scripts"
        scripts.mkdir(parents=True)
        for stage in STAGES.values():
            (scripts / stage.script).write_text(FAKE_STAGE)
        lines += [f"[hosts.{name}]", f"ssh = {toml_value(ssh_host.alias)}", f"workdir = {toml_value(str(tmp_path / 'work' / name))}", "connect_timeout = 5", ""]
    lines += ['[groups.pair]', 'hosts = ["a", "b"]', "rdzv_port = 0", "", "[pipeline.stages.prepare]", "lines = 40", "sleep = 40", ""]
    (tmp_path / "project").mkdir()
    config = tmp_path / "project" / "harness.toml"
    config.write_text("\n".join(lines))
    return config


def test_group_status_runs_and_cancel_as_json(tmp_path, ssh_host):
    """A group through the same run interface as a host: one run id on both hosts."""
    config = group_project(tmp_path, ssh_host)
    started = harness(config, ssh_host, "run", "pair", "prepare", "--detach", "--grace", "1")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    deadline = time.monotonic() + 60
    while (status := as_json(harness(config, ssh_host, "status", "pair", run_id, "--json")))["state"] != "running" or \
            any(n["run"]["stages"][0]["state"] != "running" for n in status["nodes"]):
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    assert (status["group"], status["run_id"], status["first_failure"], status["exit_code"]) == ("pair", run_id, None, None)
    assert [(n["host"], n["rank"], n["state"], n["failure"]) for n in status["nodes"]] == [("a", 0, "running", None), ("b", 1, "running", None)]
    for node in status["nodes"]:
        assert node["run"]["record"] == json.loads((tmp_path / "work" / node["host"] / "runs" / run_id / "run.json").read_text())

    dry = as_json(harness(config, ssh_host, "cancel", "pair", "--dry-run", "--json"))  # RUN left out: the newest; nothing stopped
    assert dry == {"group": "pair", "run_id": run_id, "dry_run": True, "states": {"a": "running", "b": "running"}, "ok": True, "ended_before": [],
                   "would_stop": ["a", "b"]}
    lines = [json.loads(line) for line in harness(config, ssh_host, "logs", "pair", "--json", "--tail", "2").stdout.splitlines()]
    assert {item["host"] for item in lines} == {"a", "b"} and all(item["stage"] == "prepare" for item in lines)
    for host in ("a", "b"):  # at most the last 2 lines of each node's (growing) log, whole lines as on disk
        log = (tmp_path / "work" / host / "runs" / run_id / "prepare" / "log").read_text()
        text = "".join(i["log"] for i in lines if i["host"] == host and "log" in i)
        assert 1 <= len(text.splitlines()) <= 2 and text.endswith("\n") and ("\n" + text) in ("\n" + log), (host, lines)

    cancel = harness(config, ssh_host, "cancel", "pair", "last")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.splitlines() == [f"run {run_id} on a: cancelled", f"run {run_id} on b: cancelled"]
    status = as_json(harness(config, ssh_host, "status", "pair", run_id, "--json"))
    assert status["state"] == "cancelled" and [n["state"] for n in status["nodes"]] == ["cancelled", "cancelled"]
    assert status["first_failure"].split(": ")[0] in ("a", "b") and "prepare cancelled" in status["first_failure"]
    for node in status["nodes"]:
        on_disk = json.loads((tmp_path / "work" / node["host"] / "runs" / run_id / "prepare" / "state.json").read_text())
        assert node["run"]["stages"][0]["state"] == on_disk["state"] == "cancelled"

    listing = as_json(harness(config, ssh_host, "runs", "pair", "--json"))
    assert (listing["group"], listing["hosts"], listing["unreachable"]) == ("pair", ["a", "b"], {})
    assert [r["run_id"] for r in listing["runs"]] == [run_id]
    assert {h: s["state"] for h, s in listing["runs"][0]["nodes"].items()} == {"a": "cancelled", "b": "cancelled"}

"""A hostile box: what a compromised box (or another account writing its runs/) sends back is
input. Each command is driven against crafted records, states, events, sweeps and helper answers
on a real box (this machine's workdir, runtime = "host"): a value that is not of its kind is
refused in one line, or left out where it is only shown, and nothing lands outside the directory
the user named (harness/box_values.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GOOD = "20260101-000000-aaaaaa"
EVIL = "20260101-000000-bbbbbb"


def harness(config: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def one_error(r: subprocess.CompletedProcess) -> str:
    """The command failed with exactly one `harness: error:` line and no traceback."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode != 0 and len(lines) == 1 and lines[0].startswith("harness: error: "), r.stderr
    return lines[0]


def crafted_run(workdir: Path, run_id: str, record: dict, stages: dict[str, dict] | None = None, state: dict | None = None) -> Path:
    run_dir = workdir / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(record))
    (run_dir / "state.json").write_text(json.dumps(state or {"state": "ok", "started": 1.0, "finished": 2.0}))
    for stage, files in (stages or {}).items():
        (run_dir / stage).mkdir()
        for name, text in files.items():
            (run_dir / stage / name).write_text(text)
    return run_dir


@pytest.fixture
def box(tmp_path):
    """A project whose host is this machine, and the laptop's directory the user works in."""
    workdir, laptop = tmp_path / "box", tmp_path / "laptop" / "project"
    workdir.mkdir()
    laptop.mkdir(parents=True)
    config = laptop / "harness.toml"
    config.write_text(f'[hosts.box]\nlocal = true\nworkdir = "{workdir}"\npython = "{sys.executable}"\n')
    return config, workdir, laptop


def laptop_files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def test_a_run_id_from_the_box_never_names_a_laptop_path(box, tmp_path):
    """`harness pull HOST last` lands in runs/<the run id the box names>: a record whose run_id
    climbs out ("../../victim") is refused, and nothing is written anywhere."""
    config, workdir, laptop = box
    victim = tmp_path / "laptop" / "victim"  # the laptop's: runs/../../victim from the project
    victim.mkdir()
    (victim / ".profile").write_text("mine\n")
    crafted_run(workdir, EVIL, {"run_id": "../../victim", "workdir": str(workdir), "stages": []})
    payload = tmp_path / "victim"  # the box's: <workdir>/runs/../../victim, a run as far as pull can tell
    payload.mkdir()
    (payload / "run.json").write_text(json.dumps({"run_id": "../../victim", "stages": []}))
    (payload / ".profile").write_text("payload\n")
    before = laptop_files(tmp_path / "laptop")
    line = one_error(harness(config, "pull", "box", "last", cwd=laptop))
    assert "the box sent '../../victim' as a run id; refused" in line, line
    assert (victim / ".profile").read_text() == "mine\n" and laptop_files(tmp_path / "laptop") == before


def test_status_and_runs_take_no_value_of_the_wrong_kind(box):
    config, workdir, laptop = box
    crafted_run(workdir, GOOD, {"run_id": GOOD, "workdir": str(workdir), "stages": ["train"]},
                stages={"train": {"state.json": json.dumps({"state": "ok", "started": "yesterday", "exit_code": "0", "artifact": "../../../etc",
                                                            "reused_from": "../x"}),
                                  "events.jsonl": "not json\n" + json.dumps({"event": "finished", "status": "ok", "summary": [1]}) + "\n{\n"}})
    crafted_run(workdir, EVIL, {"run_id": EVIL, "workdir": str(workdir), "stages": ["train/../../x"]})
    status = harness(config, "status", "box", GOOD, "--json", cwd=laptop)
    assert status.returncode == 0, status.stderr
    train = json.loads(status.stdout)["stages"][0]
    assert (train["started"], train["exit_code"], train["artifact"], train["reused_from"]) == (None, None, None, None)
    shown = harness(config, "status", "box", GOOD, cwd=laptop)
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    line = one_error(harness(config, "status", "box", EVIL, cwd=laptop))
    assert "the box sent 'train/../../x' as a stage name; refused" in line
    listed = harness(config, "runs", "box", "--json", cwd=laptop)
    assert listed.returncode == 0 and [r["run_id"] for r in json.loads(listed.stdout)["runs"]] == [GOOD], listed.stdout  # EVIL left out


def test_artifacts_a_record_names_are_found_in_the_store_only(box):
    """run.json's artifacts: a key that is no key, a store elsewhere, a path of its own: pull,
    serve and tensorboard act on none of them."""
    config, workdir, laptop = box
    record = {"run_id": GOOD, "workdir": str(workdir), "stages": ["export"], "store": "outputs/artifacts", "recipes": {"export": {}},
              "artifacts": {"export": {"key": "../../../../etc", "path": "/etc"}, "train": {"key": "a" * 19 + "/", "path": "/etc"}}}
    crafted_run(workdir, GOOD, record)
    pulled = harness(config, "pull", "box", GOOD, cwd=laptop)
    assert pulled.returncode == 0, pulled.stderr
    assert {p.split("/")[0] for p in laptop_files(laptop / "runs" / GOOD)} <= {"run.json", "state.json"}  # the run directory only
    assert "absent  outputs/export: the run has not made it" in pulled.stderr
    line = one_error(harness(config, "tensorboard", "box", GOOD, cwd=laptop))
    assert f"run {GOOD} trained no draft and read none" in line


def test_a_sweep_record_that_names_other_runs_is_refused(box):
    config, workdir, laptop = box
    sweeps = workdir / "outputs" / "sweeps" / "sweep-0123456789"
    sweeps.mkdir(parents=True)
    (sweeps.parent / "latest").write_text("sweep-0123456789")
    (sweeps / "sweep.json").write_text(json.dumps({"sweep_id": "sweep-0123456789", "host": "box", "axes": {}, "split": "selection", "created": 1.0,
                                                   "trials": [{"name": "../t0", "flags": {}, "gpu": None, "runs": ["../../x"], "slot": None}]}))
    line = one_error(harness(config, "sweep", "box", "--status", cwd=laptop))
    assert "as a name; refused" in line or "as a run id; refused" in line, line


def test_sources_mirror_only_the_packages_asked_for(box, tmp_path):
    """The box answers `harness sources box json` with a package named to climb out of the mirror:
    refused before anything is pulled or pruned there."""
    config, workdir, laptop = box
    liar = tmp_path / "python-that-lies"
    answer = json.dumps({"ok": True, "packages": [{"name": "../../../victim", "kind": "package", "roots": [str(workdir)], "version": "1",
                                                  "files": 1, "bytes": 1}]})
    liar.write_text(f'#!/bin/sh\ncase "$*" in *locate_sources.py*) echo \'@@harness-sources@@ {answer}\'; exit 0;; esac\nexec {sys.executable} "$@"\n')
    liar.chmod(0o755)
    config.write_text(config.read_text().replace(f'python = "{sys.executable}"', f'python = "{liar}"'))
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.py").write_text("mine\n")
    line = one_error(harness(config, "sources", "box", "json", "--dest", str(laptop / "mirror"), cwd=laptop))
    assert "the box answered for package '../../../victim'" in line, line
    assert (victim / "keep.py").read_text() == "mine\n" and not (laptop / "mirror").exists()
    assert os.listdir(victim) == ["keep.py"]

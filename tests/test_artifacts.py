"""Every run its own: each stage's output is an artifact kept under a key of what made it, reused
only when all of that is the same (harness/artifacts.py on the laptop, the host's
harness/host_helpers/artifact_store.py and the supervisor).

The runs here are real detached runs of the fast fake stages (tests/fixtures/job_project.py: each
writes made.json into the --output harness gives it) on runtime = "host"; the keys' parts are
checked on real files (a chat file, a verifier directory with safetensors shards, the code).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config import load_config
from harness.errors import ConfigError, UsageError
from harness.host import Host
from harness.host_helpers import artifact_store
from harness.transport import connect
from tests.fixtures.job_project import write_project

REPO = Path(__file__).resolve().parents[1]


def make_host(tmp_path: Path, stages: dict) -> tuple[Host, Path, Path]:
    workdir = tmp_path / "work"
    config_path = write_project(tmp_path / "project", workdir, stages, host_table={"python": sys.executable}, inputs_by_path=False)
    config = load_config(config_path)
    transport = connect(config.host("box"))
    return Host(config, config.host("box"), lambda _name: transport), workdir, config_path


def run(host: Host, stages: list[str], timeout: float = 60, **kw):
    status = host.jobs.wait(host.jobs.launch(stages, **kw).run_id, timeout=timeout)
    assert status.state in ("ok", "failed"), status
    return status


def harness_cli(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=120)


def states(status) -> list[tuple[str, str]]:
    return [(s.stage, s.shown_state) for s in status.stages]


def test_an_unchanged_stage_is_reused_and_says_so_a_changed_flag_makes_a_new_artifact(tmp_path):
    host, workdir, config = make_host(tmp_path, {"train": {"lines": 2}})
    first = run(host, ["prepare", "extract", "train"])
    assert states(first) == [("prepare", "ok"), ("extract", "ok"), ("train", "ok")]
    assert all(s.artifact and s.reused_from is None for s in first.stages)

    r = harness_cli(config, "run", "box", "prepare", "extract", "train", "--set", "train.lines=4")
    assert r.returncode == 0, r.stderr
    second_id = r.stdout.splitlines()[0]  # stdout: the run id, then the attached logs
    second = host.jobs.status(second_id)
    assert states(second) == [("prepare", "reused"), ("extract", "reused"), ("train", "ok")]
    assert f"extract: reused from run {first.run_id} (same inputs; --fresh extract to redo it)" in r.stdout
    by_stage = {s.stage: s for s in second.stages}
    assert by_stage["extract"].artifact == first.stages[1].artifact and by_stage["extract"].reused_from == first.run_id
    assert by_stage["train"].artifact != first.stages[2].artifact  # train.lines is part of train's key
    store = workdir / "outputs" / "artifacts"
    made = [json.loads((store / "train" / s.artifact / "made.json").read_text()) for s in (first.stages[2], by_stage["train"])]
    assert [m["lines"] for m in made] == [2, 4]  # each run's draft is its own, neither overwrote the other
    record = json.loads((workdir / "runs" / second_id / "run.json").read_text())
    assert record["set"] == {"train.lines": 4} and record["artifacts"]["train"]["parts"]["flags"]["lines"] == 4

    status_json = json.loads(harness_cli(config, "status", "box", second_id, "--json").stdout)
    extract = next(s for s in status_json["stages"] if s["stage"] == "extract")
    assert (extract["state"], extract["reused_from"], extract["artifact"]) == ("ok", first.run_id, first.stages[1].artifact)


def test_fresh_makes_the_stage_anew_and_keeps_the_old_artifact(tmp_path):
    host, workdir, _ = make_host(tmp_path, {})
    first = run(host, ["prepare", "extract"])
    again = run(host, ["prepare", "extract"], fresh=["extract"])
    assert states(again) == [("prepare", "reused"), ("extract", "ok")]
    assert again.stages[1].artifact != first.stages[1].artifact
    for s in (first.stages[1], again.stages[1]):
        assert (workdir / "outputs" / "artifacts" / "extract" / s.artifact / "made.json").is_file()
    everything = run(host, ["prepare", "extract"], fresh=["all"])
    assert states(everything) == [("prepare", "ok"), ("extract", "ok")]
    with pytest.raises(UsageError, match=r"--fresh train: train is not a stage of this run \(prepare\)"):
        host.jobs.launch(["prepare"], fresh=["train"])


def test_a_stage_whose_input_no_run_made_fails_with_the_line_that_says_how_to_make_it(tmp_path):
    host, workdir, _ = make_host(tmp_path, {})
    status = run(host, ["train"])
    assert status.state == "failed" and status.stages[0].exit_code is None
    error = json.loads((workdir / "runs" / status.run_id / "train" / "state.json").read_text())["error"]
    assert error.startswith("train reads prepare's output made from these inputs (artifact ") or error.startswith("train reads extract's")
    assert "which no run has made: run `harness run box " in error
    made = run(host, ["prepare", "extract"])
    after = run(host, ["train"])  # both now in the store: read, not made again
    assert states(after) == [("train", "ok")]
    record = json.loads((workdir / "runs" / after.run_id / "run.json").read_text())
    assert {s: record["artifacts"][s]["role"] for s in record["artifacts"]} == {"prepare": "read", "extract": "read", "train": "made"}
    assert record["artifacts"]["extract"]["made_by"] == made.run_id


def test_two_runs_that_would_make_the_same_artifact_make_it_once(tmp_path):
    """The second waits on the artifact's lock, then reuses what the first made."""
    gate = tmp_path / "may-end"
    host, workdir, _ = make_host(tmp_path, {"extract": {"until_file": str(gate)}})
    first = host.jobs.launch(["prepare", "extract"]).run_id
    deadline = time.monotonic() + 30
    while host.jobs.status(first).stages[1].state != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    second = host.jobs.launch(["prepare", "extract"], now=True).run_id  # --now: no queue between them
    log = workdir / "runs" / second / "extract" / "log"
    while f"waiting for {first}" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.1)
    gate.touch()
    a, b = host.jobs.wait(first, 30), host.jobs.wait(second, 30)
    assert states(a) == [("prepare", "ok"), ("extract", "ok")]
    assert states(b) == [("prepare", "reused"), ("extract", "reused")] and b.stages[1].reused_from == first
    runs_made = list((workdir / "outputs" / "artifacts" / "extract").glob("*/made.json"))
    assert len(runs_made) == 1


def test_a_lost_runs_orphan_keeps_its_artifact_from_a_second_writer(tmp_path):
    """kill -9 of the supervisor leaves its stage running (the orphan): it still holds the
    artifact's lock, so a new run with the same key waits until the orphan is gone, then makes
    the artifact itself (the orphan's run never recorded it complete)."""
    gate = tmp_path / "may-end"
    host, workdir, _ = make_host(tmp_path, {"extract": {"until_file": str(gate)}})
    run(host, ["prepare"])
    first = host.jobs.launch(["extract"]).run_id
    state = workdir / "runs" / first / "extract" / "state.json"
    deadline = time.monotonic() + 30
    while "pid" not in (json.loads(state.read_text()) if state.exists() else {}):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    supervisor = json.loads((workdir / "runs" / first / "state.json").read_text())["pid"]
    orphan = json.loads(state.read_text())["pid"]
    os.kill(supervisor, signal.SIGKILL)
    while host.jobs.status(first).state != "lost":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    second = host.jobs.launch(["extract"], now=True).run_id
    log = workdir / "runs" / second / "extract" / "log"
    while f"waiting for {first}" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
        time.sleep(0.1)
    assert host.jobs.status(second).stages[0].state == "running"
    gate.touch()  # the orphan ends; the second run may take the lock now
    status = host.jobs.wait(second, 30)
    assert states(status) == [("extract", "ok")]
    try:  # the orphan has ended (a zombie where nothing reaps the supervisor's children)
        assert Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        pass


def test_runs_made_before_the_store_are_never_reused(tmp_path):
    """A record without recipes (an older harness) runs its stages as before, at the paths its
    command lines name; the store never takes them for an artifact."""
    host, workdir, _ = make_host(tmp_path, {})
    (workdir / "outputs" / "prepared").mkdir(parents=True)
    status = run(host, ["prepare"])
    assert states(status) == [("prepare", "ok")] and status.stages[0].reused_from is None


# -- the key's parts on real files -----------------------------------------------------------------


def safetensors(path: Path, names: dict[str, list[int]], payload: bytes = b"") -> None:
    header = json.dumps({n: {"dtype": "F32", "shape": shape, "data_offsets": [0, 0]} for n, shape in names.items()}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + payload)


@pytest.fixture
def box(tmp_path, monkeypatch):
    """A workdir with code (a script importing a common module, another common module it does
    not import), chat data and a verifier directory whose shard is larger than SMALL_FILE."""
    monkeypatch.setattr(artifact_store, "SMALL_FILE", 64)
    work = tmp_path / "work"
    (work / "remote_scripts" / "common").mkdir(parents=True)
    (work / "remote_scripts" / "common" / "__init__.py").write_text("")
    (work / "remote_scripts" / "common" / "events.py").write_text("X = 1\n")
    (work / "remote_scripts" / "common" / "unused.py").write_text("Y = 1\n")
    (work / "remote_scripts" / "prepare_data.py").write_text("def main():\n    from common.events import X\n")
    (work / "remote_scripts" / "train_draft.py").write_text("import json\n")
    (work / "data.jsonl").write_text('{"a": 1}\n')
    verifier = work / "verifier"
    verifier.mkdir()
    (verifier / "config.json").write_text('{"hidden_size": 8}')
    safetensors(verifier / "model.safetensors", {"w": [8, 8]}, b"\0" * 512)
    return work


def record(**recipe_changes) -> dict:
    prepare = {"script": "remote_scripts/prepare_data.py", "flags": {"max_seq_len": 256}, "reads": {}, "paths": {"data": "data.jsonl", "verifier": "verifier"}}
    train = {"script": "remote_scripts/train_draft.py", "flags": {"lr": 0.001}, "reads": {"prepared": "prepare"}, "paths": {"verifier": "verifier"}}
    for name, change in recipe_changes.items():
        (prepare if name.startswith("prepare_") else train).update({name.split("_", 1)[1]: change})
    return {"run_id": "20261205-000000-aaaaaa", "runtime": "host", "versions": {"torch": "2.13.0"}, "image": {"id": None},
            "store": "outputs/artifacts", "recipes": {"prepare": prepare, "train": train}}


def keys_of(work: Path, rec: dict | None = None) -> tuple[str, str]:
    keys = artifact_store.Keys(str(work), rec or record())
    return keys.key("prepare"), keys.key("train")


def test_each_input_of_a_key_changes_it_and_nothing_else_does(box):
    base = keys_of(box)
    assert keys_of(box) == base  # stable
    assert len(base[0]) == artifact_store.KEY_CHARS

    (box / "remote_scripts" / "common" / "unused.py").write_text("Y = 2\n")  # not imported by either script
    (box / "harness.toml").write_text("[hosts]\n")  # the config is no code of a stage
    assert keys_of(box) == base

    (box / "remote_scripts" / "common" / "events.py").write_text("X = 2\n")  # imported by prepare (inside a function)
    changed = keys_of(box)
    assert changed[0] != base[0] and changed[1] != base[1]  # train reads prepare's artifact: its key changes with it
    base = changed

    (box / "data.jsonl").write_text('{"a": 2}\n')
    assert keys_of(box)[0] != base[0]
    base = keys_of(box)

    safetensors(box / "verifier" / "model.safetensors", {"w": [8, 9]}, b"\0" * 512)  # other weights: another header
    assert keys_of(box)[0] != base[0]
    base = keys_of(box)
    (box / "verifier" / "config.json").write_text('{"hidden_size": 9}')
    assert keys_of(box)[0] != base[0]
    base = keys_of(box)

    other_lr = keys_of(box, record(train_flags={"lr": 0.003}))
    assert other_lr[0] == base[0] and other_lr[1] != base[1]
    assert keys_of(box, record(train_processes=8))[1] != base[1]
    assert keys_of(box, record(prepare_fresh="20261205-000001-bbbbbb"))[0] != base[0]
    other_env = {**record(), "versions": {"torch": "2.14.0"}}
    assert keys_of(box, other_env)[0] != base[0]
    image = {**record(), "image": {"id": "sha256:abc"}, "runtime": "docker"}
    assert keys_of(box, image)[0] != base[0]


def test_a_verifier_is_told_by_its_headers_and_small_files_not_by_reading_its_shards(box):
    """A shard's tensors are not read (hundreds of GB): its size and safetensors header tell it."""
    digests = artifact_store.Digests(str(box))
    shard = box / "verifier" / "model.safetensors"
    before = artifact_store.identify("verifier", str(box), digests)
    assert before["files"] == 2
    stat = shard.stat()
    data = bytearray(shard.read_bytes())
    data[-1] = 1  # the same size, header and time, other tensor bytes
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert artifact_store.identify("verifier", str(box), digests) == before
    assert artifact_store.identify("data.jsonl", str(box), digests) == {"file": artifact_store.Digests(str(box)).of(str(box / "data.jsonl"))}


def test_a_hub_id_is_told_by_the_revision_in_the_boxs_cache(box, tmp_path, monkeypatch):
    hub = tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    digests = artifact_store.Digests(str(box))
    assert artifact_store.identify("org/model", str(box), digests) == {"missing": "org/model", "hub_revision": None}
    refs = hub / "models--org--model" / "refs"
    refs.mkdir(parents=True)
    (refs / "main").write_text("a" * 40)
    assert artifact_store.identify("org/model", str(box), digests) == {"missing": "org/model", "hub_revision": "a" * 40}


def test_the_laptops_recipe_holds_every_flag_at_its_default_and_a_changed_layer_list(tmp_path):
    """extract's key holds its resolved flags: `--set extract.layers=[1,3,6]` is another artifact
    (the case where 1,000 files made for [2,4,5] were kept under the new layers' name)."""
    from harness.artifacts import recipes
    from harness.config import with_overrides

    project = tmp_path / "project"
    project.mkdir()
    (project / "remote_scripts").symlink_to(REPO / "remote_scripts")
    (project / "harness.toml").write_text(f'[hosts.box]\nlocal = true\nworkdir = "{tmp_path / "w"}"\n')
    config = load_config(project / "harness.toml")
    base = recipes(config, ["extract", "train"], 1, [], "r")
    assert set(base) == {"regenerate", "prepare", "extract", "train"}  # what train reads, directly or not
    assert base["extract"]["flags"]["batch_size"] == 16 and base["train"]["flags"]["lr"] == 0.001  # the scripts' own defaults
    assert base["train"]["reads"] == {"prepared": "prepare", "hidden_states": "extract"} and base["prepare"]["optional"] == ["regenerated"]
    assert base["prepare"]["paths"] == {"verifier": "outputs/tiny-verifier", "data": "outputs/chat.jsonl"}
    layered = recipes(with_overrides(config, ["extract.layers=[1, 3, 6]", "train.lr=1"]), ["extract", "train"], 1, [], "r")
    assert layered["extract"]["flags"]["layers"] == [1, 3, 6] and layered["train"]["flags"]["lr"] == 1.0  # as argparse reads it
    assert layered["prepare"] == base["prepare"]


@pytest.mark.parametrize("setting, says", [
    ("train.lrr=1e-3", "--set train.lrr: train_draft.py takes no --lrr (did you mean 'lr'?)"),
    ("train.epochs=ten", "--set train.epochs: invalid value 'ten' for --epochs"),
    ("trian.lr=1", "--set trian: no stage 'trian' (did you mean 'train'?)"),
    ("train.output=x", "--set train.output: a stage's --output is its artifact in the store"),
    ("train.lr", "--set 'train.lr': expected STAGE.FLAG=VALUE"),
])
def test_every_set_is_checked_by_the_stages_own_parser_before_anything_starts(tmp_path, setting, says):
    project = tmp_path / "project"
    project.mkdir()
    (project / "remote_scripts").symlink_to(REPO / "remote_scripts")
    (project / "harness.toml").write_text(f'[hosts.box]\nlocal = true\nworkdir = "{tmp_path / "w"}"\n')
    r = harness_cli(project / "harness.toml", "run", "box", "train", "--set", setting)
    assert r.returncode == 2 and r.stderr.startswith(f"harness: error: {says}"), r.stderr
    assert not (tmp_path / "w").exists()  # nothing synced, nothing started
    sweep = harness_cli(project / "harness.toml", "sweep", "box", "--set", "train.lrr=1e-3,3e-4")
    assert sweep.returncode == 2 and "--set train.lrr: train_draft.py takes no --lrr (did you mean 'lr'?)" in sweep.stderr, sweep.stderr
    (project / "harness.toml").write_text((project / "harness.toml").read_text() + "[sweep.grid.train]\nlrr = [1e-3]\n")
    with pytest.raises(ConfigError, match=r"\[sweep.grid.train\] lrr: train_draft.py takes no --lrr \(did you mean 'lr'\?\)"):
        load_config(project / "harness.toml")


def test_a_run_record_from_the_box_names_only_keys_and_paths_in_its_store(tmp_path):
    """run.json is the box's: a key that is no key, a path outside the store or a stage that is
    none is not taken (pull, serve and tensorboard act only on what RunArtifacts gives)."""
    from harness.artifacts import RunArtifacts

    key = "0123456789abcdef0123"
    rec = {"recipes": {"train": {}}, "store": "outputs/artifacts", "artifacts": {
        "train": {"key": key, "path": "/etc", "made_by": "../../x"},
        "evaluate": {"key": "../../../home/user"},
        "../x": {"key": key},
    }}
    artifacts = RunArtifacts(rec, "/w")
    assert set(artifacts.by_stage) == {"train"}
    train = artifacts.by_stage["train"]
    assert train.path == f"/w/outputs/artifacts/train/{key}" and train.made_by is None  # the record's path and made_by are not taken

"""`harness rm` and `harness gc` on a real box (this machine, runtime = "host", the fast fake
stages writing into their artifacts): what no kept run needs goes; what a kept run names, what a
queued or running run may read, what is being made, and anything outside the store stay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config import load_config
from harness.host import Host
from harness.transport import connect
from tests.fixtures.job_project import run_artifact, write_project

DEADLINE_S = 60


def project(tmp_path: Path, stages: dict) -> tuple[Path, Path, Host]:
    workdir = tmp_path / "work"
    config = write_project(tmp_path / "project", workdir, stages, host_table={"python": sys.executable}, inputs_by_path=False)
    cfg = load_config(config)
    transport = connect(cfg.host("box"))
    return config, workdir, Host(cfg, cfg.host("box"), lambda _name: transport)


def harness(config: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, timeout=120)


def run(config: Path, *stages: str) -> str:
    r = harness(config, "run", "box", *stages)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()[0]


def test_rm_then_gc_free_what_no_kept_run_needs_and_nothing_else(tmp_path):
    config, workdir, _ = project(tmp_path, {"train": {"lines": 2}})
    first = run(config, "prepare", "extract", "train")
    second = run(config, "prepare", "extract", "train", "--set", "train.lines=4")  # reuses prepare and extract
    store = workdir / "outputs" / "artifacts"
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("not the store's\n")
    (store / "train" / ("f" * 20)).symlink_to(outside)  # a link named like an artifact: removed as a link, never followed

    dry = harness(config, "gc", "box", "--dry-run")
    assert dry.returncode == 0 and f"would remove train/{'f' * 20} (" in dry.stdout, dry.stdout
    assert (store / "train" / ("f" * 20)).is_symlink()  # a dry run removes nothing

    first_train = run_artifact(workdir, first, "train")
    removed = harness(config, "rm", "box", first[-6:], "--json")  # the end of its id names it
    assert removed.returncode == 0, removed.stderr
    outcome = json.loads(removed.stdout)
    assert outcome["runs"] == [first] and not (workdir / "runs" / first).exists()
    assert {(a["stage"], a["key"]) for a in outcome["artifacts"]} == {("train", first_train.name), ("train", "f" * 20)}
    assert not first_train.exists() and not Path(f"{first_train}.json").exists() and not (store / "train" / ("f" * 20)).exists()
    assert (outside / "keep.txt").read_text() == "not the store's\n"  # the link went, never what it pointed at
    for stage in ("prepare", "extract", "train"):  # what the second run made or reused
        kept = run_artifact(workdir, second, stage)
        assert kept.is_dir() and Path(f"{kept}.json").is_file(), stage
    assert harness(config, "status", "box", second[:15]).returncode == 0  # the start of its id names the second run

    again = harness(config, "gc", "box")
    assert again.returncode == 0 and again.stdout.splitlines()[-1].startswith("freed 0 B"), again.stdout


def test_a_live_run_keeps_every_artifact_of_a_stage_it_may_read(tmp_path):
    """A run still queued or running names the artifacts it will read only when its stages start:
    until it ends, no artifact of a stage it names goes, and it cannot be removed itself."""
    gate = tmp_path / "may-end"
    config, workdir, host = project(tmp_path, {})
    other = run(config, "prepare", "extract", "--set", "extract.lines=2")  # an extract no later run names
    live = harness(config, "run", "box", "extract", "--set", f"extract.until_file={gate}", "--detach")
    assert live.returncode == 0, live.stderr
    live = live.stdout.splitlines()[0]
    deadline = time.monotonic() + DEADLINE_S
    while host.jobs.status(live).stages[0].state != "running":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    refused = harness(config, "rm", "box", live)
    assert refused.returncode == 2 and f"run {live} is running: cancel it first" in refused.stderr, refused.stderr
    other_extract = run_artifact(workdir, other, "extract")
    removed = json.loads(harness(config, "rm", "box", other, "--json").stdout)
    assert removed["runs"] == [other] and removed["artifacts"] == [] and removed["kept_for_live_runs"] >= 1, removed
    assert other_extract.is_dir()
    gate.touch()
    assert host.jobs.wait(live, DEADLINE_S).state == "ok"
    after = json.loads(harness(config, "gc", "box", "--json").stdout)  # the live run ended: now it goes
    assert {(a["stage"], a["key"]) for a in after["artifacts"]} == {("extract", other_extract.name)}


def test_a_removal_cut_short_leaves_no_artifact_that_claims_to_be_complete(tmp_path):
    """The record goes first: an artifact whose directory is half removed is incomplete, and the
    next run makes it again instead of reusing it."""
    from harness.host_helpers.artifact_store import Store

    config, workdir, _ = project(tmp_path, {})
    first = run(config, "prepare")
    artifact = run_artifact(workdir, first, "prepare")
    store = Store(str(workdir), "outputs/artifacts")
    removed = []
    real = os.unlink

    def cut(path, *a, **kw):  # the first unlink goes through (the record), the next is "cut"
        removed.append(path)
        if len(removed) > 1:
            raise KeyboardInterrupt
        return real(path, *a, **kw)

    os.unlink = cut
    try:
        try:
            store.remove("prepare", artifact.name)
        except KeyboardInterrupt:
            pass
    finally:
        os.unlink = real
    assert removed[0] == f"{artifact}.json" and not Path(f"{artifact}.json").exists()
    again = harness(config, "run", "box", "prepare")
    assert again.returncode == 0 and "reused" not in again.stdout


PRUNE_DOCKERFILE = """ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY container/requirements.txt /opt/harness/
COPY remote_scripts/ /opt/harness/remote_scripts/
"""


def image_ids(*refs: str) -> dict[str, str | None]:
    out = {}
    for ref in refs:
        r = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True, timeout=60)
        out[ref] = r.stdout.strip() if r.returncode == 0 else None
    return out


def layer_bytes(image: str) -> int:
    """The bytes of `image`'s last layer, from the engine: its size less its nearest ancestor's
    with fewer layers (the classic builder keeps an image per step)."""
    def inspect(ref: str) -> tuple[int, int, str]:
        r = subprocess.run(["docker", "image", "inspect", "--format", "{{.Size}} {{len .RootFS.Layers}} {{.Parent}}", ref], capture_output=True, text=True, timeout=60)
        size, count, parent = (r.stdout.split() + [""])[:3]
        return int(size), int(count), parent
    size, count, parent = inspect(image)
    while parent:
        psize, pcount, parent_of_parent = inspect(parent)
        if pcount < count:
            return size - psize
        parent = parent_of_parent
    return size


@pytest.mark.docker
def test_gc_removes_the_old_image_tags_harness_built_and_nothing_else(tmp_path, docker_base_image):
    """`harness gc` on a docker host: the project's image tags that no config, :latest or container
    uses go (--dry-run: which, and the bytes the engine would free); an image of the same repository
    that harness did not build, the current tag and one a container was made from stay."""
    from harness.runtime.image import build
    from harness.transport.local import LocalTransport
    from tests.fixtures.docker_engine import container_table
    from tests.fixtures.job_project import FAKE_STAGE, write_build_context

    repo = f"harness-prune-{os.urandom(4).hex()}"
    root = tmp_path / "project"
    write_build_context(root)
    (root / "container" / "Dockerfile.prune").write_text(PRUNE_DOCKERFILE)
    (root / "container" / "requirements.txt").write_text(f"# {repo}\n")
    config = write_project(root, tmp_path / "work", {}, host_table={"python": sys.executable, "runtime": "docker"},
                           container=container_table(docker_base_image, image=repo, dockerfile="container/Dockerfile.prune"))
    cfg = load_config(config)
    transport = LocalTransport()
    script = root / "remote_scripts" / "evaluate.py"
    built = []
    container = f"{repo}-user"
    try:
        for n in range(3):  # three script edits, three tags; the last is current and :latest
            script.write_text(FAKE_STAGE + f"# {n} {os.urandom(64 * 1024).hex()}\n")  # 128 KiB: a layer with bytes to free
            built.append(build(transport, load_config(config), cfg.host("box"), output=lambda _: None))
        in_use, old, current = built
        subprocess.run(["docker", "create", "--name", container, in_use.image_id, "true"], check=True, capture_output=True, timeout=60)
        subprocess.run(["docker", "tag", docker_base_image, f"{repo}:not-ours"], check=True, timeout=60)  # no harness label

        dry = harness(config, "gc", "box", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        plan = json.loads(dry.stdout)
        assert [(i["ref"], i["image_id"]) for i in plan["images"]] == [(old.ref, old.image_id)]
        assert plan["images"][0]["bytes"] == plan["image_bytes"] == layer_bytes(old.image_id) > 128 * 1024
        assert image_ids(old.ref)[old.ref] == old.image_id  # a dry run removes nothing

        r = harness(config, "gc", "box")
        assert r.returncode == 0, r.stderr
        assert f"removed image {old.ref} (" in r.stdout, r.stdout
        left = image_ids(old.ref, in_use.ref, current.ref, f"{repo}:latest", f"{repo}:not-ours")
        assert left[old.ref] is None
        assert left[in_use.ref] == in_use.image_id and left[current.ref] == left[f"{repo}:latest"] == current.image_id
        assert left[f"{repo}:not-ours"] is not None
    finally:
        subprocess.run(["docker", "rm", "-f", container], capture_output=True, timeout=60)
        subprocess.run(["docker", "rmi", f"{repo}:not-ours"], capture_output=True, timeout=60)  # a tag of the base: only the tag goes
        subprocess.run(["docker", "rmi", "-f", *[b.image_id for b in built]], capture_output=True, timeout=120)  # this test's own images, each under two tags


@pytest.mark.docker
def test_gc_removes_the_containers_a_crash_left_and_no_live_one(tmp_path, harness_test_image, docker_base_image):
    """A crash of everything on the box's side under `harness exec` (kill -9 of its client, the
    watcher beside it and harness) leaves the container running; `harness gc` finds it by its
    labels (the workdir, its client's pid, now gone), lists it on a dry run and removes it. A
    running run's stage container stays."""
    import signal

    from tests.fixtures.docker_engine import container_table

    from harness.runtime import prune
    from tests.fixtures.job_project import write_build_context

    workdir = tmp_path / "work"
    repo = f"harness-left-{os.urandom(4).hex()}"  # gc prunes its tags: an image of this test's own
    write_build_context(tmp_path / "project")
    config = write_project(tmp_path / "project", workdir, {"prepare": {"lines": 1, "until_file": str(workdir / "go")}},
                           host_table={"python": sys.executable, "runtime": "docker"}, container=container_table(docker_base_image, image=repo))
    built = harness(config, "build", "box")
    assert built.returncode == 0, built.stderr
    started = harness(config, "run", "box", "prepare", "--detach")  # runs until the test is done
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()
    deadline = time.monotonic() + DEADLINE_S
    while not subprocess.run(["docker", "ps", "-q", "--filter", f"label=harness.run={run_id}"], capture_output=True, text=True, timeout=60).stdout.strip():
        assert time.monotonic() < deadline, "the run's stage container never ran"
        time.sleep(0.2)
    proc = subprocess.Popen([sys.executable, "-m", "harness", "--config", str(config), "exec", "box", "--", "sh", "-c", "echo started; exec sleep 300"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout.readline() == b"started\n", proc.stderr.read1()
        os.killpg(proc.pid, signal.SIGKILL)  # harness, the shell, the watcher and the docker client at once
        proc.wait(timeout=30)
        listed = subprocess.run(["docker", "ps", "--filter", f"label=harness.workdir={workdir}", "--format", '{{.Names}} {{.Label "harness.client"}} {{.Label "harness.run"}}'],
                                capture_output=True, text=True, timeout=60).stdout.splitlines()
        left = [line.split()[0] for line in listed if not line.split()[-1].startswith(run_id[:4]) and len(line.split()) == 2]
        assert len(left) == 1 and len(listed) == 2, (listed, subprocess.run(["docker", "ps", "-a", "--filter", f"label=harness.workdir={workdir}", "--format", "{{.Names}} {{.Status}}"], capture_output=True, text=True).stdout, proc.stderr.read())  # the exec's, running on; and the run's stage
        dry = harness(config, "gc", "box", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stderr
        plan = json.loads(dry.stdout)["containers"]
        assert [c["name"] for c in plan] == left and "client" in plan[0]["why"] and "is gone" in plan[0]["why"], (dry.stdout, subprocess.run(["sh", "-c", prune._CONTAINERS, "sh", str(workdir)], capture_output=True, text=True).stdout)
        r = harness(config, "gc", "box")
        assert r.returncode == 0 and f"removed container {left[0]}: its command's client" in r.stdout, r.stdout + r.stderr
        after = subprocess.run(["docker", "ps", "-a", "--filter", f"label=harness.workdir={workdir}", "--format", "{{.Names}}"],
                               capture_output=True, text=True, timeout=60).stdout.split()
        assert after == [f"harness-{run_id}-prepare"]  # the live run's container stays
    finally:
        (workdir / "go").touch()
        ids = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=harness.workdir={workdir}", "--filter", "label=harness.client"],
                             capture_output=True, text=True, timeout=60).stdout.split()
        if ids:
            subprocess.run(["docker", "rm", "-f", *ids], capture_output=True, timeout=60)
        deadline = time.monotonic() + 30
        while subprocess.run(["docker", "ps", "-aq", "--filter", f"label=harness.workdir={workdir}"], capture_output=True, text=True, timeout=60).stdout.strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.3)  # the run ends (its go file), its container goes
        subprocess.run(["docker", "rmi", "-f", built.stdout.strip()], capture_output=True, timeout=60)  # this test's own image

"""`harness sync`: incremental by content hash against the host manifest, ignore rules, exec bits,
symlinks, odd names, deletions only inside the synced tree. Every test runs on LocalTransport and,
with the `ssh` marker, through a real sshd."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.sync import MANIFEST_PATH, SyncError, scan_local, sync
from harness.sync.manifest import parse_manifest

PATHS = ["remote_scripts", "container", "harness.toml"]
ODD_NAME = "dir with space/naïve ünïcode ☃.py"


def ssh_transport(ssh_host, monkeypatch):
    """An SSHTransport to the test sshd (its ControlMaster sockets in the test bed's directory)."""
    from harness.config import HostConfig
    from harness.transport import connect

    monkeypatch.setenv("HARNESS_CONTROL_DIR", str(ssh_host.control_dir))
    return connect(HostConfig(name="box", ssh=ssh_host.alias), ssh_host.connect_options())


@pytest.fixture(params=["local", pytest.param("ssh", marks=pytest.mark.ssh)])
def host(request, tmp_path, monkeypatch):
    """(transport, workdir on the host). The sshd runs on this machine, so the test reads the
    host side directly from the file system."""
    if request.param == "local":
        from harness.transport.local import LocalTransport

        yield LocalTransport("local"), str(tmp_path / "host-workdir")
    else:
        transport = ssh_transport(request.getfixturevalue("ssh_host"), monkeypatch)
        try:
            yield transport, str(tmp_path / "host-workdir")
        finally:
            transport.close()


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    (root / "remote_scripts" / "common").mkdir(parents=True)
    (root / "remote_scripts" / "train.py").write_text("print('train')\n")
    run = root / "remote_scripts" / "run.sh"
    run.write_text("#!/bin/sh\necho hi\n")
    run.chmod(0o755)
    (root / "remote_scripts" / "common" / "events.py").write_text("EVENTS = 1\n")
    odd = root / "remote_scripts" / ODD_NAME
    odd.parent.mkdir(parents=True)
    odd.write_text("# odd name\n")
    os.symlink("common/events.py", root / "remote_scripts" / "events_link.py")
    (root / "container").mkdir()
    (root / "container" / "Dockerfile").write_text("FROM scratch\n")
    (root / "harness.toml").write_text("[hosts.local]\nlocal = true\n")
    return root


def read_host_manifest(workdir: str) -> tuple[dict, str | None]:
    """(files, digest) of the manifest sync left on the host; ({}, None) where there is none (the
    sshd runs on this machine: read from the file system)."""
    path = Path(workdir) / MANIFEST_PATH
    return parse_manifest(path.read_bytes() if path.exists() else b"")


def do_sync(transport, root, workdir, **kw):
    return sync(transport, root, kw.pop("paths", PATHS), workdir, **kw)


def test_first_sync_sends_everything_with_modes_links_and_odd_names(host, project):
    transport, workdir = host
    result = do_sync(transport, project, workdir)
    w = Path(workdir)
    assert result.files_sent == len(result.plan.local.entries) == 7
    assert (w / "remote_scripts" / "train.py").read_text() == "print('train')\n"
    assert (w / "remote_scripts" / ODD_NAME).read_text() == "# odd name\n"
    assert stat.S_IMODE((w / "remote_scripts" / "run.sh").stat().st_mode) == 0o755
    link = w / "remote_scripts" / "events_link.py"
    assert link.is_symlink() and os.readlink(link) == "common/events.py"
    files, digest = read_host_manifest(workdir)
    assert set(files) == set(result.plan.local.entries)
    assert digest == result.manifest_digest



def test_the_helper_runs_on_usr_bin_python3_before_a_python3_on_path(project, tmp_path, monkeypatch):
    """The default `python3` runs the helper as /usr/bin/python3 where there is one, not a
    `python3` first on PATH (a version manager's shim); a configured path is used as it is."""
    import sys

    from harness.transport.local import LocalTransport

    calls = tmp_path / "shim-calls"
    shims = tmp_path / "shims"
    shims.mkdir()
    shim = shims / "python3"
    shim.write_text(f'#!/bin/sh\necho called >> {calls}\nexec {sys.executable} "$@"\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    transport = LocalTransport("local")
    assert do_sync(transport, project, str(tmp_path / "w1")).files_sent == 7
    if Path("/usr/bin/python3").exists():
        assert not calls.exists()  # the shim never ran
    else:  # no system interpreter: the one on PATH it is
        assert calls.read_text() == "called\n"
        calls.unlink()
    assert do_sync(transport, project, str(tmp_path / "w2"), python=str(shim)).files_sent == 7
    assert calls.read_text() == "called\n"  # a configured interpreter is used as it is

def test_noop_sync_sends_nothing_and_rehashes_nothing(host, project):
    transport, workdir = host
    do_sync(transport, project, workdir)
    manifest = Path(workdir) / MANIFEST_PATH
    before = manifest.stat().st_mtime_ns
    again = do_sync(transport, project, workdir)
    assert again.plan.is_noop and again.files_sent == 0 and again.deleted == 0
    assert again.plan.local.files_hashed == 0  # served from the (size, mtime_ns, inode) cache
    assert manifest.stat().st_mtime_ns == before  # the host was not written to at all


def test_one_changed_file_moves_alone(host, project):
    transport, workdir = host
    do_sync(transport, project, workdir)
    (project / "remote_scripts" / "train.py").write_text("print('train v2')\n")
    (project / "remote_scripts" / "run.sh").chmod(0o644)  # a mode change counts as a change
    result = do_sync(transport, project, workdir)
    assert result.plan.upload == ["remote_scripts/run.sh", "remote_scripts/train.py"]
    assert result.files_sent == 2
    assert (Path(workdir) / "remote_scripts" / "train.py").read_text() == "print('train v2')\n"
    assert stat.S_IMODE((Path(workdir) / "remote_scripts" / "run.sh").stat().st_mode) == 0o644
    files, digest = read_host_manifest(workdir)  # only the difference travelled
    assert files == result.plan.manifest and digest == result.manifest_digest


def test_ignore_rules_nested_gitignore_harnessignore_excludes_and_git(host, project):
    transport, workdir = host
    rs = project / "remote_scripts"
    (project / ".gitignore").write_text("__pycache__/\n*.pyc\n")
    (rs / ".gitignore").write_text("*.log\n!keep.log\nscratch/\n")
    (rs / "common" / ".harnessignore").write_text("secret_*.json\n")
    (rs / "__pycache__").mkdir()
    (rs / "__pycache__" / "train.cpython-311.pyc").write_bytes(b"\0")
    (rs / "a.log").write_text("x")
    (rs / "keep.log").write_text("kept")
    (rs / "scratch").mkdir()
    (rs / "scratch" / "big.bin").write_bytes(b"1" * 100)
    (rs / "common" / "secret_token.json").write_text("{}")
    (rs / "common" / "debug.tmp").write_text("tmp")
    (rs / ".git").mkdir()
    (rs / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    do_sync(transport, project, workdir, exclude=["*.tmp"])
    w = Path(workdir) / "remote_scripts"
    assert (w / "keep.log").exists() and (w / ".gitignore").exists()
    for gone in ["a.log", "scratch", "__pycache__", "common/secret_token.json", "common/debug.tmp", ".git"]:
        assert not (w / gone).exists(), gone


def test_deletions_propagate_and_host_outputs_survive(host, project):
    transport, workdir = host
    do_sync(transport, project, workdir)
    w = Path(workdir)
    # outputs the host made: in runs/, beside synced files, and in a synced directory
    (w / "runs" / "r1").mkdir(parents=True)
    (w / "runs" / "r1" / "log.txt").write_text("training log")
    (w / "remote_scripts" / "common" / "cache.bin").write_text("host-made")
    (w / "outputs").mkdir()
    (w / "outputs" / "ckpt.safetensors").write_text("weights")
    (project / "remote_scripts" / "common" / "events.py").unlink()
    (project / "remote_scripts" / ODD_NAME).unlink()
    result = do_sync(transport, project, workdir)
    assert sorted(result.plan.delete) == ["remote_scripts/common/events.py", f"remote_scripts/{ODD_NAME}"]
    assert result.deleted == 2
    assert not (w / "remote_scripts" / "common" / "events.py").exists()
    assert not (w / "remote_scripts" / "dir with space").exists()  # emptied by sync: tidied
    assert (w / "runs" / "r1" / "log.txt").read_text() == "training log"
    assert (w / "remote_scripts" / "common" / "cache.bin").read_text() == "host-made"
    assert (w / "outputs" / "ckpt.safetensors").read_text() == "weights"


def test_manipulated_manifest_cannot_delete_outside_the_tree(host, project, tmp_path):
    transport, workdir = host
    do_sync(transport, project, workdir)
    w = Path(workdir)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (w / "runs").mkdir()
    (w / "runs" / "out.txt").write_text("output")
    doc = json.loads((w / MANIFEST_PATH).read_text())
    entry = {"kind": "file", "size": 1, "mode": 420, "sha256": "0" * 64, "target": ""}
    for evil in ["../victim.txt", str(victim), "remote_scripts/../../victim.txt", "runs/out.txt", ".harness/x"]:
        doc["files"][evil] = entry
    (w / MANIFEST_PATH).write_text(json.dumps(doc))
    result = do_sync(transport, project, workdir)
    assert victim.read_text() == "precious"
    assert (w / "runs" / "out.txt").read_text() == "output"  # not under a synced path
    assert set(result.plan.ignored_manifest_entries) == {"../victim.txt", str(victim), "remote_scripts/../../victim.txt", ".harness/x"}
    assert result.plan.delete == []


def test_symlinked_directory_on_host_is_not_followed_by_deletion(host, project, tmp_path):
    transport, workdir = host
    do_sync(transport, project, workdir)
    w = Path(workdir)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "events.py").write_text("not yours")
    # someone replaced a synced directory on the host by a link out of the tree
    common = w / "remote_scripts" / "common"
    (common / "events.py").unlink()
    common.rmdir()
    os.symlink(outside, common)
    (project / "remote_scripts" / "common" / "events.py").unlink()
    with pytest.raises(SyncError, match="a parent directory is a symlink"):
        do_sync(transport, project, workdir)
    assert (outside / "events.py").read_text() == "not yours"


def test_symlink_leading_out_of_tree_is_not_sent(host, project, tmp_path):
    transport, workdir = host
    os.symlink("/etc/passwd", project / "remote_scripts" / "abs_link")
    os.symlink("../../outside", project / "remote_scripts" / "rel_escape")
    result = do_sync(transport, project, workdir)
    skipped = dict(result.plan.local.skipped)
    assert "remote_scripts/abs_link" in skipped and "remote_scripts/rel_escape" in skipped
    assert not os.path.lexists(Path(workdir) / "remote_scripts" / "abs_link")
    assert not os.path.lexists(Path(workdir) / "remote_scripts" / "rel_escape")


def test_dry_run_lists_and_changes_nothing(host, project):
    transport, workdir = host
    result = do_sync(transport, project, workdir, dry_run=True)
    assert result.dry_run and len(result.plan.upload) == 7
    assert not Path(workdir).exists()


def test_link_replaced_by_directory_and_back(host, project):
    transport, workdir = host
    do_sync(transport, project, workdir)
    link = project / "remote_scripts" / "events_link.py"
    link.unlink()
    link.mkdir()
    (link / "inner.py").write_text("inner\n")
    do_sync(transport, project, workdir)
    assert (Path(workdir) / "remote_scripts" / "events_link.py" / "inner.py").read_text() == "inner\n"
    (link / "inner.py").unlink()
    link.rmdir()
    os.symlink("train.py", link)
    do_sync(transport, project, workdir)
    assert os.readlink(Path(workdir) / "remote_scripts" / "events_link.py") == "train.py"


def test_scan_of_5000_files_is_cached(tmp_path):
    root = tmp_path / "big"
    for i in range(50):
        d = root / "remote_scripts" / f"d{i}"
        d.mkdir(parents=True)
        for j in range(100):
            (d / f"f{j}.py").write_text(f"{i}-{j}\n")
    cache = tmp_path / "cache.json"
    first = scan_local(root, ["remote_scripts"], cache_file=cache)
    assert len(first.entries) == 5000 and first.files_hashed == 5000
    second = scan_local(root, ["remote_scripts"], cache_file=cache)
    assert second.files_hashed == 0 and second.entries == first.entries


@pytest.mark.ssh
def test_cli_sync_dry_run_then_sync_then_noop(harness_config, ssh_host):
    import subprocess
    import sys

    root = harness_config.parent
    (root / "remote_scripts").mkdir()
    (root / "remote_scripts" / "train.py").write_text("print('x')\n")

    def harness(*args):
        return subprocess.run([sys.executable, "-m", "harness", "--config", str(harness_config), *args], capture_output=True, text=True, env=ssh_host.env(), timeout=120)

    dry = harness("sync", "box", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "send    remote_scripts/train.py" in dry.stdout and "send    harness.toml" in dry.stdout
    plan = json.loads(harness("sync", "box", "--dry-run", "--json").stdout)  # the whole of stdout
    assert (plan["where"], plan["dry_run"], plan["ok"]) == ("box", True, True)
    assert plan["hosts"]["box"]["upload"] == sorted(line.split()[1] for line in dry.stdout.splitlines() if line.startswith("send"))
    assert (plan["hosts"]["box"]["files_sent"], plan["hosts"]["box"]["delete"]) == (0, [])
    workdir = root / "work" / "box"
    assert not workdir.exists()
    first = harness("sync", "box")
    assert first.returncode == 0, first.stderr
    assert (workdir / "remote_scripts" / "train.py").read_text() == "print('x')\n"
    assert "sent 2 files" in first.stderr
    again = harness("sync", "box")
    assert again.returncode == 0 and "sent 0 files" in again.stderr and "2 unchanged" in again.stderr
    noop = json.loads(harness("sync", "box", "--json").stdout)["hosts"]["box"]
    assert (noop["upload"], noop["files_sent"], noop["unchanged"], len(noop["manifest_digest"])) == ([], 0, 2, 64)
    bad = harness("sync", "nosuchhost")
    assert bad.returncode == 2 and "unknown host or group" in bad.stderr


def test_first_sync_reads_each_file_once_and_a_touch_is_compared_not_sent(host, project):
    transport, workdir = host
    first = do_sync(transport, project, workdir)
    assert first.plan.local.files_hashed == 0  # the host had nothing: hashed while streaming
    files, _ = read_host_manifest(workdir)
    train = project / "remote_scripts" / "train.py"
    assert files["remote_scripts/train.py"].sha256 == hashlib.sha256(train.read_bytes()).hexdigest()
    os.utime(train, ns=(train.stat().st_atime_ns, train.stat().st_mtime_ns + 10**9))  # same content
    again = do_sync(transport, project, workdir)
    assert again.plan.is_noop and again.plan.local.files_hashed == 1  # read to compare, not sent


def test_file_changed_or_gone_between_plan_and_send(host, project):
    from harness.sync import PreparedSync

    transport, workdir = host
    with PreparedSync(transport, project, PATHS, workdir) as prepared:
        assert "remote_scripts/train.py" in prepared.plan.upload
        (project / "remote_scripts" / "train.py").write_text("print('edited meanwhile, longer')\n")
        (project / "container" / "Dockerfile").unlink()
        result = prepared.apply()
    w = Path(workdir)
    assert (w / "remote_scripts" / "train.py").read_text() == "print('edited meanwhile, longer')\n"
    assert not (w / "container" / "Dockerfile").exists()
    files, digest = read_host_manifest(workdir)
    assert "container/Dockerfile" not in files  # the manifest records what the host holds
    assert files["remote_scripts/train.py"].sha256 == hashlib.sha256(b"print('edited meanwhile, longer')\n").hexdigest()
    assert digest == result.manifest_digest


def test_cut_stream_leaves_no_partial_file_and_the_next_sync_completes(tmp_path, project):
    """The host helper fed a stream that ends inside a file (the laptop or the link died)."""
    import subprocess
    import sys

    from harness import helpers
    from harness.sync import RECORD, SYNC_APPLY

    workdir = tmp_path / "host-workdir"
    header = {"roots": ["remote_scripts"], "upload": {"remote_scripts/big.bin": {"kind": "file", "size": 1000, "mode": 0o644, "sha256": "", "target": ""}}, "delete": [], "drop": []}
    stream = json.dumps(header).encode() + b"\n" + RECORD.pack(1000, 0o644) + b"x" * 400
    request = helpers.payload(SYNC_APPLY, {"workdir": str(workdir)})  # as harness.helpers.start sends it; the stream follows
    proc = subprocess.run(helpers.argv(SYNC_APPLY, python=sys.executable), input=request + stream, capture_output=True, timeout=60)
    assert proc.returncode != 0 and b"ended early" in proc.stderr
    assert not (workdir / "remote_scripts" / "big.bin").exists()
    pending = json.loads((workdir / MANIFEST_PATH).read_text())
    assert pending["digest"] == "pending" and "remote_scripts/big.bin" in pending["files"]  # still owned
    from harness.transport.local import LocalTransport

    result = do_sync(LocalTransport("local"), project, str(workdir))
    assert result.files_sent == 7 and not result.refused


def test_the_box_side_refuses_a_deletion_outside_the_tree_even_when_the_laptop_asks(tmp_path):
    """sync_apply.py checks every path again (its manifest lives on the box and may be edited, the
    stream may be anyone's): a header naming paths outside the synced roots, or the harness's own
    state, deletes nothing there and says so, whatever the laptop side would have filtered."""
    workdir = tmp_path / "work"
    (workdir / ".harness").mkdir(parents=True)
    (workdir / "remote_scripts").mkdir()
    (workdir / "remote_scripts" / "ok.py").write_text("x")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (workdir / "runs").mkdir()
    (workdir / "runs" / "out.txt").write_text("output")
    (workdir / ".harness" / "x").write_text("state")
    evil = ["../victim.txt", str(victim), "remote_scripts/../../victim.txt", "runs/out.txt", ".harness/x", "remote_scripts\\..\\..\\victim.txt"]
    entry = {"kind": "file", "size": 1, "mode": 420, "sha256": "0" * 64, "target": ""}
    (workdir / MANIFEST_PATH).write_text(json.dumps({"version": 1, "digest": "d", "files": {p: entry for p in [*evil, "remote_scripts/ok.py"]}}))
    header = {"roots": ["remote_scripts"], "upload": {}, "delete": [*evil, "remote_scripts/ok.py"], "drop": []}
    stream = (json.dumps({"workdir": str(workdir)}) + "\n" + json.dumps(header) + "\n" + json.dumps({"digest": "d2"}) + "\n").encode()
    helper = Path(__file__).resolve().parent.parent / "harness" / "host_helpers" / "sync_apply.py"
    proc = subprocess.run([sys.executable, str(helper)], input=stream, capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    said = json.loads(proc.stdout.decode().splitlines()[-1])
    assert said["deleted"] == 1 and not (workdir / "remote_scripts" / "ok.py").exists()  # the one path in the tree
    assert sorted(p for p, _ in said["refused"]) == sorted(evil)
    assert victim.read_text() == "precious" and (workdir / "runs" / "out.txt").read_text() == "output" and (workdir / ".harness" / "x").read_text() == "state"


def test_a_newline_in_a_file_name_cannot_forge_a_line(tmp_path):
    """A name is shown quoted with its escapes where it is not printable: a link named to look like
    harness's own error line stays inside the 'skipped' line."""
    project = tmp_path / "p"
    (project / "remote_scripts").mkdir(parents=True)
    (project / "remote_scripts" / "a.py").write_text("a")
    (project / "remote_scripts" / "x\nharness: error: forged").symlink_to("/etc/passwd")
    (project / "harness.toml").write_text(f'[hosts.loc]\nlocal = true\nworkdir = "{tmp_path / "w"}"\nruntime = "host"\n\n[sync]\npaths = ["remote_scripts"]\n')
    for args in (["sync", "loc", "--dry-run"], ["sync", "loc"]):
        proc = subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, timeout=120, cwd=project)
        assert proc.returncode == 0, proc.stderr
        assert not any(line.startswith("harness: error: forged") for line in (proc.stdout + proc.stderr).splitlines()), proc.stderr
        assert "'remote_scripts/x\\nharness: error: forged'" in proc.stderr


def test_a_helper_killed_mid_file_leaves_nothing_at_the_final_path_and_the_next_sync_tidies(tmp_path, project):
    """SIGKILL of the box's helper while a file streams in (the box ran out of memory, someone
    killed it): the final path never holds part of a file; the next sync writes it whole and
    removes the killed helper's temporary file."""
    import signal

    from harness import helpers
    from harness.sync import RECORD, SYNC_APPLY
    from harness.transport.local import LocalTransport

    workdir = tmp_path / "host-workdir"
    header = {"roots": ["remote_scripts"], "upload": {"remote_scripts/big.bin": {"kind": "file", "size": 4 * 2**20, "mode": 0o644, "sha256": "", "target": ""}},
              "delete": [], "drop": []}
    proc = subprocess.Popen(helpers.argv(SYNC_APPLY, python=sys.executable), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdin.write(helpers.payload(SYNC_APPLY, {"workdir": str(workdir)}) + json.dumps(header).encode() + b"\n" + RECORD.pack(4 * 2**20, 0o644) + b"x" * 2**21)
    proc.stdin.flush()
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".harness-sync-tmp-") and p.stat().st_size > 0 for p in (workdir / "remote_scripts").glob(".*")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (workdir / "remote_scripts" / "big.bin").exists()
    result = do_sync(LocalTransport("local"), project, str(workdir))
    assert not result.refused and (workdir / "remote_scripts" / "train.py").read_text() == "print('train')\n"
    assert [p.name for p in (workdir / "remote_scripts").iterdir() if p.name.startswith(".harness-sync-tmp-")] == []

"""`harness pull`: verified, atomic, resumable, safe. Local tests use LocalTransport; the `ssh`
tests go through the real sshd, and through a user-space delay line (bench/delayline.py) where the
link must be slow enough to interrupt or must be cut."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from harness.pull import PART_SUFFIX, PullConnection, PullOptions, PullProgress, RemoteEntry, clean_rel, pull, received_bytes, select
from harness.pull.session import LONG_LINK_RTT_S, ONE_STREAM_BYTES, streams_for
from harness.transport.local import LocalTransport
from tests.fixtures.job_project import run_in_pty

MiB = 1 << 20
REPO = Path(__file__).resolve().parents[1]


def sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(4 * MiB):
            h.update(chunk)
    return h.hexdigest()


def leftovers(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob(f"*{PART_SUFFIX}*"))


@pytest.fixture
def remote_tree(tmp_path) -> Path:
    src = tmp_path / "remote" / "run1"
    (src / "sub dir").mkdir(parents=True)
    (src / "big.bin").write_bytes(os.urandom(5 * MiB + 123))
    (src / "sub dir" / "naïve ☃.txt").write_text("unicode name\n")
    (src / "empty").touch()
    tool = src / "tool.sh"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    os.symlink("sub dir/naïve ☃.txt", src / "link")
    return src


def test_pull_fetches_verifies_and_keeps_modes_and_links(remote_tree, tmp_path):
    dest = tmp_path / "dest"
    report = pull(LocalTransport(), str(remote_tree), dest, PullOptions(streams=3, piece_size=MiB, adaptive=False))
    assert report.ok, report
    assert sorted(report.fetched) == ["big.bin", "empty", "sub dir/naïve ☃.txt", "tool.sh"]
    for rel in report.fetched:
        assert sha(dest / rel) == sha(remote_tree / rel)
    assert os.stat(dest / "tool.sh").st_mode & 0o777 == 0o755
    assert os.readlink(dest / "link") == "sub dir/naïve ☃.txt"
    assert leftovers(dest) == []
    again = pull(LocalTransport(), str(remote_tree), dest, PullOptions(streams=3, piece_size=MiB, adaptive=False))
    assert again.bytes_received == 0 and sorted(again.identical) == sorted(report.fetched)


def test_a_different_local_copy_of_the_same_size_is_replaced(remote_tree, tmp_path):
    dest = tmp_path / "dest"
    pull(LocalTransport(), str(remote_tree), dest)
    (dest / "big.bin").write_bytes(os.urandom(5 * MiB + 123))
    report = pull(LocalTransport(), str(remote_tree), dest)
    assert report.fetched == ["big.bin"] and sha(dest / "big.bin") == sha(remote_tree / "big.bin")


def test_symlinks_out_and_local_parent_links_are_refused(remote_tree, tmp_path):
    os.symlink("/etc/passwd", remote_tree / "abs")
    os.symlink("../../outside", remote_tree / "sub dir" / "rel")
    dest = tmp_path / "dest"
    outside = tmp_path / "outside"
    outside.mkdir()
    dest.mkdir()
    os.symlink(outside, dest / "sub dir")  # a local link leading out of LOCAL_DIR
    report = pull(LocalTransport(), str(remote_tree), dest)
    refused = dict(report.refused)
    # `link` -> "sub dir/naïve ☃.txt" stays inside as text, but `sub dir` here leads out
    assert set(refused) == {"abs", "sub dir/rel", "sub dir/naïve ☃.txt", "link"}
    assert list(outside.iterdir()) == [] and not os.path.lexists(dest / "link")
    assert not report.ok


HOSTILE_NAMES = """
def hostile(doc):
    for name in ["../escape.txt", "/tmp/abs-escape.txt", "ok/../../escape2.txt"]:
        doc["entries"].append([name, "file", 3, 0o644, 0, ""])
    return doc
"""
# Runs the helper command line after its own arguments, as the host would, having read what
# harness.helpers sends first (the helper's source: SIZE bytes, the last argument; then the
# request line) and passed it on; `request` is that request. The rest of stdin is passed on as it comes.
RELAY = """
import json, subprocess, sys, threading
stdin = sys.stdin.buffer
sent = stdin.read(int(sys.argv[-1])) + stdin.readline()
request = json.loads(sent[int(sys.argv[-1]):])
"""
RELAY_FEED = """
helper.stdin.write(sent)

def feed():
    while chunk := stdin.read1(1 << 16):
        helper.stdin.write(chunk)
    helper.stdin.close()

threading.Thread(target=feed, daemon=True).start()
"""
# the names in the listing the first stream brings (its status-4 frame); every other frame as sent
INJECT_STREAM = HOSTILE_NAMES + RELAY + """
helper = subprocess.Popen(sys.argv[1:], stdin=subprocess.PIPE, stdout=subprocess.PIPE if request["mode"] == "send" else None, bufsize=0)
""" + RELAY_FEED + """
if request["mode"] != "send":
    sys.exit(helper.wait())
import struct
frame, out = struct.Struct(">BQ"), sys.stdout.buffer

def read(n):
    data = b""
    while len(data) < n and (chunk := helper.stdout.read(n - len(data))):
        data += chunk
    return data

while len(header := read(frame.size)) == frame.size:
    status, length = frame.unpack(header)
    data = read(length)
    if status == 4 and data.startswith(b"[{"):  # the answer to the `list` question
        data = json.dumps([hostile(doc) for doc in json.loads(data)]).encode()
    out.write(frame.pack(status, len(data)) + data)
    out.flush()
"""


class HostileHost(LocalTransport):
    """A host whose listing names paths outside the destination (a compromised or buggy box)."""

    def local_argv(self, argv):
        if argv[-2] == "pull_helper.py":  # harness.helpers.argv: ..., NAME, SIZE
            return [sys.executable, "-c", INJECT_STREAM, *argv]
        return super().local_argv(argv)


def test_traversal_names_from_the_host_are_refused_and_nothing_is_written(remote_tree, tmp_path):
    dest = tmp_path / "a" / "dest"
    report = pull(HostileHost(), str(remote_tree), dest)
    assert {n for n, _ in report.refused} == {"../escape.txt", "/tmp/abs-escape.txt", "ok/../../escape2.txt"}
    assert not (tmp_path / "a" / "escape.txt").exists() and not Path("/tmp/abs-escape.txt").exists()
    assert not (tmp_path / "escape2.txt").exists()
    assert (dest / "big.bin").exists()  # the rest of the pull went on


def test_clean_rel():
    assert clean_rel("a/b c/ü") == "a/b c/ü"
    for bad in ["", "/abs", "../x", "a/../b", "a//b", "a/./b", "a/", "x\0y"]:
        assert clean_rel(bad) is None, bad


class ChangeOnHost(PullProgress):
    """Rewrites the host file while its bytes are in flight (after the first chunk arrives)."""

    def __init__(self, path: Path, times: int):
        import threading

        self.path, self.times, self.size, self.lock = path, times, path.stat().st_size, threading.Lock()

    def advance(self, nbytes: int) -> None:
        with self.lock:  # called from several stream threads
            if self.times > 0:
                self.times -= 1
                self.path.write_bytes(os.urandom(self.size))


def test_a_file_changed_during_the_pull_is_caught_and_fetched_again(remote_tree, tmp_path):
    dest = tmp_path / "dest"
    report = pull(LocalTransport(), str(remote_tree), dest, PullOptions(streams=2, adaptive=False, piece_size=MiB), ChangeOnHost(remote_tree / "big.bin", 1))
    assert report.ok and "big.bin" in report.fetched
    assert sha(dest / "big.bin") == sha(remote_tree / "big.bin")  # the new version, whole


def test_a_file_that_keeps_changing_is_reported_and_never_kept(remote_tree, tmp_path):
    dest = tmp_path / "dest"
    report = pull(LocalTransport(), str(remote_tree), dest, PullOptions(streams=2, adaptive=False, piece_size=MiB, retries=1), ChangeOnHost(remote_tree / "big.bin", 10**6))
    assert [n for n, _ in report.failed] == ["big.bin"], report
    assert not (dest / "big.bin").exists() and leftovers(dest) == []
    assert (dest / "tool.sh").exists()


def test_bytes_left_by_an_earlier_pull_count_only_once_checked_against_the_host(remote_tree, tmp_path):
    """A part file whose recorded bytes were damaged since (a disk error, an edit): each piece is
    checked against the host's digest before it counts, so the damaged piece comes again."""
    from harness.pull.partfile import PartFile

    dest = tmp_path / "dest"
    dest.mkdir()
    st = (remote_tree / "big.bin").stat()
    entry = RemoteEntry("big.bin", "file", st.st_size, st.st_mode & 0o7777, st.st_mtime_ns)  # as the host lists it
    part = PartFile(dest / "big.bin", entry, MiB)  # as an interrupted pull leaves it: all bytes in
    data = bytearray((remote_tree / "big.bin").read_bytes())
    data[3 * MiB + 7] ^= 0xFF  # one damaged byte, in the fourth piece
    os.pwrite(part.fd, bytes(data), 0)
    for i in range(len(part.pieces)):
        part.done[i] = part.pieces[i][1] - part.pieces[i][0]
        part._record(i)
    part.close()
    report = pull(LocalTransport(), str(remote_tree), dest, PullOptions(streams=2, adaptive=False, piece_size=MiB))
    assert report.ok, report
    assert sha(dest / "big.bin") == sha(remote_tree / "big.bin")
    others = sum((remote_tree / rel).stat().st_size for rel in report.fetched if rel != "big.bin")
    assert report.bytes_received == MiB + others  # the damaged piece came again; the others were checked in place
    assert leftovers(dest) == []


def test_a_piece_is_kept_only_with_the_hosts_crc_and_a_mismatch_starts_it_over(tmp_path):
    """The check the host's status-2 frame carries: the CRC-32 of the whole piece, which the
    laptop computes over the bytes as they arrive, from the piece's start."""
    import zlib

    from harness.pull.partfile import CHECK, PartFile

    data = os.urandom(2 * MiB)
    stream = tmp_path / "stream"
    stream.write_bytes(data)
    part = PartFile(tmp_path / "dest.bin", RemoteEntry("dest.bin", "file", len(data), 0o644, 1), MiB)
    with open(stream, "rb") as f:
        for piece, host_crc in ((0, zlib.crc32(data[:MiB])), (1, zlib.crc32(data[MiB:]) ^ 1)):
            assert part.begin(piece) == piece * MiB
            assert part.receive(piece, f.fileno(), MiB, lambda n: None) == MiB
            part.check(piece, CHECK.pack(host_crc))
    assert part.verified == [True, False]
    assert part.done == [MiB, 0] and part.failed == "checksum mismatch"
    part.discard()
    assert leftovers(tmp_path) == []


def test_include_exclude_and_latest_checkpoint_selection():
    def e(rel, kind="file", target=""):
        return RemoteEntry(rel, kind, 1, 0o644, 0, target)

    entries = [
        e("run.json"), e("train/log"), e("train/events.jsonl"), e("hidden/hs_0.safetensors"),
        e("checkpoints", "dir"), e("checkpoints/0", "dir"), e("checkpoints/0/model.safetensors"),
        e("checkpoints/2", "dir"), e("checkpoints/2/model.safetensors"), e("checkpoints/2/config.json"),
        e("checkpoints/10", "dir"), e("checkpoints/10/model.safetensors"), e("checkpoints/10/config.json"),
        e("checkpoints/checkpoint_best", "link", "2"), e("checkpoints/latest", "link", "10"),
    ]
    latest = {x.rel for x in select(entries, PullOptions(latest_checkpoint=True))}
    assert latest == {"run.json", "train/log", "train/events.jsonl", "checkpoints/10/model.safetensors", "checkpoints/10/config.json", "checkpoints/latest"}
    only_logs = {x.rel for x in select(entries, PullOptions(include=("log", "*.jsonl")))}
    assert only_logs == {"train/log", "train/events.jsonl"}
    no_ckpt = {x.rel for x in select(entries, PullOptions(exclude=("checkpoints/",)))}
    assert no_ckpt == {"run.json", "train/log", "train/events.jsonl", "hidden/hs_0.safetensors"}


def test_pull_of_a_single_file_and_a_missing_path(remote_tree, tmp_path):
    from harness.errors import UsageError

    report = pull(LocalTransport(), str(remote_tree / "tool.sh"), tmp_path / "one")
    assert report.fetched == ["tool.sh"] and (tmp_path / "one" / "tool.sh").read_text() == "#!/bin/sh\n"
    with pytest.raises(UsageError, match="No such file"):
        pull(LocalTransport(), str(remote_tree / "nope"), tmp_path / "two")


# -------------------------------------------------------------------------------------------------
# Through the real sshd


def _slow_link_files(ssh_host, tmp_path: Path, port: int, host_pub_line: str | None = None) -> tuple[Path, Path]:
    """ssh_config and known_hosts for `slow`: 127.0.0.1:port (a delay line in front of the test
    bed's box, or of the sshd whose host key is host_pub_line)."""
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(ssh_host.known_hosts_lines() + f"[127.0.0.1]:{port} {host_pub_line or ssh_host.box.host_pub_line}\n")
    config = tmp_path / "ssh_config"
    config.write_text(textwrap.dedent(f"""\
        Host slow
          HostName 127.0.0.1
          Port {port}
          User {ssh_host.user}
          IdentityFile {ssh_host.key_path}
          IdentitiesOnly yes
          UserKnownHostsFile {known_hosts}
        """))
    return config, known_hosts


PULL_SCRIPT = """
import json, sys
from harness.config import HostConfig
from harness.transport import ConnectOptions, connect
from harness.pull import PullOptions, pull
config, known_hosts, src, dest = sys.argv[1:5]
with connect(HostConfig(name="slow", ssh="slow"), ConnectOptions(known_hosts=known_hosts, ssh_config=config)) as t:
    r = pull(t, src, dest, PullOptions(streams=4, piece_size=4 << 20))
print(json.dumps({"ok": r.ok, "received": r.bytes_received, "resumed": r.bytes_resumed, "failed": r.failed}))
"""


def _received(dest: Path, name: str) -> int:
    return received_bytes(dest / name)


@pytest.mark.ssh
@pytest.mark.slow
def test_large_pull_interrupted_many_times_resumes_to_an_identical_file(ssh_host, tmp_path):
    from bench.delayline import DelayLine

    size = 96 * MiB
    src = tmp_path / "host" / "ckpt"
    src.mkdir(parents=True)
    with open(src / "model.safetensors", "wb") as f:
        for _ in range(size // MiB):
            f.write(os.urandom(MiB))
    dest = tmp_path / "dest"
    control = Path(ssh_host.control_dir) / "slow"
    control.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "HARNESS_CONTROL_DIR": str(control), "PYTHONPATH": str(REPO)}
    rng = random.Random(1234)
    target = dest / "model.safetensors"
    done: list[str] = []
    with DelayLine(("127.0.0.1", ssh_host.port), rtt_ms=10, rate=40 * MiB) as line:
        config, known_hosts = _slow_link_files(ssh_host, tmp_path, line.port)
        argv = [sys.executable, "-c", PULL_SCRIPT, str(config), str(known_hosts), str(src), str(dest)]
        for how in ["kill", "kill", "cut", "kill", "cut"]:
            at = min(received_bytes(target) + rng.randint(4, 16) * MiB, size - 12 * MiB)
            if target.exists() or received_bytes(target) >= at:
                break
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
            deadline = time.monotonic() + 60
            while received_bytes(target) < at and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.005)
            assert proc.poll() is None, f"pull ended before the {how} at {at}: {proc.communicate()}"
            if how == "kill":
                os.killpg(proc.pid, signal.SIGKILL)  # the pulling process and its ssh streams
                proc.communicate(timeout=60)
                assert not target.exists()  # never a partial file at the final name
            else:
                # the link drops under every stream and the control connection; the pull
                # reconnects and either finishes (verified) or leaves its parts for the next run
                line.cut()
                out, err = proc.communicate(timeout=120)
                assert target.exists() == (proc.returncode == 0), err.decode()[-2000:]
            done.append(how)
        forwarded_before = line.bytes_to_client
        out = subprocess.run(argv, env=env, capture_output=True, timeout=120)
        assert out.returncode == 0, out.stderr.decode()
        final = json.loads(out.stdout.decode().splitlines()[-1])
    assert done.count("kill") >= 2 and done.count("cut") >= 1, done
    assert final["ok"]
    assert sha(target) == sha(src / "model.safetensors")
    assert leftovers(dest) == []
    # the last run moved only what was missing (plus protocol overhead)
    assert line.bytes_to_client - forwarded_before < (size - final["resumed"]) * 1.05 + 2 * MiB


def test_streams_for_a_round_trip():
    """How many streams a pull opens at once, from the round trip it measured (the end-to-end
    throughput of more streams on a long link: bench/transfer.py)."""
    big = 96 * MiB
    assert streams_for(big, None, 8) == 1  # not measured: one
    assert streams_for(big, LONG_LINK_RTT_S * 0.9, 8) == 1  # loopback or LAN: CPU-bound, one
    assert streams_for(big, 0.030, 4) == 4  # a long link: as many as allowed ...
    assert streams_for(big, 0.030, 2) == 2
    assert 1 < streams_for(40 * MiB, 0.030, 8) < 8  # ... or as the bytes pay for
    assert streams_for(ONE_STREAM_BYTES - 1, 0.5, 8) == 1  # too little to pay for a second


@pytest.mark.parametrize("flags, streams", [([], 8), (["--streams", "3"], 3), (["-j", "3"], 3), (["--jobs", "3"], 3), (["--jobs", "3", "--streams", "3"], 3)])
def test_pull_streams_flag_and_its_former_name(tmp_path, monkeypatch, flags, streams):
    """--streams N is the most parallel streams; --jobs N (its former name) still means the same.
    The pull itself is stopped at its start: what reaches it is the request."""
    from click.testing import CliRunner

    import harness.run_pull
    from harness.cli.app import cli

    asked = []

    def stop(host, request, **_):
        asked.append(request.streams)
        raise KeyboardInterrupt

    monkeypatch.setattr(harness.run_pull, "pull", stop)
    (tmp_path / "harness.toml").write_text('[hosts.here]\nlocal = true\n')
    r = CliRunner().invoke(cli, ["--config", str(tmp_path / "harness.toml"), "pull", "here", "x", str(tmp_path / "d"), *flags])
    assert (r.exit_code, asked) == (130, [streams]), r.output


def test_pull_refuses_both_names_with_two_values(tmp_path):
    (tmp_path / "harness.toml").write_text('[hosts.here]\nlocal = true\n')
    r = subprocess.run([sys.executable, "-m", "harness", "--config", str(tmp_path / "harness.toml"), "pull", "here", "x", "--jobs", "2", "--streams", "3"],
                       capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("harness: error: --jobs is the former name of --streams: give --streams 3 alone"), r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["harness.toml"]


@pytest.mark.ssh
@pytest.mark.parametrize("rtt_ms, jobs", [(10, 2), (30, 4)], ids=["short-link", "forwarded-streams"])
def test_ctrl_c_during_a_cli_pull_leaves_parts_the_next_pull_resumes_from(ssh_host, tmp_path, rtt_ms, jobs):
    """Ctrl-C (SIGINT to the terminal's whole process group: harness and its ssh streams) in the
    middle of `harness pull` on a slow link: no file at its final name, the pieces received kept
    in .harness-part files, and the next `harness pull` moves only the rest (counted on the
    link) into an identical file. At 30 ms the pull runs several streams, the further ones
    through the first helper's listener (tests/test_pull_streams.py)."""
    from bench.delayline import DelayLine
    from tests.test_pull_streams import direct_tcpip_channels

    piece = PullOptions().piece_size
    size = 6 * piece
    src = tmp_path / "host" / "ckpt"
    src.mkdir(parents=True)
    (src / "model.safetensors").write_bytes(os.urandom(size))
    dest = tmp_path / "dest"
    target = dest / "model.safetensors"
    control = Path(ssh_host.control_dir) / f"ctrlc{rtt_ms}"
    control.mkdir(mode=0o700, exist_ok=True)
    forwarded_before = direct_tcpip_channels(ssh_host.box.log_text())
    with DelayLine(("127.0.0.1", ssh_host.port), rtt_ms=rtt_ms, rate=8 * MiB) as line:
        ssh_config, known_hosts = _slow_link_files(ssh_host, tmp_path, line.port)
        config = tmp_path / "harness.toml"
        config.write_text(f'[hosts.slow]\nssh = "slow"\nworkdir = "{tmp_path / "host"}"\n')
        env = {**ssh_host.env(), "HARNESS_SSH_CONFIG": str(ssh_config), "HARNESS_KNOWN_HOSTS": str(known_hosts), "HARNESS_CONTROL_DIR": str(control)}
        argv = [sys.executable, "-m", "harness", "--config", str(config), "pull", "slow", str(src), str(dest), "-j", str(jobs)]
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 120
        while received_bytes(target) < 2.5 * piece and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.poll() is None, f"pull ended before the Ctrl-C: {proc.communicate()}"
        interrupted_streams = direct_tcpip_channels(ssh_host.box.log_text()) - forwarded_before
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 130 and "Traceback" not in err.decode(), err.decode()[-2000:]
        assert not target.exists() and leftovers(dest)
        before = line.bytes_to_client
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        moved = line.bytes_to_client - before
    assert "resumed" in r.stdout + r.stderr
    if rtt_ms > LONG_LINK_RTT_S * 1000:
        # the pull measures a round trip no shorter than the line's delay, so it opens further
        # streams from the start (streams_for). The 10 ms line may read above the threshold on a
        # loaded machine: its stream count is not asserted (test_streams_for_a_round_trip).
        assert interrupted_streams > 0, interrupted_streams
    assert moved < size - piece, (moved, size)  # at least one whole piece was not fetched again
    assert sha(target) == sha(src / "model.safetensors") and leftovers(dest) == []


@pytest.mark.ssh
def test_pull_over_ssh_verifies_and_refuses(ssh_host, tmp_path, monkeypatch, remote_tree):
    from tests.test_sync import ssh_transport

    os.symlink("/etc", remote_tree / "etc_link")
    with ssh_transport(ssh_host, monkeypatch) as t:
        dest = tmp_path / "dest"
        report = pull(t, str(remote_tree), dest, PullOptions(streams=4, piece_size=MiB, adaptive=False))
        assert dict(report.refused).keys() == {"etc_link"}
        for rel in report.fetched:
            assert sha(dest / rel) == sha(remote_tree / rel)
        assert len(report.fetched) == 4 and os.readlink(dest / "link") == "sub dir/naïve ☃.txt"
        again = pull(t, str(remote_tree), dest)
        assert again.bytes_received == 0 and len(again.identical) == 4


def keyed_run(workdir: Path, run_id: str, made_by: str | None = None, lines: int = 1) -> Path:
    """A finished run as harness lays it out: records and logs under runs/<id>/, what its stages
    made or reused as artifacts of the store, named in run.json by key (`lines`: what the report
    holds, so two runs' artifacts differ)."""
    run_dir = workdir / "runs" / run_id
    (run_dir / "train").mkdir(parents=True)
    (run_dir / "train" / "log").write_text("step 1\n")
    keys = {stage: hashlib.sha256(f"{stage}{lines}".encode()).hexdigest()[:20] for stage in ("train", "evaluate", "export")}
    store = workdir / "outputs" / "artifacts"
    artifacts = {}
    for stage, key in keys.items():
        artifacts[stage] = {"key": key, "role": "reused" if made_by else "made", "made_by": made_by or run_id}
        d = store / stage / key
        if d.exists():
            continue
        d.mkdir(parents=True)
        if stage == "train":
            (d / "0").mkdir()
            (d / "0" / "model.safetensors").write_bytes(os.urandom(100))
            (d / "metrics.jsonl").write_text(f'{{"step": {lines}}}\n')
            (d / "best.json").write_text(json.dumps({"checkpoint": "0", "step": lines, "tau": 2.0}))
        elif stage == "evaluate":
            (d / "report.json").write_text(json.dumps({"tau": 1.0 + lines / 10}))
        else:
            (d / "config.json").write_text("{}")
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "workdir": str(workdir), "store": "outputs/artifacts",
                                                  "recipes": {s: {} for s in keys}, "artifacts": artifacts}))
    return run_dir


def test_a_run_brings_its_own_artifacts_however_many_runs_came_later(tmp_path):
    """Each run's outputs are the artifacts its record names by key: a later run with other
    inputs (other artifacts) changes nothing of what an earlier run's pull brings; a run that
    reused an artifact brings the same bytes as the run that made it."""
    from harness.run_pull import RunPullRequest, plan, pull_run

    work = tmp_path / "work"
    first = keyed_run(work, "20260101-120000-aaaaaa", lines=1)
    keyed_run(work, "20260101-130000-bbbbbb", lines=2)  # later, other inputs: other artifacts
    reused = keyed_run(work, "20260101-140000-cccccc", made_by="20260101-120000-aaaaaa", lines=1)

    def pull_the_run(run_dir: Path, dest: Path, **kw):
        with PullConnection(LocalTransport()) as c:
            what = plan(c, "box", str(run_dir), RunPullRequest(**kw))
            return what, pull_run(c, what, str(dest))

    what, report = pull_the_run(first, tmp_path / "first", best_checkpoint=True)
    assert report.ok and what.notes == [] and what.missing == []
    assert json.loads((tmp_path / "first" / "outputs" / "eval" / "report.json").read_text()) == {"tau": 1.1}
    assert (tmp_path / "first" / "outputs" / "checkpoints" / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert (tmp_path / "first" / "outputs" / "checkpoints" / "0" / "model.safetensors").is_file()
    pull_the_run(reused, tmp_path / "reused")
    for rel in ("outputs/eval/report.json", "outputs/checkpoints/best.json", "outputs/export/config.json"):
        assert (tmp_path / "reused" / rel).read_bytes() == (tmp_path / "first" / rel).read_bytes()


def test_a_run_made_before_the_store_brings_the_shared_outputs_and_says_so(tmp_path):
    from harness.run_pull import RunPullRequest, plan

    run_dir = fake_run(tmp_path / "work")
    with PullConnection(LocalTransport()) as c:
        what = plan(c, "box", str(run_dir), RunPullRequest())
    assert what.notes == ["run 20260101-120000-abcdef was made before artifacts were kept per run: its outputs are the shared "
                          "out/, as the newest run of that time left them"]


def fake_run(workdir: Path, run_id: str = "20260101-120000-abcdef", best: str | None = "0") -> Path:
    """A finished run recorded before the store: records and logs under runs/<id>/, what the
    stages made under the pipeline's shared output_dir (here a non-default one, as recorded in
    run.json)."""
    run_dir = workdir / "runs" / run_id
    (run_dir / "train").mkdir(parents=True)
    pipeline = {"output_dir": "out", "stages": {"evaluate": {"output": "reports/k3"}}}
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_id, "workdir": str(workdir), "config": {"pipeline": pipeline}}))
    (run_dir / "train" / "log").write_text("step 1\n")
    (run_dir / "train" / "state.json").write_text("{}")
    ckpts = workdir / "out" / "checkpoints"
    for epoch in (0, 1):
        (ckpts / str(epoch)).mkdir(parents=True)
        (ckpts / str(epoch) / "model.safetensors").write_bytes(os.urandom(1000))
    (ckpts / "metrics.jsonl").write_text('{"step": 1}\n')
    (ckpts / "logs" / "run-a").mkdir(parents=True)  # train's loggers (TensorBoard)
    (ckpts / "logs" / "run-a" / "events.out.tfevents.1").write_bytes(b"tb")
    if best is not None:
        (ckpts / "best.json").write_text(json.dumps({"checkpoint": best, "step": 1, "tau": 3.6}))
    (workdir / "reports" / "k3").mkdir(parents=True)
    for name in ("report.json", "acceptance.png", "training.png"):
        (workdir / "reports" / "k3" / name).write_bytes(b"x")
    (workdir / "out" / "export").mkdir(parents=True)
    (workdir / "out" / "export" / "config.json").write_text("{}")
    (workdir / "out" / "hidden_states").mkdir()
    (workdir / "out" / "hidden_states" / "hs_0.safetensors").write_bytes(b"big")  # never pulled
    return run_dir


def pulled(out_dir: Path) -> list[str]:
    return sorted(str(p.relative_to(out_dir)) for p in out_dir.rglob("*") if p.is_file())


RUN_FILES = ["outputs/checkpoints/best.json", "outputs/checkpoints/logs/run-a/events.out.tfevents.1", "outputs/checkpoints/metrics.jsonl", "outputs/eval/acceptance.png", "outputs/eval/report.json",
             "outputs/eval/training.png", "outputs/export/config.json", "run.json", "train/log", "train/state.json"]


def test_a_run_brings_records_report_plots_export_and_the_checkpoint_asked_for(tmp_path):
    from harness.run_pull import RunPullRequest, plan, pull_run

    run_dir = fake_run(tmp_path / "work")

    def pull_the_run(request: RunPullRequest, dest: Path):
        with PullConnection(LocalTransport()) as c:  # its record, what exists and the bytes over one stream
            return pull_run(c, plan(c, "box", str(run_dir), request), str(dest))

    report = pull_the_run(RunPullRequest(), tmp_path / "plain")
    assert report.ok and pulled(tmp_path / "plain") == RUN_FILES == sorted(report.fetched)
    latest = tmp_path / "latest"
    pull_the_run(RunPullRequest(latest_checkpoint=True), latest)
    assert pulled(latest) == sorted(RUN_FILES + ["outputs/checkpoints/1/model.safetensors"])
    best = tmp_path / "best"
    pull_the_run(RunPullRequest(best_checkpoint=True), best)
    assert pulled(best) == sorted(RUN_FILES + ["outputs/checkpoints/0/model.safetensors"])
    assert (best / "outputs/checkpoints/0/model.safetensors").read_bytes() == (tmp_path / "work/out/checkpoints/0/model.safetensors").read_bytes()


class CountingHost(LocalTransport):
    """Logs each helper started on the host (a remote start: a login shell and a Python) by the
    mode in its request; any other command as `other`."""

    LOG_AND_RUN = RELAY + """
open(sys.argv[1], "a").write(request["mode"] + "\\n")
helper = subprocess.Popen(sys.argv[2:], stdin=subprocess.PIPE, bufsize=0)
""" + RELAY_FEED + """
sys.exit(helper.wait())
"""
    LOG_AND_EXEC = "import os, sys; open(sys.argv[1], 'a').write('other\\n'); os.execvp(sys.argv[2], sys.argv[2:])"

    def __init__(self, log: Path):
        super().__init__()
        self.log = log

    def local_argv(self, argv):
        run = self.LOG_AND_RUN if argv[-2] == "pull_helper.py" else self.LOG_AND_EXEC  # harness.helpers.argv: ..., NAME, SIZE
        return [sys.executable, "-c", run, str(self.log), *super().local_argv(argv)]

    def starts(self) -> list[str]:
        return self.log.read_text().split() if self.log.exists() else []


def test_a_run_pull_is_one_remote_start_whatever_the_run_made(tmp_path):
    from harness.run_pull import RunPullRequest, plan, pull_run

    run_dir = fake_run(tmp_path / "work")
    host = CountingHost(tmp_path / "starts")
    with PullConnection(host) as c:  # the record, which outputs exist, six parts' listings and bytes
        report = pull_run(c, plan(c, "box", str(run_dir), RunPullRequest(latest_checkpoint=True)), str(tmp_path / "dest"))
    # metrics.jsonl is both a part of its own and a record beside the newest checkpoint: fetched once
    assert report.ok and sorted(report.fetched) == sorted(RUN_FILES + ["outputs/checkpoints/1/model.safetensors"]), report
    assert host.starts() == ["send"]
    with PullConnection(host) as c:  # again: all there, so the host hashes them (one more start)
        again = pull_run(c, plan(c, "box", str(run_dir), RunPullRequest()), str(tmp_path / "dest"))
    assert again.ok and sorted(again.identical) == RUN_FILES and again.fetched == []
    assert host.starts() == ["send", "send", "hash"]


def test_a_run_without_a_best_checkpoint_is_one_error_and_a_bad_record_is_refused(tmp_path):
    from harness.errors import UsageError
    from harness.run_pull import RunPullRequest, plan

    run_dir = fake_run(tmp_path / "work", best=None)
    with PullConnection(LocalTransport()) as t:
        ckpts = tmp_path / "work" / "out" / "checkpoints"
        with pytest.raises(UsageError, match=f"^box: the run recorded no best checkpoint \\({ckpts}/best.json not found\\)$"):
            plan(t, "box", str(run_dir), RunPullRequest(best_checkpoint=True))
        for bad in ("../../etc", "0/model.safetensors", ""):
            (ckpts / "best.json").write_text(json.dumps({"checkpoint": bad}))
            with pytest.raises(UsageError, match="not a directory directly under"):
                plan(t, "box", str(run_dir), RunPullRequest(best_checkpoint=True))
        (ckpts / "best.json").write_text(json.dumps({"checkpoint": "7"}))
        with pytest.raises(UsageError, match="names checkpoint '7', which is not in"):
            plan(t, "box", str(run_dir), RunPullRequest(best_checkpoint=True))


@pytest.mark.ssh
def test_cli_pull_of_a_run_id_and_exit_code_on_refusal(harness_config, ssh_host, tmp_path):
    run_id = "20260101-120000-abcdef"
    run_dir = fake_run(harness_config.parent / "work" / "box", run_id)
    out_dir = tmp_path / "out"

    def harness(*args):
        return subprocess.run([sys.executable, "-m", "harness", "--config", str(harness_config), *args], capture_output=True, text=True, env=ssh_host.env(), timeout=120, cwd=tmp_path)

    r = harness("pull", "box", run_id, str(out_dir), "--latest-checkpoint")
    assert r.returncode == 0, r.stderr
    assert pulled(out_dir) == sorted(RUN_FILES + ["outputs/checkpoints/1/model.safetensors"])
    # a progress bar on a terminal; none where no one watches (stderr a pipe), as sync
    assert "━" not in r.stderr and f"{len(RUN_FILES) + 1} fetched" in r.stderr
    code, screen = run_in_pty([sys.executable, "-m", "harness", "--config", str(harness_config), "pull", "box", run_id, str(tmp_path / "on-a-tty")], b"", env=ssh_host.env())
    assert code == 0, screen
    assert "━" in screen and f"{len(RUN_FILES)}/{len(RUN_FILES)} files" in screen, screen
    assert pulled(tmp_path / "on-a-tty") == RUN_FILES
    default = harness("pull", "box", run_id, "--include", "log")
    assert default.returncode == 0, default.stderr
    assert pulled(tmp_path / "runs" / run_id) == ["train/log"]
    (run_dir.parents[1] / "out" / "checkpoints" / "best.json").unlink()
    no_best = harness("pull", "box", "last", str(tmp_path / "b"), "--best-checkpoint")
    assert no_best.returncode == 2
    assert no_best.stderr.strip().splitlines() == [f"harness: error: box: the run recorded no best checkpoint ({run_dir.parents[1]}/out/checkpoints/best.json not found)"]
    os.symlink("/etc/passwd", run_dir / "evil")
    refused = harness("pull", "box", run_id, str(out_dir))
    assert refused.returncode == 1 and "refused evil" in refused.stderr


@pytest.mark.ssh
@pytest.mark.pipeline
@pytest.mark.slow
def test_pull_of_a_real_training_run_brings_a_checkpoint_that_loads(tmp_path, ssh_host, tiny_verifier, prepared_data, hidden_states):
    """`harness run box train` really trains (runtime host, over the test sshd); then
    `harness pull box last --latest-checkpoint` brings its checkpoint, and speculators loads it."""
    import shutil

    from tests.fixtures.job_project import run_artifact, toml_value
    from tests.fixtures.pipeline_data import load_checkpoint

    shutil.copytree(REPO / "remote_scripts", tmp_path / "remote_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    workdir = tmp_path / "work"
    train = {"prepared": str(prepared_data), "hidden_states": str(hidden_states), "total_seq_len": 256, "threads": 1, "epochs": 1, "max_steps": 3,
             "loggers": ["tensorboard"]}
    lines = ["[hosts.box]", f'ssh = "{ssh_host.alias}"', f"workdir = {toml_value(str(workdir))}", f"python = {toml_value(sys.executable)}",
             "[sync]", 'paths = ["remote_scripts"]', "[pipeline]", f"verifier = {toml_value(str(tiny_verifier.verifier))}", "[pipeline.stages.train]"]
    lines += [f"{k} = {toml_value(v)}" for k, v in train.items()]
    config = tmp_path / "harness.toml"
    config.write_text("\n".join(lines) + "\n")

    def harness(*args):
        return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args], capture_output=True, text=True, env=ssh_host.env(), timeout=900, cwd=tmp_path)

    assert harness("sync", "box").returncode == 0
    run = harness("run", "box", "train")
    assert run.returncode == 0, run.stderr[-3000:]
    r = harness("pull", "box", "last", str(tmp_path / "pulled"), "--latest-checkpoint")
    assert r.returncode == 0, r.stderr
    assert "absent  outputs/eval: the run has not made it" in r.stderr  # no evaluate stage in this run
    ckpt = tmp_path / "pulled" / "outputs" / "checkpoints" / "0"
    run_id = run.stdout.splitlines()[0]
    assert sha(ckpt / "model.safetensors") == sha(run_artifact(workdir, run_id, "train") / "0" / "model.safetensors")
    assert load_checkpoint(ckpt, tiny_verifier.verifier)["forward_ok"] is True
    # the config's loggers reached the stage, and the pull brought their directory
    assert list((tmp_path / "pulled" / "outputs" / "checkpoints" / "logs").glob("*/events.out.tfevents.*"))

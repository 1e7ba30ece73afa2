"""One run across several hosts: torchrun multi-node launches on network-namespace hosts.

The hosts n0, n1, n2 (tests/fixtures/netns.py) each have their own network stack, address and
sshd. The job is remote_scripts/dist_check.py: real torch.distributed (Gloo on CPU) all_reduce
and DDP steps that check their own results, launched by the harness through node_launcher.py
(torchrun --nnodes 3 --rdzv-backend c10d ...). Then: kill a node, cut a node's link with no
laptop watching, cancel, and time a parallel sync.

The unit tests at the bottom need none of that.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WATCHDOG_S = 12.0  # [groups.cluster] watchdog_timeout in these tests
GRACE_S = 6.0
RANK_MARKERS = ("dist_check.py", "torch.distributed.run", "node_launcher.py")



# ---------------------------------------------------------------------------------------------
# Fixtures and helpers


@pytest.fixture
def cluster_project(tmp_path, netns_cluster, monkeypatch):
    """A project (remote_scripts/ + harness.toml for n0..n2 and group `cluster`), synced to
    every host; the harness in this process talks to the namespace sshds only."""
    from tests.fixtures.netns import ensure_nodes_up, write_cluster_config

    ensure_nodes_up(netns_cluster)
    shutil.copytree(REPO / "remote_scripts", tmp_path / "remote_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    config_path = write_cluster_config(
        tmp_path, netns_cluster,
        group_extra=f"watchdog_timeout = {WATCHDOG_S}\nnproc_per_node = 1\n",
        extra='[sync]\npaths = ["remote_scripts"]\n\n[pipeline.stages.dist_check]\nsteps = 400\nstep_seconds = 0.25\ntimeout = 300\n',
    )
    for key, value in netns_cluster.env().items():
        if key.startswith("HARNESS_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")  # passed through to every rank by the harness
    from harness.config import load_config
    from harness.multinode import open_all, sync_hosts
    from harness.transport import connect

    config = load_config(config_path)
    transports = open_all(lambda h: connect(config.host(h)), config.groups["cluster"].hosts)
    for host, _, error in sync_hosts(config, transports, ["remote_scripts"]):
        assert error is None, f"{host}: {error}"
    for t in transports.values():
        t.close()
    return config


def group_run(config):
    from harness.multinode import GroupRun
    from harness.transport import connect

    return GroupRun(config, "cluster", lambda h: connect(config.host(h)))


def rank_processes(node) -> list[str]:
    """Command lines of torchrun / rank / launcher processes still alive in a node's namespace."""
    out = []
    for pid in node.pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][:1]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(m in cmd for m in RANK_MARKERS):
            out.append(f"{pid}: {cmd[:160]}")
    return out


def wait_for_training(runner, run_id: str, timeout: float = 240) -> None:
    """Until every node reports DDP steps (the rendezvous is done and ranks are training)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = runner.status(run_id)
        steps = []
        for node in status.nodes:
            ev = node.status.stages[0].last_event if node.status and node.status.stages else None
            steps.append(ev.get("step", 0) if ev and ev.get("event") in ("progress", "metric") else 0)
            assert node.state in ("running", "starting", "unreachable"), f"{node.host}: {node.state} {node.failure()}"
        if all(s >= 2 for s in steps):
            return
        time.sleep(1)
    raise AssertionError(f"ranks did not start training within {timeout} s")


def wait_until(predicate, timeout: float, poll: float = 0.5) -> float:
    """Seconds until predicate() was true; fails after timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(poll)
    raise AssertionError(f"condition not met within {timeout} s")


# ---------------------------------------------------------------------------------------------
# A run across three hosts


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
def test_one_run_across_three_hosts(cluster_project, netns_cluster):
    """A real 3-node DDP job: one run id, a run directory per node, merged logs, checked results."""
    from harness.multinode import GroupRun

    config = cluster_project
    path = config.path.parent / "harness.toml"
    path.write_text(path.read_text().replace("steps = 400", "steps = 6").replace("step_seconds = 0.25", "step_seconds = 0.0"))
    from harness.config import load_config

    config = load_config(path)
    runner = group_run(config)
    launch = runner.start(["dist_check"], grace_s=GRACE_S)
    lines: list[tuple[str, str]] = []
    lock = threading.Lock()

    def collect(host: str, line: bytes) -> None:
        with lock:
            lines.append((host, line.decode(errors="replace")))

    threads = runner.follow(launch.run_id, collect, follow=True)
    status = runner.watch(launch.run_id, timeout=300)
    for t in threads:
        t.join(30)
    assert status.state == "ok", [(n.host, n.state, n.failure()) for n in status.nodes]
    assert status.first_failure is None
    # every node ran its rank of the same world, each in its own run directory
    for i, node in enumerate(netns_cluster.nodes):
        run_dir = node.workdir / "runs" / launch.run_id
        record = __import__("json").loads((run_dir / "run.json").read_text())
        assert record["group"]["node_rank"] == i and record["group"]["nnodes"] == 3
        assert record["group"]["endpoint"] == f"{netns_cluster.nodes[0].address}:{launch.rdzv_port}"
        assert "GLOO_SOCKET_IFNAME" in record["group"]["env_names"] and "eth0" not in (run_dir / "run.json").read_text()
        log = (run_dir / "dist_check" / "log").read_text()
        assert f"rank {i}/3" in log and "all checks passed" in log, log[-2000:]
        assert f"--rdzv-id {launch.run_id}" in log and "--nnodes 3" in log
    # the merged view has every node's lines, each with its node's prefix
    by_host = {h: "".join(text for hh, text in lines if hh == h) for h in runner.hosts}
    for i, h in enumerate(runner.hosts):
        assert f"rank {i}/3 on" in by_host[h] and "all checks passed" in by_host[h], by_host[h][-1500:]
    # nothing is left running anywhere
    for node in netns_cluster.nodes:
        assert rank_processes(node) == []


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
def test_killed_node_stops_the_others_and_is_named(cluster_project, netns_cluster):
    """n1 dies mid-training (every process in its namespace, sshd included). The attached
    watcher names n1 as the failure and every other node stops within the bound."""
    runner = group_run(cluster_project)
    launch = runner.start(["dist_check"], grace_s=GRACE_S)
    wait_for_training(runner, launch.run_id)
    victim = netns_cluster.node("n1")
    killed_at = time.monotonic()
    assert victim.kill()
    status = runner.watch(launch.run_id, grace_s=GRACE_S, unreachable_s=8, timeout=180)
    stopped_after = time.monotonic() - killed_at
    assert status.first_failure and status.first_failure.startswith("n1: unreachable"), status.first_failure
    others = [n for n in status.nodes if n.host != "n1"]
    assert all(n.final and n.state in ("failed", "cancelled") for n in others), [(n.host, n.state) for n in others]
    # bound: the watcher gives a silent node unreachable_s, then cancels with GRACE_S
    assert stopped_after < 8 + GRACE_S + 30, stopped_after
    for node in netns_cluster.nodes:
        if node.name != "n1":
            assert rank_processes(node) == [], f"{node.name} still runs ranks"
    print(f"killed n1: others stopped after {stopped_after:.1f} s; first failure: {status.first_failure}")


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
def test_partitioned_node_stops_everything_without_a_laptop(cluster_project, netns_cluster):
    """No watcher at all (the laptop is closed). n2's link is cut mid-training: no connection
    reset reaches anyone, so the collectives would hang for their full timeout (300 s here).
    The per-node watchdogs stop n0 and n1 (peer silent) and n2 itself (store lost) within
    watchdog_timeout + grace + a few heartbeats."""
    runner = group_run(cluster_project)
    launch = runner.start(["dist_check"], grace_s=GRACE_S)
    wait_for_training(runner, launch.run_id)
    n2 = netns_cluster.node("n2")
    cut_at = time.monotonic()
    n2.cut_link()
    bound = WATCHDOG_S + GRACE_S + 20
    survivors = [n for n in netns_cluster.nodes if n.name != "n2"]
    stopped = wait_until(lambda: all(not rank_processes(n) for n in survivors), timeout=bound + 30)
    assert stopped < bound, stopped
    for host in ("n0", "n1"):
        st = runner.node_status(host, launch.run_id)
        assert st.state == "failed", (host, st.state)
        assert "silent" in (st.failure() or "") or "stopped" in (st.failure() or ""), st.failure()
    # n2, cut off from everyone, stopped its own ranks too (it lost node 0's store)
    n2_stopped = wait_until(lambda: not rank_processes(n2), timeout=bound + 30)
    assert time.monotonic() - cut_at < 2 * bound
    print(f"partition: n0/n1 stopped after {stopped:.1f} s, n2 after {time.monotonic() - cut_at:.1f} s (checked {n2_stopped:.1f})")


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
def test_cancel_stops_every_node(cluster_project, netns_cluster):
    runner = group_run(cluster_project)
    launch = runner.start(["dist_check"], grace_s=GRACE_S)
    wait_for_training(runner, launch.run_id)
    started = time.monotonic()
    states = runner.cancel(launch.run_id)
    took = time.monotonic() - started
    assert set(states) == {"n0", "n1", "n2"}
    assert all(s == "cancelled" for s in states.values()), states
    assert took < GRACE_S + 30
    status = runner.status(launch.run_id)
    assert [n.state for n in status.nodes] == ["cancelled"] * 3
    for node in netns_cluster.nodes:
        assert rank_processes(node) == [], f"{node.name} still runs ranks"


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
def test_parallel_sync_to_three_hosts_costs_about_one(tmp_path, netns_cluster, monkeypatch, request):
    from harness.config import load_config
    from harness.multinode import open_all, sync_hosts
    from harness.sync import prepare_sync
    from harness.transport import connect
    from tests.fixtures.netns import ensure_nodes_up, write_cluster_config

    ensure_nodes_up(netns_cluster)
    for key, value in netns_cluster.env().items():
        if key.startswith("HARNESS_"):
            monkeypatch.setenv(key, value)
    payload = tmp_path / "data"
    payload.mkdir()
    for i in range(12):
        (payload / f"blob{i}.bin").write_bytes(os.urandom(2 << 20))  # 24 MiB that cannot compress
    # Each host behind its own 100 Mbit/s link, as GPU hosts are from a laptop: a sync costs
    # link time (about 2 s here), not this machine's (2 shared) cores.
    for node in netns_cluster.nodes:
        node.limit_bandwidth("100mbit")
    request.addfinalizer(lambda: [n.limit_bandwidth("") for n in netns_cluster.nodes])
    config = load_config(write_cluster_config(tmp_path, netns_cluster, extra='[sync]\npaths = ["data"]\n'))
    transports = open_all(lambda h: connect(config.host(h)), config.groups["cluster"].hosts)
    prepare_sync(transports["n0"], config.root, ["data"], "/nonexistent-warmup")  # hash once (cached)

    def timed(hosts: list[str], tag: str) -> float:
        workdirs = {h: str(tmp_path / f"{tag}-{h}") for h in hosts}
        started = time.monotonic()
        outcome = sync_hosts(config, {h: transports[h] for h in hosts}, ["data"], workdirs=workdirs)
        took = time.monotonic() - started
        for h, result, error in outcome:
            assert error is None, f"{h}: {error}"
            assert result.files_sent == 12 and (tmp_path / f"{tag}-{h}" / "data" / "blob11.bin").stat().st_size == 2 << 20
        return took

    one = min(timed(["n0"], "one-a"), timed(["n1"], "one-b"))
    three = timed(["n0", "n1", "n2"], "three")
    print(f"sync 24 MiB over 100 Mbit/s links: one host {one:.2f} s, three hosts in parallel {three:.2f} s")
    assert three < 2 * one, (one, three)


# ---------------------------------------------------------------------------------------------
# Pure logic (no namespaces)


def test_stages_for_node():
    from harness.multinode import stages_for_node

    chain = ["prepare", "extract", "train", "evaluate", "export"]
    assert stages_for_node(chain, 0) == chain
    assert stages_for_node(chain, 2) == ["prepare", "extract", "train"]
    assert stages_for_node(["prepare"], 1) == ["prepare"]
    assert stages_for_node(["dist_check"], 1) == ["dist_check"]


def test_distributed_env_passes_only_the_collectives_settings():
    from harness.multinode import distributed_env

    env = {"NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
           "HF_TOKEN": "secret", "PATH": "/bin", "MASTER_ADDR_X": "no"}
    assert distributed_env(env) == {"NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_line_prefixer_keeps_lines_whole():
    from harness.multinode import LinePrefixer

    out = []
    p = LinePrefixer("n1", lambda h, line: out.append((h, line)))
    p.feed(b"ab")
    p.feed(b"c\nde")
    p.feed(b"f\n")
    p.feed(b"tail")
    p.flush()
    assert out == [("n1", b"abc\n"), ("n1", b"def\n"), ("n1", b"tail\n")]


def test_node_command_runs_torchrun_through_the_launcher(tmp_path):
    from harness.config import parse_config
    from harness.multinode import GroupLaunch, NodeJobs
    from harness.transport.local import LocalTransport

    config = parse_config({"hosts": {"a": {"local": True, "workdir": str(tmp_path / "a")}, "b": {"local": True, "workdir": str(tmp_path / "b")}},
                           "groups": {"g": {"hosts": ["a", "b"]}}}, tmp_path / "harness.toml")
    launch = GroupLaunch("g", ("a", "b"), "20260101-000000-abcdef", "10.0.0.1", 29555, 2, 30.0, 10.0)
    jobs = NodeJobs(config, config.host("b"), LocalTransport("b"), launch, 1)
    argv = jobs.stage_command("train", "/x/events.jsonl", nproc=8)
    assert argv[1] == "remote_scripts/node_launcher.py"
    joined = " ".join(argv)
    for part in ("--node-rank 1", "--nnodes 2", "--nproc-per-node 2", "--endpoint 10.0.0.1:29555", "--run-id 20260101-000000-abcdef", "--node-names a,b"):
        assert part in joined
    assert argv[argv.index("--") + 1] == "remote_scripts/train_draft.py"
    assert jobs.stage_command("evaluate", "/x/e", nproc=8)[1] == "remote_scripts/evaluate.py"  # plain stages: no torchrun


def test_origin_prefers_a_silent_node_over_the_peers_it_broke():
    from harness.jobs import RunStatus, StageStatus
    from harness.multinode import GroupStatus, NodeStatus

    def failed(host, rank, finished, error):
        st = RunStatus("r", "failed", [StageStatus("dist_check", "failed", 1.0, finished, 1, {"event": "finished", "error": error})])
        return NodeStatus(host, rank, st)

    nodes = [failed("n0", 0, 10.0, "RuntimeError: connection reset"), NodeStatus("n1", 1, None, "connection lost", since=5.0), failed("n2", 2, 9.0, "stopped: n1 silent")]
    assert GroupStatus("g", "r", nodes).origin().host == "n1"
    nodes[1] = failed("n1", 1, 11.0, "CHECK FAILED")
    # without a silent node: the earliest failure that was not a watchdog stop
    assert GroupStatus("g", "r", nodes).origin().host == "n0"

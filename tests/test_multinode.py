"""One run across several hosts: torchrun multi-node launches on network-namespace hosts.

The hosts n0, n1, n2 (tests/fixtures/netns.py) each have their own network stack, address and
sshd. The job is remote_scripts/dist_check.py: real torch.distributed (Gloo on CPU) all_reduce
and DDP steps that check their own results, launched by the harness through node_launcher.py
(torchrun --nnodes 3 --rdzv-backend static ...). Then: kill a node, cut a node's link with no
laptop watching, cancel, and sync to every host at once.

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

from tests.fixtures.job_project import run_artifact

REPO = Path(__file__).resolve().parents[1]
WATCHDOG_S = 12.0  # [groups.cluster] watchdog_timeout in these tests
GRACE_S = 6.0
COLLECTIVE_TIMEOUT_S = 300  # dist_check's collectives: how long the ranks would hang without a watchdog
# A stop must come from the watchdogs, not from the collectives timing out. The design bound is
# WATCHDOG_S + GRACE_S + a few heartbeats (~38 s; printed by each test); on a loaded 2-core CI
# machine it was once 80 s, so the assertion is "well before the hang", not the design bound.
STOPPED_WELL_BEFORE_HANG_S = COLLECTIVE_TIMEOUT_S / 2
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
        extra=f'[sync]\npaths = ["remote_scripts"]\n\n[pipeline.stages.dist_check]\nsteps = 400\nstep_seconds = 0.25\ntimeout = {COLLECTIVE_TIMEOUT_S}\n'
              # extract reads the prepared data each host was given (by path: an input from outside the store)
              '\n[pipeline.stages.extract]\nprepared = "outputs/prepared"\n',
    )
    for key, value in netns_cluster.env().items():
        if key.startswith("HARNESS_"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")  # passed through to every rank by the harness
    from harness.config import load_config
    from harness.fanout import open_all
    from harness.sync import sync_hosts
    from harness.transport import connect

    config = load_config(config_path)
    transports = open_all(lambda h: connect(config.host(h)), config.groups["cluster"].hosts)
    for host, _, error in sync_hosts(config, transports, ["remote_scripts"]):
        assert error is None, f"{host}: {error}"
    for t in transports.values():
        t.close()
    return config


def group_run(config):
    from harness.group import Group
    from harness.transport import connect

    return Group(config, "cluster", lambda h: connect(config.host(h))).jobs


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


class MergedLines:
    """An AttachView (harness.runs) that hands each node's log line to `collect(host, line)`."""

    def __init__(self, collect):
        self.node_line = collect

    def events(self, chunk: bytes) -> None:
        raise AssertionError("a group run feeds node lines, not a host's events")

    def note(self, text: str) -> None:
        pass


# ---------------------------------------------------------------------------------------------
# A run across three hosts


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
def test_one_run_across_three_hosts(cluster_project, netns_cluster):
    """A real 3-node DDP job: one run id, a run directory per node, merged logs, checked results."""
    config = cluster_project
    path = config.path.parent / "harness.toml"
    path.write_text(path.read_text().replace("steps = 400", "steps = 6").replace("step_seconds = 0.25", "step_seconds = 0.0"))
    from harness.config import load_config

    config = load_config(path)
    runner = group_run(config)
    launch = runner.launch(["dist_check"], grace_s=GRACE_S)
    lines: list[tuple[str, str]] = []
    lock = threading.Lock()

    def collect(host: str, line: bytes) -> None:
        with lock:
            lines.append((host, line.decode(errors="replace")))

    status = runner.attach(launch.run_id, MergedLines(collect))
    assert status.state == "ok", [(n.host, n.state, n.failure()) for n in status.nodes]
    assert status.first_failure is None
    # every node ran its rank of the same world, each in its own run directory
    for i, node in enumerate(netns_cluster.nodes):
        run_dir = node.workdir / "runs" / launch.run_id
        record = __import__("json").loads((run_dir / "run.json").read_text())
        assert record["group"]["node_rank"] == i and record["group"]["nnodes"] == 3
        assert record["group"]["endpoint"] == f"{netns_cluster.nodes[0].address}:{record['group']['rdzv_port']}"
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
    """n1 dies mid-training (every process in its namespace, sshd included). Every other node
    stops within the bound and the attached watcher names n1 as the failure."""
    runner = group_run(cluster_project)
    launch = runner.launch(["dist_check"], grace_s=GRACE_S)
    wait_for_training(runner, launch.run_id)
    victim = netns_cluster.node("n1")
    killed_at = time.monotonic()
    assert victim.kill()
    status = runner.watch(launch.run_id, grace_s=GRACE_S, unreachable_s=8, timeout=180)
    stopped_after = time.monotonic() - killed_at
    assert status.first_failure and status.first_failure.startswith("n1: unreachable"), status.first_failure
    others = [n for n in status.nodes if n.host != "n1"]
    assert all(n.final and n.state in ("failed", "cancelled") for n in others), [(n.host, n.state) for n in others]
    # the ranks' collectives fail at once (connection reset); at worst the watchdogs notice the
    # silent peer after WATCHDOG_S and stop within GRACE_S
    assert stopped_after < STOPPED_WELL_BEFORE_HANG_S, stopped_after
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
    launch = runner.launch(["dist_check"], grace_s=GRACE_S)
    wait_for_training(runner, launch.run_id)
    n2 = netns_cluster.node("n2")
    cut_at = time.monotonic()
    n2.cut_link()
    bound = STOPPED_WELL_BEFORE_HANG_S
    survivors = [n for n in netns_cluster.nodes if n.name != "n2"]
    stopped = wait_until(lambda: all(not rank_processes(n) for n in survivors), timeout=bound)
    for host in ("n0", "n1"):
        # its supervisor records the outcome a poll after the ranks ended
        st = runner.jobs(host).wait(launch.run_id, timeout=30)
        failure = runner.node_status(host, launch.run_id).failure() or ""
        assert st.state == "failed", (host, st.state)
        assert "silent" in failure or "stopped" in failure, failure
    # n2, cut off from everyone, stopped its own ranks too (it lost node 0's store)
    n2_stopped = wait_until(lambda: not rank_processes(n2), timeout=bound)
    print(f"partition: n0/n1 stopped after {stopped:.1f} s, n2 after {time.monotonic() - cut_at:.1f} s (checked {n2_stopped:.1f})")


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
def test_cancel_stops_every_node(cluster_project, netns_cluster):
    runner = group_run(cluster_project)
    launch = runner.launch(["dist_check"], grace_s=GRACE_S)
    wait_for_training(runner, launch.run_id)
    started = time.monotonic()
    states = runner.cancel_run(launch.run_id).states
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
def test_cancelling_one_node_stops_the_others_without_a_laptop(cluster_project, netns_cluster):
    """`harness cancel n1 RUN` (one host only, nobody watching): n1's watchdog posts
    `cancelled` and the other nodes' watchdogs stop their ranks within a few heartbeats."""
    runner = group_run(cluster_project)
    launch = runner.launch(["dist_check"], grace_s=GRACE_S)
    wait_for_training(runner, launch.run_id)
    started = time.monotonic()
    assert runner.jobs("n1").cancel_run(launch.run_id).states == {"n1": "cancelled"}
    survivors = [n for n in netns_cluster.nodes if n.name != "n1"]
    took = wait_until(lambda: all(not rank_processes(n) for n in survivors), timeout=60)
    assert took < GRACE_S + 20, took
    status = runner.status(launch.run_id)
    states = {n.host: (n.state, n.failure()) for n in status.nodes}
    assert states["n1"][0] == "cancelled"
    for host in ("n0", "n2"):
        st = runner.jobs(host).wait(launch.run_id, timeout=60)
        failure = runner.node_status(host, launch.run_id).failure() or ""
        assert st.state == "failed" and "n1 (node 1) cancelled" in failure, (host, st.state, failure)
    assert status.origin().host == "n1"
    print(f"cancel n1 alone: n0/n2 stopped {started and took:.1f} s later")


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
def test_sync_to_three_hosts_at_once(tmp_path, netns_cluster, monkeypatch):
    """sync_hosts (what `harness sync GROUP` runs) brings every file to every host. What running
    them in parallel saves is timed by bench/parallel_sync.py, not here."""
    from harness.config import load_config
    from harness.fanout import open_all
    from harness.sync import sync_hosts
    from harness.transport import connect
    from tests.fixtures.netns import ensure_nodes_up, write_cluster_config

    ensure_nodes_up(netns_cluster)
    for key, value in netns_cluster.env().items():
        if key.startswith("HARNESS_"):
            monkeypatch.setenv(key, value)
    payload = tmp_path / "data"
    payload.mkdir()
    for i in range(12):
        (payload / f"blob{i}.bin").write_bytes(os.urandom(256 << 10))
    config = load_config(write_cluster_config(tmp_path, netns_cluster, extra='[sync]\npaths = ["data"]\n'))
    hosts = config.groups["cluster"].hosts
    transports = open_all(lambda h: connect(config.host(h)), hosts)
    try:
        outcome = sync_hosts(config, transports, ["data"], workdirs={h: str(tmp_path / f"to-{h}") for h in hosts})
    finally:
        for t in transports.values():
            t.close()
    assert sorted(h for h, _, _ in outcome) == sorted(hosts)
    for h, result, error in outcome:
        assert error is None, f"{h}: {error}"
        assert result.files_sent == 12
        for i in range(12):
            assert (tmp_path / f"to-{h}" / "data" / f"blob{i}.bin").read_bytes() == (payload / f"blob{i}.bin").read_bytes()


def local_pair(tmp_path, monkeypatch, dist_check_options: str, fake_prepare: bool = False):
    """Two `local = true` hosts (distinct workdirs) as the group `pair`, synced: a runner.
    fake_prepare: prepare_data.py is the job tests' fake stage (its options are checked at
    config load against the script beside the config: the fake's)."""
    from harness.config import load_config
    from harness.fanout import open_all
    from harness.group import Group
    from harness.sync import sync_hosts
    from harness.transport import connect
    from tests.fixtures.job_project import FAKE_STAGE

    shutil.copytree(REPO / "remote_scripts", tmp_path / "remote_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    if fake_prepare:
        (tmp_path / "remote_scripts" / "prepare_data.py").write_text(FAKE_STAGE)
    (tmp_path / "harness.toml").write_text(
        "".join(f'[hosts.l{i}]\nlocal = true\nworkdir = "{tmp_path}/work/l{i}"\npython = "{sys.executable}"\n\n' for i in range(2))
        + '[groups.pair]\nhosts = ["l0", "l1"]\nrdzv_port = 0\nnproc_per_node = 1\n\n[sync]\npaths = ["remote_scripts"]\n\n'
        + f"[pipeline.stages.dist_check]\n{dist_check_options}\n"
    )
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    config = load_config(tmp_path / "harness.toml")
    transports = open_all(lambda h: connect(config.host(h)), ["l0", "l1"])
    assert all(error is None for _, _, error in sync_hosts(config, transports, ["remote_scripts"]))
    return Group(config, "pair", lambda h: transports[h]).jobs


@pytest.mark.slow
def test_group_of_local_hosts_runs_without_root(tmp_path, monkeypatch):
    """The same launch path with no namespaces or sshd: two `local = true` hosts as two nodes
    on loopback, as on one GPU box split into two nodes."""
    runner = local_pair(tmp_path, monkeypatch, "steps = 3")
    launch = runner.launch(["dist_check"], grace_s=GRACE_S)
    status = runner.watch(launch.run_id, timeout=300)
    group = runner.jobs("l0").status(launch.run_id).record["group"]
    assert group["rdzv_host"] == "127.0.0.1" and group["rdzv_port"] > 0  # rdzv_port = 0: chosen free on host 0
    assert status.state == "ok", [(n.host, n.state, n.failure()) for n in status.nodes]
    for i in range(2):
        log = (tmp_path / "work" / f"l{i}" / "runs" / launch.run_id / "dist_check" / "log").read_text()
        assert f"rank {i}/2" in log and "all checks passed" in log



@pytest.mark.slow
def test_a_group_run_does_not_queue_and_later_runs_queue_behind_it(tmp_path, monkeypatch):
    """A host run holds l0's GPUs; a group run over l0 and l1 still starts at once on both (a
    waiting node would stall the others' rendezvous): its ranks train beside that run. A later
    host run on l1 is queued behind the group's node and starts once the group run is cancelled.
    The host runs are the job tests' fake stage (tests/fixtures/job_project.py): only the queue
    matters here."""
    runner = local_pair(tmp_path, monkeypatch, "steps = 400\nstep_seconds = 0.25\ntimeout = 300\n\n"
                                               "[pipeline.stages.prepare]\nlines = 200\nsleep = 200\n", fake_prepare=True)
    l0, l1 = runner.jobs("l0"), runner.jobs("l1")
    ahead = l0.launch(["prepare"], grace_s=GRACE_S).run_id
    wait_until(lambda: l0.status(ahead).state == "running", timeout=90)
    launch = runner.launch(["dist_check"], grace_s=GRACE_S)
    later = None
    try:
        wait_for_training(runner, launch.run_id)  # both nodes' ranks train: l0's node did not wait
        assert l0.status(ahead).state == "running"
        later = l1.launch(["prepare"], grace_s=GRACE_S).run_id
        status = l1.status(later)
        assert (status.state, status.queue_place) == ("queued", 1)  # behind the group run's node
        assert set(runner.cancel_run(launch.run_id).states.values()) == {"cancelled"}
        wait_until(lambda: l1.status(later).state == "running", timeout=90)
    finally:
        for jobs, run_id in ((l1, later), (l0, ahead)):
            if run_id:
                jobs.cancel_run(run_id, grace_s=1)
        runner.cancel_run(launch.run_id)

@pytest.mark.slow
def test_a_failed_rank_is_named_in_the_group_status(tmp_path, monkeypatch):
    """torchrun exits 1 whatever went wrong; the node's status line carries the cause it printed
    (the rank, its exit code and its last words), so nobody has to dig through the logs."""
    runner = local_pair(tmp_path, monkeypatch, "steps = 3\nfail_rank = 1\nfail_step = 2")
    launch = runner.launch(["dist_check"], grace_s=GRACE_S)
    status = runner.watch(launch.run_id, timeout=300)
    lines = [(n.host, n.state, n.failure()) for n in status.nodes]
    # Rank 1 is on l1 (the static rendezvous follows the node order), and l1 is named as where it
    # went wrong, although l0's rank failed too (its collective lost rank 1) at about the same time.
    assert status.state == "failed" and status.origin().host == "l1", lines
    failure = status.origin().failure() or ""
    assert "torchrun exit code 1: rank 1 (local_rank: 0): exit code 1" in failure, failure
    assert "rank 1 fails at step 2 as asked (--fail-rank)" in failure, failure  # the rank's last words
    assert " after " not in failure, failure
    verdict = status.origin().status.stages[0].last_event
    assert verdict["event"] == "finished" and verdict["cause"] == "own", verdict  # its verdict says: its own failure
    # l0 names l1 as the cause: its watchdog stopped it ("stopped: l1 ..."), or its rank failed
    # first ("... after l1 ..."); or the laptop's watcher cancelled it before either.
    l0 = status.nodes[0]
    assert l0.state == "cancelled" or "l1 (node 1) failed (torchrun exit code 1: rank 1" in (l0.failure() or ""), lines
    log = (tmp_path / "work" / "l1" / "runs" / launch.run_id / "dist_check" / "log").read_text()
    assert "Root Cause (first observed failure)" in log  # torchrun's stderr still reaches the log


# ---------------------------------------------------------------------------------------------
# Pure logic (no namespaces)


def test_stages_for_node():
    from harness.group_node import stages_for_node

    chain = ["prepare", "extract", "train", "evaluate", "export"]
    assert stages_for_node(chain, 0) == chain
    assert stages_for_node(chain, 2) == ["prepare", "extract", "train"]
    assert stages_for_node(["prepare"], 1) == ["prepare"]
    assert stages_for_node(["dist_check"], 1) == ["dist_check"]


def test_distributed_env_passes_only_the_collectives_settings():
    from harness.group_node import distributed_env

    env = {"NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
           "HF_TOKEN": "secret", "PATH": "/bin", "MASTER_ADDR_X": "no"}
    assert distributed_env(env) == {"NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth1", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}


def test_line_prefixer_keeps_lines_whole():
    from harness.fanout import LinePrefixer

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
    from harness.host import Host
    from harness.group_node import GroupLaunch, GroupNode
    from harness.transport.local import LocalTransport

    config = parse_config({"hosts": {"a": {"local": True, "workdir": str(tmp_path / "a")}, "b": {"local": True, "workdir": str(tmp_path / "b")}},
                           "groups": {"g": {"hosts": ["a", "b"]}}}, tmp_path / "harness.toml")
    launch = GroupLaunch("g", ("a", "b"), "20260101-000000-abcdef", "10.0.0.1", 29555, 2, 30.0, 10.0)
    jobs = Host(config, config.host("b"), LocalTransport).jobs_with(node=GroupNode(launch, 1))
    argv = jobs.stage_command("train", "/x/events.jsonl", nproc=8)
    assert argv[1] == "remote_scripts/node_launcher.py"
    joined = " ".join(argv)
    for part in ("--node-rank 1", "--nnodes 2", "--nproc-per-node 2", "--endpoint 10.0.0.1:29555", "--run-id 20260101-000000-abcdef", "--node-names a,b"):
        assert part in joined
    assert argv[argv.index("--") + 1] == "remote_scripts/train_draft.py"
    assert jobs.stage_command("evaluate", "/x/e", nproc=8)[1] == "remote_scripts/evaluate.py"  # plain stages: no torchrun


def test_docker_nodes_run_distributed_stages_on_the_host_network(tmp_path):
    """In containers, the rendezvous, the watchdog's store and NCCL/Gloo must listen on the host's
    own addresses, which the other hosts reach: distributed stages get --network=host, plain ones
    keep Docker's default."""
    from harness.config import parse_config
    from harness.host import Host
    from harness.group_node import GroupLaunch, GroupNode
    from harness.transport.local import LocalTransport

    hosts = {h: {"local": True, "workdir": str(tmp_path / h), "runtime": "docker"} for h in ("a", "b")}
    config = parse_config({"hosts": hosts, "groups": {"g": {"hosts": ["a", "b"]}}}, tmp_path / "harness.toml")
    launch = GroupLaunch("g", ("a", "b"), "20260101-000000-abcdef", "10.0.0.1", 29555, 1, 30.0, 10.0)
    jobs = Host(config, config.host("a"), LocalTransport).jobs_with(node=GroupNode(launch, 0))
    run_dir = str(tmp_path / "a" / "runs" / launch.run_id)
    train = jobs._stage_spec(launch.run_id, "train", f"{run_dir}/train", jobs.stage_command("train", f"{run_dir}/train/events.jsonl", nproc=1))
    assert train["kind"] == "docker" and train["argv"][:3] == ["docker", "create", "--network=host"]
    assert "remote_scripts/node_launcher.py" in train["argv"]
    evaluate = jobs._stage_spec(launch.run_id, "evaluate", f"{run_dir}/evaluate", jobs.stage_command("evaluate", f"{run_dir}/evaluate/events.jsonl", nproc=1))
    assert evaluate["argv"][:2] == ["docker", "create"] and "--network=host" not in evaluate["argv"]


def test_origin_prefers_a_silent_node_over_the_peers_it_broke():
    """The node where it went wrong, from each node's verdict: its `finished` event's cause
    (docs/events.json), never the wording of its error."""
    from harness.jobs import RunStatus, StageStatus
    from harness.multinode import GroupStatus, NodeStatus

    def failed(host, rank, finished, error, cause="own"):
        st = RunStatus("r", "failed", [StageStatus("dist_check", "failed", 1.0, finished, 1, {"event": "finished", "status": "failed", "error": error, "cause": cause, "stage": "dist_check", "t": finished})])
        return NodeStatus(host, rank, st)

    nodes = [failed("n0", 0, 10.0, "RuntimeError: connection reset"), NodeStatus("n1", 1, None, "connection lost", since=5.0), failed("n2", 2, 9.0, "stopped: n1 silent", "peer")]
    assert GroupStatus("g", "r", nodes).origin().host == "n1"
    nodes[1] = failed("n1", 1, 11.0, "CHECK FAILED")
    # without a silent node: the earliest failure that was not a peer's
    assert GroupStatus("g", "r", nodes).origin().host == "n0"
    # a node whose ranks died after a peer's cancel points at that peer, even if it ended first
    nodes = [failed("n0", 0, 3.0, "failed (torchrun exit code 1) after n1 (node 1) cancelled", "peer"), failed("n1", 1, 4.0, "cancelled", "cancelled")]
    assert GroupStatus("g", "r", nodes).origin().host == "n1"
    # the cause decides, not the words: an own failure whose message happens to say "stopped:"
    nodes = [failed("n0", 0, 3.0, "stopped: n1 silent", "peer"), failed("n1", 1, 4.0, "stopped: the data loader after 3 retries")]
    assert GroupStatus("g", "r", nodes).origin().host == "n1"
    # a node the watcher cancelled is not where it went wrong, even by an earlier (skewed) clock
    cancelled = NodeStatus("n0", 0, RunStatus("r", "cancelled", [StageStatus("dist_check", "cancelled", 1.0, 3.0, 143, {"event": "finished", "status": "failed", "error": "cancelled", "cause": "cancelled", "stage": "dist_check", "t": 3.0})]))
    nodes = [cancelled, failed("n1", 1, 4.0, "failed (torchrun exit code 1: rank 1 (local_rank: 0): exit code 1; ValueError: bad batch)")]
    assert GroupStatus("g", "r", nodes).origin().host == "n1"


# ---------------------------------------------------------------------------------------------
# Sharded extraction across hosts, and the cross-shard check


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
@pytest.mark.pipeline
def test_sharded_extract_across_hosts_and_the_cross_shard_check(cluster_project, netns_cluster, tiny_verifier, prepared_data):
    """`extract` under torchrun on 3 hosts: each rank writes its sample range on its own host.
    check_extraction finds every sample exactly once; a deleted and a corrupted file are
    reported as a gap and an invalid file; a second run recomputes only those."""
    from harness.extraction_check import check_extraction
    from harness.host import Host
    from harness.transport import connect

    config = cluster_project
    for node in netns_cluster.nodes:  # the inputs each host has before extract: verifier, prepared data
        outputs = node.workdir / "outputs"
        shutil.copytree(tiny_verifier.verifier, outputs / "tiny-verifier")
        shutil.copytree(prepared_data, outputs / "prepared")
    runner = group_run(config)
    launch = runner.launch(["extract"], grace_s=GRACE_S)
    status = runner.watch(launch.run_id, timeout=400)
    assert status.state == "ok", [(n.host, n.state, n.failure()) for n in status.nodes]

    transports = {}
    transport_for = lambda h: transports.setdefault(h, connect(config.host(h)))  # noqa: E731
    hosts = [Host(config, config.host(h), transport_for) for h in runner.hosts]
    report = check_extraction(hosts, launch.run_id)
    assert report.ok, report.lines()
    n = report.num_samples
    assert n > 0 and not report.gaps and not report.duplicates
    # sharded: each host holds about a third, together exactly all
    assert sum(report.valid_per_host.values()) == n
    assert all(abs(v - n / 3) <= 1 for v in report.valid_per_host.values()), report.valid_per_host

    first = launch.run_id
    hs1 = sorted(run_artifact(netns_cluster.node("n1").workdir, first, "extract").glob("hs_*.safetensors"))
    hs2 = sorted(run_artifact(netns_cluster.node("n2").workdir, first, "extract").glob("hs_*.safetensors"))
    gone, broken = hs1[0], hs2[-1]
    gone.unlink()
    broken.write_bytes(broken.read_bytes()[:100])  # truncated, as by a crash without the rename
    report = check_extraction(hosts, first)
    assert not report.ok
    gone_i, broken_i = int(gone.stem.split("_")[1]), int(broken.stem.split("_")[1])
    assert report.gaps == sorted({gone_i, broken_i})
    assert [(h, i) for h, i, _ in report.invalid] == [("n2", broken_i)]
    text = "\n".join(report.lines())
    assert "GAPS: 2 sample(s)" in text and "INVALID: n2:" in text

    # a group's distributed stage runs again whatever the store holds (every node must take part),
    # resuming into its artifact: only the two are recomputed
    launch = runner.launch(["extract"], grace_s=GRACE_S)
    status = runner.watch(launch.run_id, timeout=400)
    assert status.state == "ok", [(n.host, n.state, n.failure()) for n in status.nodes]
    log1 = (netns_cluster.node("n1").workdir / "runs" / launch.run_id / "extract" / "log").read_text()
    assert "1 to compute" in log1, log1[-1500:]
    assert run_artifact(netns_cluster.node("n1").workdir, launch.run_id, "extract") == run_artifact(netns_cluster.node("n1").workdir, first, "extract")
    report = check_extraction(hosts, launch.run_id)
    assert report.ok, report.lines()
    for t in transports.values():
        t.close()


def test_merge_reports_gaps_invalid_duplicates_and_mismatch():
    from harness.extraction_check import HostInventory, merge

    meta = {"target_layer_ids": [2, 4, 5], "hidden_size": 64}
    a = HostInventory("a", 10, set(range(0, 5)), {}, [], meta, "s1", "/a")
    b = HostInventory("b", 10, {5, 6, 8, 4}, {7: "unreadable"}, ["hs_12.safetensors"], meta, "s2", "/b")
    report = merge([a, b])
    assert report.gaps == [7, 9] and report.invalid == [("b", 7, "unreadable")]
    assert report.duplicates == {4: ["a", "b"]} and report.stray == [("b", "hs_12.safetensors")]
    assert not report.ok and "GAPS: 2 sample(s) have no valid file on any host: 7, 9" in report.lines()
    # one shared directory seen from two hosts is one copy, not two
    shared = merge([HostInventory("a", 3, {0, 1, 2}, {}, [], meta, "same", "/x"), HostInventory("b", 3, {0, 1, 2}, {}, [], meta, "same", "/x")])
    assert shared.ok and not shared.duplicates
    other = dict(meta, target_layer_ids=[1, 2, 3])
    bad = merge([HostInventory("a", 2, {0}, {}, [], meta, "s1", ""), HostInventory("b", 2, {1}, {}, [], other, "s2", "")])
    assert not bad.ok and bad.mismatch


# ---------------------------------------------------------------------------------------------
# The CLI: a group wherever a host is accepted


def harness_cli(config, cluster, *args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    env = cluster.env()
    env["GLOO_SOCKET_IFNAME"] = "eth0"
    env["COLUMNS"] = "220"  # rich tables: one row per line
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config.path), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=config.path.parent)


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.slow
def test_cli_group_sync_run_status_logs_cancel(cluster_project, netns_cluster):
    import re

    from harness.config import load_config

    path = cluster_project.path
    path.write_text(path.read_text().replace("steps = 400", "steps = 4").replace("step_seconds = 0.25", "step_seconds = 0.0"))
    config = load_config(path)
    (config.root / "remote_scripts" / "added_by_test.py").write_text("# new file\n")
    sync = harness_cli(config, netns_cluster, "sync", "cluster")
    assert sync.returncode == 0, sync.stderr
    for node in netns_cluster.nodes:
        assert (node.workdir / "remote_scripts" / "added_by_test.py").exists()
        assert re.search(rf"^{node.name}: sent [12] files", sync.stderr, re.M), sync.stderr  # + harness.toml the first time

    doctor = harness_cli(config, netns_cluster, "doctor", "cluster", "--json")
    report = __import__("json").loads(doctor.stdout)
    assert set(report["hosts"]) == {"n0", "n1", "n2"}, doctor.stderr
    group_checks = {c["name"]: c for c in report["group_checks"]}
    assert group_checks["rendezvous port"]["status"] == "ok", group_checks
    for node in netns_cluster.nodes:
        route = group_checks[f"route {node.name} -> {netns_cluster.nodes[0].address}"]
        assert route["status"] == "ok" and node.address in route["message"], route

    run = harness_cli(config, netns_cluster, "run", "cluster", "dist_check")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_id = next(line for line in run.stdout.splitlines() if re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", line))
    for i, host in enumerate(("n0", "n1", "n2")):
        assert re.search(rf"^\[{host}\] \[dist_check\] rank {i}/3 on .*all checks passed", run.stdout, re.M), run.stdout[-3000:]

    status = harness_cli(config, netns_cluster, "status", "cluster", run_id)
    assert status.returncode == 0, status.stderr
    rows = [line for line in status.stdout.splitlines() if "dist_check" in line]
    assert len(rows) == 3 and all("ok" in r for r in rows), status.stdout
    assert all(h in status.stdout for h in ("n0", "n1", "n2"))

    runs = harness_cli(config, netns_cluster, "runs", "cluster")
    assert runs.returncode == 0, runs.stderr
    header = next(line for line in runs.stdout.splitlines() if "n0" in line)
    assert "n1" in header and "n2" in header, runs.stdout
    row = next(line for line in runs.stdout.splitlines() if run_id in line)
    assert row.count("ok") == 3, runs.stdout  # one run id, its state on every host

    logs = harness_cli(config, netns_cluster, "logs", "cluster", run_id)
    assert logs.returncode == 0, logs.stderr
    for host in ("n0", "n1", "n2"):
        assert f"[{host}] [node_launcher {host}] torchrun finished: ok" in logs.stdout, logs.stdout[-2000:]

    path.write_text(path.read_text().replace("steps = 4", "steps = 400").replace("step_seconds = 0.0", "step_seconds = 0.25"))
    started = harness_cli(config, netns_cluster, "run", "cluster", "dist_check", "--detach")
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip().splitlines()[-1]
    wait_for_training(group_run(load_config(path)), run_id)
    cancel = harness_cli(config, netns_cluster, "cancel", "cluster", run_id)
    assert cancel.returncode == 0, cancel.stderr
    # every node ends cancelled; the cancels run in parallel, so a node whose ranks died of another
    # node's cancel first (marked cancelling beforehand) says so: "had already ended: cancelled"
    lines = cancel.stdout.splitlines()
    assert len(lines) == 3 and all(re.fullmatch(rf"run {run_id} on n[012](: cancelled| had already ended: cancelled \(nothing to cancel\))", ln) for ln in lines), cancel.stdout
    assert any(ln.endswith(": cancelled") for ln in lines), cancel.stdout  # this command stopped the group
    for node in netns_cluster.nodes:
        assert rank_processes(node) == []
    status = harness_cli(config, netns_cluster, "status", "cluster", run_id)
    assert status.returncode != 0 and status.stdout.count("cancelled") >= 3, status.stdout


def test_no_distributed_stage_flag_is_taken_by_torchrun():
    """torchrun parses the whole command line, the stage's flags after the script included, and
    argparse accepts abbreviations: a stage flag that starts one of torchrun's options (train's
    old `--nproc` against `--nproc-per-node`) stops the launch before the stage runs."""
    import argparse
    import importlib

    from torch.distributed.run import get_args_parser

    from harness.pipeline import STAGES

    torchrun_options = [o for a in get_args_parser()._actions for o in a.option_strings]

    class Captured(Exception):
        pass

    def capture(self, *args, **kwargs):
        raise Captured(self)

    sys.path.insert(0, str(REPO / "remote_scripts"))
    checked = 0
    for stage in (s for s in STAGES.values() if s.distributed):
        module = importlib.import_module(stage.script.removesuffix(".py"))
        original = argparse.ArgumentParser.parse_args
        argparse.ArgumentParser.parse_args = capture
        try:
            module.parse_args([])
        except Captured as e:
            parser = e.args[0]
        finally:
            argparse.ArgumentParser.parse_args = original
        flags = [o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")]
        clashes = [(f, o) for f in flags for o in torchrun_options if o.startswith(f)]
        assert not clashes, f"{stage.name}: {clashes}"
        checked += len(flags)
    assert checked > 40  # the three stages' flags were really read


@pytest.mark.netns
@pytest.mark.ssh
@pytest.mark.docker
@pytest.mark.slow
def test_cli_group_build_fans_out_and_skips_unchanged(tmp_path, netns_cluster, docker_base_image):
    """`harness build GROUP`: every host builds at once over its own SSH connection (the three
    namespace hosts share this machine's engine); a second build finds the content-hash tag on
    every host and builds nothing."""
    import re

    from harness.config import load_config
    from tests.fixtures.docker_engine import startable_memlock
    from tests.fixtures.netns import ensure_nodes_up, write_cluster_config

    ensure_nodes_up(netns_cluster)
    shutil.copytree(REPO / "container", tmp_path / "container")
    shutil.copytree(REPO / "remote_scripts", tmp_path / "remote_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    image = f"harness-group-build-test-{os.getpid()}"  # a fresh repository: the first build really builds
    container = (f'image = "{image}"\nbase_image = "{docker_base_image}"\ngpus = "none"\nshm_size = "1g"\n'
                 f'build_args = {{ INSTALL_ML = "0" }}\nulimits = {{ memlock = {startable_memlock()} }}\n')
    tables = "".join(f"[hosts.{n.name}.container]\n{container}\n" for n in netns_cluster.nodes)
    path = write_cluster_config(tmp_path, netns_cluster, extra=tables)
    path.write_text(path.read_text().replace('runtime = "host"', 'runtime = "docker"'))
    config = load_config(path)
    try:
        first = harness_cli(config, netns_cluster, "build", "cluster", timeout=900)
        assert first.returncode == 0, first.stderr[-3000:]
        # One content-hash tag everywhere. Image IDs may differ: builds that run at once on one
        # engine share no cache (and separate hosts never would), so each can make its own image.
        done = dict(re.findall(r"^(n\d): (?:built|unchanged, not rebuilt): (\S+) sha256:[0-9a-f]+$", first.stdout, re.M))
        assert sorted(done) == ["n0", "n1", "n2"] and len(set(done.values())) == 1, first.stdout
        assert "built:" in first.stdout, first.stdout  # at least one host really built
        assert re.search(r"^\[n\d\] ", first.stderr, re.M), first.stderr[-2000:]  # build output, prefixed per host

        again = harness_cli(config, netns_cluster, "build", "cluster", timeout=300)
        assert again.returncode == 0, again.stderr[-3000:]
        assert sorted(re.findall(r"^(n\d): unchanged, not rebuilt: ", again.stdout, re.M)) == ["n0", "n1", "n2"], again.stdout
    finally:
        refs = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", image], capture_output=True, text=True).stdout.split()
        if refs:  # by reference: untags ours only, never an image other tests share
            subprocess.run(["docker", "rmi", *refs], capture_output=True)

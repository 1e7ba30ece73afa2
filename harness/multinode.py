"""One run across the hosts of a group: torchrun multi-node launches, watched and stopped as one.

`harness run GROUP STAGES...` starts the SAME run id on every host of `[groups.GROUP]`, each under
its own detached supervisor (harness.jobs), so every node's state, log and events live in its own
<workdir>/runs/<run_id>/ and `harness status|logs|cancel HOST RUN` still work per host.
Distributed stages run on every node under remote_scripts/node_launcher.py (torchrun with a
static rendezvous on node 0, plus a peer watchdog; each node's part is harness.group_node, which
its Jobs asks); the stages after the last distributed one run on node 0 only. When one node fails, the others are stopped: by this process while attached, by
the nodes' watchdogs when no laptop watches. The NCCL/Gloo environment of this process reaches
every node the way secrets do (values on stdin, names only in the run record).

The group itself (sync, build, doctor, and this run interface as its `jobs`): harness.group.
Which stage runs where, and the bounds on stopping: docs/architecture/group-runs.md, "A group run".
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from harness import helpers
from harness.config import Config, GroupConfig
from harness.errors import HarnessError, UsageError
from harness.events import Finished, finished_failure
from harness.fanout import LinePrefixer, host_json_sink, open_all, parallel, prefixed_sink
from harness.group_node import GroupLaunch, GroupNode, stages_for_node
from harness.host import Host
from harness.jobs import DEFAULT_GRACE_S, FINAL_RUN_STATES, Jobs, RunStatus, StageStatus, new_run_id
from harness.pipeline import resolve_chain
from harness.runs import AttachView, CancelOutcome, Launched, RunListing, logs_broke_off

POLL_S = 1.0
UNREACHABLE_S = 10.0  # a node that answers no status call for this long counts as lost

FREE_PORT = "free_port.py"  # host_helpers/: a free port pair on host 0 (rendezvous, watchdog store)


# ---------------------------------------------------------------------------------------------
# Group status


@dataclass
class NodeStatus:
    host: str
    rank: int
    status: RunStatus | None = None  # None: no answer
    error: str | None = None  # why there is no answer
    since: float | None = None  # when it stopped answering (monotonic)
    missing: bool = False  # the host answered: it has no such run (it never started there)

    @property
    def state(self) -> str:
        if self.status is None:
            return "missing" if self.missing else "unreachable"
        return self.status.state

    @property
    def final(self) -> bool:
        return self.status is not None and self.status.state in FINAL_RUN_STATES

    def stopped_stage(self) -> tuple[StageStatus | None, Finished | None]:
        """The first stage that failed or was cancelled, and its failed `finished` event (its
        error and cause; None when it wrote none)."""
        stage = next((s for s in self.status.stages if s.state in ("failed", "cancelled")), None) if self.status else None
        return stage, finished_failure(stage.last_event) if stage else None

    def failure(self) -> str | None:
        """A one-line cause when this node failed, was cancelled, lost or is unreachable."""
        if self.status is None:
            return f"{self.state} ({self.error})" if self.error else self.state
        if self.status.state in ("ok", "running", "starting"):
            return None
        bad, finished = self.stopped_stage()
        if bad is None:
            return self.status.state
        code = f" exit code {bad.exit_code}" if bad.exit_code is not None else ""
        return f"{bad.stage} {bad.state}{code}" + (f": {finished.error}" if finished and finished.error else "")

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "rank": self.rank, "state": self.state, "failure": self.failure(), "error": self.error,
                "run": self.status.to_json() if self.status is not None else None}


@dataclass
class GroupStatus:
    group: str
    run_id: str
    nodes: list[NodeStatus]
    first_failure: str | None = None  # "n1: unreachable (...)", as observed by the watcher

    @property
    def state(self) -> str:
        states = [n.state for n in self.nodes]
        if all(s == "ok" for s in states):
            return "ok"
        if any(s in ("running", "starting") for s in states):
            return "running"
        if any(s == "cancelled" for s in states) and not any(s in ("failed", "lost", "unreachable") for s in states):
            return "cancelled"
        return "failed"

    def failed_nodes(self) -> list[NodeStatus]:
        return [n for n in self.nodes if n.failure()]

    def exit_code(self) -> int:
        return 0 if self.state == "ok" else 1

    def to_json(self) -> dict[str, Any]:
        """`harness status GROUP --json`."""
        return {"group": self.group, "run_id": self.run_id, "state": self.state, "exit_code": None if self.state == "running" else self.exit_code(),
                "first_failure": self.first_failure, "nodes": [n.to_json() for n in self.nodes]}

    def origin(self) -> NodeStatus | None:
        """The node that most likely failed first: one that stopped answering (its peers then
        fail in their collectives), else the earliest stage that failed by itself, else the
        earliest cancelled (a cancel is someone's act, never a peer's failure), else the
        earliest stopped because of a peer."""
        gone = [n for n in self.nodes if n.status is None and not n.missing]
        if gone:
            return min(gone, key=lambda n: n.since if n.since is not None else float("inf"))
        failed = []
        for n in self.failed_nodes():
            stage, finished = n.stopped_stage()
            cause = finished.cause if finished else None  # node_launcher.py's verdict says whose failure it was
            cancelled = cause == "cancelled" or (stage is not None and stage.state == "cancelled")
            tier = 2 if cause == "peer" else 1 if cancelled else 0
            failed.append((tier, (stage.finished if stage and stage.finished else float("inf")), n.rank, n))
        return min(failed, key=lambda f: f[:3])[3] if failed else None


# ---------------------------------------------------------------------------------------------
# The run


class GroupRun:
    """A group and one transport per host: launch, attach, status, logs, cancel, watch."""

    detach_note = " (each node's watchdog stops the rest if one fails)"

    def __init__(self, config: Config, group: str, places: Sequence[Host]):
        """`places`: the group's hosts (harness.group.Group.hosts), each as a command has it."""
        if group not in config.groups:
            raise UsageError(f"{group!r} is not a group (groups: {', '.join(sorted(config.groups)) or 'none'})")
        self.config = config
        self.name = group
        self.group: GroupConfig = config.groups[group]
        self.hosts = list(self.group.hosts)
        self._places = {h.name: h for h in places}
        # Each host connected at once (nothing to install: each call ships the supervisor, harness.helpers).
        self.transports = open_all(lambda h: self._places[h].transport, self.hosts)

    def jobs(self, host: str, launch: GroupLaunch | None = None) -> Jobs:
        """One host's runs; with `launch`, that host as a node of the group run."""
        if launch is None:
            return self._places[host].jobs
        return self._places[host].jobs_with(node=GroupNode(launch, self.hosts.index(host)))

    # -- start --------------------------------------------------------------------------------------

    def rendezvous_host(self) -> str:
        if self.group.rdzv_host:
            return self.group.rdzv_host
        return self.transports[self.hosts[0]].address()

    def free_port(self) -> int:
        """The configured rendezvous port if it (and +1) is free on host 0, else a free pair."""
        host0 = self.config.host(self.hosts[0])
        result = helpers.call(self.transports[host0.name], FREE_PORT, {"port": self.group.rdzv_port}, python=host0.python)
        return int(result.checked(f"port probe on {host0.name}").json()["port"])

    def launch(self, stages: list[str], grace_s: float = DEFAULT_GRACE_S, now: bool = False, fresh: Sequence[str] = ()) -> Launched:
        """The same run id on every host at once, all or nothing (`now` changes nothing: nodes
        never queue; `fresh` neither: a node makes every artifact of its run anew, Jobs.plan)."""
        chain = resolve_chain(list(stages))
        port = self.free_port()
        launch = GroupLaunch(
            group=self.group.name, hosts=tuple(self.hosts), run_id=new_run_id(),
            rdzv_host=self.rendezvous_host(), rdzv_port=port, nproc_per_node=self.group.nproc_per_node,
            watchdog_timeout=self.group.watchdog_timeout, grace_s=grace_s,
        )

        def start_node(host: str) -> Launched:
            rank = self.hosts.index(host)
            return self.jobs(host, launch).launch(stages_for_node(chain, rank), grace_s=grace_s, run_id=launch.run_id)

        outcome = parallel(self.hosts, start_node)
        failed = [(h, e) for h, _, e in outcome if e is not None]
        if failed:
            # All or nothing: stop the nodes that did start, then say which one could not.
            started = [h for h, _, e in outcome if e is None]
            parallel(started, lambda h: self.jobs(h).cancel_run(launch.run_id, grace_s))
            host, error = failed[0]
            raise HarnessError(f"{host}: could not start run {launch.run_id}: {error}; stopped it on {', '.join(started) or 'no other host'}")
        return Launched(launch.run_id, f"run {launch.run_id} started on {self.name} ({', '.join(launch.hosts)}; rendezvous {launch.endpoint})")

    def attach(self, run_id: str, view: AttachView, grace_s: float | None = None) -> "GroupStatus":
        """Every node's log into view.node_line while watch() stops the others when one fails."""
        run_id = self.resolve_run_id(run_id)
        threads = self._follow_nodes(run_id, view.node_line, follow=True)
        announced = False

        def on_update(status: GroupStatus) -> None:
            nonlocal announced
            if status.first_failure and not announced:
                announced = True
                view.note(f"harness: node {status.first_failure}; stopping the other nodes")

        status = self.watch(run_id, on_update=on_update, grace_s=grace_s)
        for t in threads:
            t.join(timeout=5)  # the tail of each log; a lost node's stream may never end
        return status

    def locate(self, what: str, newest_run: Callable[[str], str | None] | None = None):
        """A run or path on host 0 (a pull takes one host: this is for its own messages)."""
        return self.jobs(self.hosts[0]).locate(what, newest_run)

    # -- read back ----------------------------------------------------------------------------------

    def resolve_run_id(self, run_id: str) -> str:
        """'last' is host 0's newest run."""
        return self.jobs(self.hosts[0]).resolve_run_id(run_id)

    def node_status(self, host: str, run_id: str) -> NodeStatus:
        rank = self.hosts.index(host)
        try:
            return NodeStatus(host, rank, self.jobs(host).status(run_id))
        except UsageError as e:  # "no run ..."
            return NodeStatus(host, rank, None, str(e), missing=True)
        except (HarnessError, OSError, EOFError) as e:
            return NodeStatus(host, rank, None, f"{type(e).__name__}: {e}")
        except Exception as e:  # noqa: BLE001 - a transport's client raises its own types on a dead link
            return NodeStatus(host, rank, None, f"{type(e).__name__}: {e}")

    def status(self, run_id: str) -> GroupStatus:
        """Every node's status; first_failure names the node where it most likely went wrong."""
        run_id = self.resolve_run_id(run_id)
        nodes = [r for _, r, _ in parallel(self.hosts, lambda h: self.node_status(h, run_id))]
        status = GroupStatus(self.group.name, run_id, nodes)
        origin = status.origin()
        if origin is not None:
            status.first_failure = f"{origin.host}: {origin.failure()}"
        return status

    def listing(self) -> RunListing:
        """Every host's runs, asked in parallel."""
        outcome = parallel(self.hosts, lambda h: self.jobs(h).listing().runs[h])
        return RunListing(self.name, list(self.hosts), {h: runs for h, runs, error in outcome if error is None},
                          {h: f"{type(error).__name__}: {error}" for h, _, error in outcome if error is not None}, group=True)

    def stream_logs(self, run_id: str, sink: Callable[[bytes], None], stage: str | None = None, follow: bool = False,
                    as_json: bool = False, tail: int | None = None) -> int:
        """Every node's log into sink, each line `[host] ...` (as_json: each JSON line with its
        "host"), until every stream ends."""
        broken: list[str] = []
        threads = self._follow_nodes(run_id, host_json_sink(sink) if as_json else prefixed_sink(sink), stage=stage, follow=follow,
                                     as_json=as_json, tail=tail, broken=broken)
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.2)
        if broken:  # each said its own line in the stream; the command's end says so too, never a silent 0
            raise logs_broke_off(self.name, run_id, f"broke off on {', '.join(sorted(broken))} (each said why above)")
        return 0

    def cancel_run(self, run_id: str, grace_s: float | None = None, hosts: Sequence[str] | None = None) -> CancelOutcome:
        """Cancel on every host (`hosts`: on those only), in parallel: each host's final state or
        the error. The whole group's cancel first marks every node, so that one whose ranks die of
        an earlier node's cancel is cancelled, not failed (an unreachable node answers in the
        second round)."""
        run_id = self.resolve_run_id(run_id)
        out = {}
        if hosts is None:
            for host, _, error in parallel(list(self.hosts), lambda h: self.jobs(h).mark_cancelling(run_id)):
                if error is not None:  # unreachable or no such run: asking again would only wait again
                    out[host] = f"error: {error}"
        ended = set()
        for host, cancelled, error in parallel([h for h in (hosts or self.hosts) if h not in out], lambda h: self.jobs(h).cancel_run(run_id, grace_s)):
            out[host] = cancelled.states[host] if error is None else f"error: {error}"
            ended |= cancelled.ended_before if error is None else set()
        return CancelOutcome(run_id, {h: out[h] for h in (hosts or self.hosts)}, group=True, where=self.name, ended_before=ended)

    def _follow_nodes(self, run_id: str, write: Callable[[str, bytes], None], stage: str | None = None, follow: bool = False,
                      as_json: bool = False, tail: int | None = None, broken: list[str] | None = None) -> list[threading.Thread]:
        """Stream every node's logs, each line prefixed with its host: `[n1] ...`. Returns the
        (daemon) threads; join them to wait for the end. `broken` gets the hosts whose stream
        failed (each says why in its own stream)."""
        run_id = self.resolve_run_id(run_id)
        threads = []
        for host in self.hosts:
            splitter = LinePrefixer(host, write)

            def pump(host=host, splitter=splitter) -> None:
                try:
                    self.jobs(host).stream_logs(run_id, splitter.feed, stage=stage, follow=follow, as_json=as_json, tail=tail)
                except UsageError as e:
                    splitter.feed(f"harness: {e}\n".encode())
                except Exception as e:  # noqa: BLE001 - a dead node ends its stream, not the others
                    splitter.feed(f"harness: log stream ended: {type(e).__name__}: {e}\n".encode())
                    if broken is not None:
                        broken.append(host)
                splitter.flush()

            t = threading.Thread(target=pump, name=f"follow-{host}", daemon=True)
            t.start()
            threads.append(t)
        return threads

    # -- watch: stop everything when one node fails -------------------------------------------------

    def watch(self, run_id: str, on_update: Callable[[GroupStatus], None] | None = None, unreachable_s: float = UNREACHABLE_S,
              grace_s: float | None = None, poll_s: float = POLL_S, timeout: float | None = None) -> GroupStatus:
        """Poll every node until each is final, or unreachable for `unreachable_s`. When one
        reports failed or cancelled, cancel all the others at once (bound: poll + grace)."""
        latest: dict[str, NodeStatus] = {h: NodeStatus(h, i) for i, h in enumerate(self.hosts)}
        lock = threading.Lock()
        stop = threading.Event()

        def poll(host: str) -> None:
            down_since = None
            while not stop.is_set():
                st = self.node_status(host, run_id)
                if st.status is None:
                    down_since = down_since or time.monotonic()
                    st.since = down_since
                else:
                    down_since = None
                with lock:
                    latest[host] = st
                if st.final:
                    return
                stop.wait(poll_s)

        for h in self.hosts:
            threading.Thread(target=poll, args=(h,), name=f"watch-{h}", daemon=True).start()
        deadline = None if timeout is None else time.monotonic() + timeout
        first_failure: str | None = None
        stopped_others = False
        try:
            while True:
                time.sleep(poll_s / 2)
                with lock:
                    nodes = [dataclasses.replace(latest[h]) for h in self.hosts]
                now = time.monotonic()
                lost = {n.host for n in nodes if n.status is None and n.since is not None and now - n.since > unreachable_s}
                failed = [n for n in nodes if n.final and n.state != "ok"]
                if (failed or lost) and first_failure is None:
                    first = GroupStatus(self.group.name, run_id, nodes).origin() or (failed or [latest[h] for h in lost])[0]
                    first_failure = f"{first.host}: {first.failure()}"
                # Only a node that reported failure or cancel makes us cancel the rest. One we
                # cannot reach may only be cut off from this laptop: the nodes' watchdogs, which
                # see each other, decide about it (bound: watchdog_timeout + grace).
                if failed and not stopped_others:
                    stopped_others = True
                    others = [n.host for n in nodes if not n.final and n.status is not None]
                    if others:
                        self.cancel_run(run_id, grace_s, hosts=others)
                group = GroupStatus(self.group.name, run_id, nodes, first_failure)
                if on_update:
                    on_update(group)
                if all(n.final or n.host in lost for n in nodes) or (deadline is not None and now > deadline):
                    return group
        finally:
            stop.set()

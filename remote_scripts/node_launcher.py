"""One node of a multi-node run: torchrun under a peer watchdog.

The harness starts this on every host of a group (`harness run GROUP STAGE`), each under its own
detached supervisor, with the same run id. It runs torchrun with a static rendezvous on node 0
(node i holds global ranks i*G .. i*G+G-1) and watches the other nodes through a small store on
node 0 (common/watch_store.py), so that one failed, cancelled or vanished node stops the whole
run within a bounded time even when no laptop is attached. When torchrun fails, the node's
verdict names the cause it printed (common/torchrun_output.py) and whose failure it was, so
`harness status` points at the node where it went wrong. The watchdog's rules, its bounds and why
the rendezvous is static: docs/architecture/group-runs.md, "A group run on the GPU side".

Run by hand on each node (what the harness writes into the stage's spec.json):
    python remote_scripts/node_launcher.py --node-rank 0 --nnodes 2 --endpoint 10.0.0.1:29500 \
        --run-id test -- remote_scripts/dist_check.py --steps 5
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.events import EventLog  # noqa: E402
from common.torchrun_output import failure_cause, is_peer_loss  # noqa: E402

FINAL = ("ok", "failed", "cancelled", "stopped")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--nproc-per-node", type=int, default=1)
    p.add_argument("--endpoint", required=True, help="HOST0:PORT of the rendezvous (the watch store uses PORT+1)")
    p.add_argument("--run-id", required=True)
    p.add_argument("--node-names", default="", help="comma-separated host names, for messages")
    p.add_argument("--heartbeat", type=float, default=2.0)
    p.add_argument("--peer-timeout", type=float, default=60.0, help="seconds without a peer's heartbeat before giving up on it")
    p.add_argument("--join-timeout", type=float, default=600.0, help="seconds to wait for every node to show up")
    p.add_argument("--grace", type=float, default=8.0, help="seconds between SIGTERM and SIGKILL when stopping torchrun")
    p.add_argument("--events", default=None)
    p.add_argument("--stage", default="node", help="stage name for events")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS... (run by torchrun)")
    a = p.parse_args(argv)
    if a.command and a.command[0] == "--":
        a.command = a.command[1:]
    if not a.command:
        p.error("missing the script to run after --")
    return a


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def source_address_towards(host: str, port: int) -> str:
    """The local address the kernel would use to reach host (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def torchrun_argv(a: argparse.Namespace) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", str(a.nnodes), "--node-rank", str(a.node_rank), "--nproc-per-node", str(a.nproc_per_node),
        "--rdzv-backend", "static", "--rdzv-endpoint", a.endpoint, "--rdzv-id", a.run_id,
        "--rdzv-conf", f"timeout={max(1, round(a.join_timeout))}",
        "--max-restarts", "0",
        *a.command,
    ]


class Watchdog:
    """Heartbeats and outcomes through the watch store on node 0.

    Every store call happens in a prober thread: on a partitioned link a call can block for
    minutes (TCP retransmits), and the decision loop must not. The loop only reads what the
    prober last learnt, and the time it last succeeded, so a silent store counts as silence.
    """

    def __init__(self, a: argparse.Namespace, events: EventLog):
        self.a = a
        self.events = events
        self.names = a.node_names.split(",") if a.node_names else [f"node{i}" for i in range(a.nnodes)]
        self.me = a.node_rank
        self.peers = [r for r in range(a.nnodes) if r != self.me]
        self.store = None
        self.server = None  # node 0's
        self.lock = threading.Lock()
        self.store_ok_at = time.monotonic()
        self.seen: dict[int, tuple[int, float]] = {}  # peer -> (heartbeat count, when it last moved)
        self.outcomes: dict[int, str] = {}
        self.started = time.monotonic()
        self.cancelled = False
        self.closing = threading.Event()

    def name(self, rank: int) -> str:
        return f"{self.names[rank]} (node {rank})" if rank < len(self.names) else f"node {rank}"

    # -- the watch store ---------------------------------------------------------------------------

    def connect(self) -> None:
        from common.watch_store import SECRET_ENV, WatchStoreClient, WatchStoreServer

        secret = os.environ.get(SECRET_ENV, "").encode()
        if not secret:
            raise RuntimeError(f"no {SECRET_ENV} in the environment: the watch store takes only callers that know the run's secret")
        host, port = split_endpoint(self.a.endpoint)
        timeout = max(5.0, self.a.heartbeat * 3)
        if self.me == 0:
            try:
                self.server = WatchStoreServer(socket.gethostbyname(host) if ":" not in host else host, port + 1, secret)
            except OSError as e:
                raise RuntimeError(f"cannot listen for the watch store at {host}:{port + 1} (the rendezvous address, on this node?): {e}") from None
        deadline = time.monotonic() + self.a.join_timeout
        while True:  # node 0 may start later than us
            try:
                self.store = WatchStoreClient(host, port + 1, secret, timeout)
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cannot reach the watch store on {self.name(0)} at {host}:{port + 1}: {e}") from None
                time.sleep(self.a.heartbeat)
        self.store_ok_at = time.monotonic()
        threading.Thread(target=self._probe_loop, name="watch-store", daemon=True).start()

    def _probe_loop(self) -> None:
        while not self.closing.is_set():
            try:
                self.store.add(f"hb/{self.me}", 1)
                for peer in self.peers:
                    count = self.store.add(f"hb/{peer}", 0)
                    outcome = self.store.get(f"outcome/{peer}")
                    now = time.monotonic()
                    with self.lock:
                        last = self.seen.get(peer)
                        if count and (last is None or count != last[0]):
                            self.seen[peer] = (count, now)
                        if outcome:
                            self.outcomes[peer] = outcome
                with self.lock:
                    self.store_ok_at = time.monotonic()
            except Exception:  # noqa: BLE001 - reset, timeout: silence, judged by the loop
                pass
            self.closing.wait(self.a.heartbeat)

    def post(self, outcome: str) -> None:
        """Publish our outcome; gives up after a few heartbeats if the store does not answer."""
        if self.store is None:
            return
        done = threading.Event()

        def put() -> None:
            try:
                self.store.set(f"outcome/{self.me}", outcome)
                done.set()
            except Exception:  # noqa: BLE001
                pass

        t = threading.Thread(target=put, daemon=True)
        t.start()
        t.join(max(5.0, 3 * self.a.heartbeat))

    # -- decisions (read what the prober learnt; never block) --------------------------------------

    def silent_for(self, peer: int) -> float | None:
        last = self.seen.get(peer)
        return None if last is None else time.monotonic() - last[1]

    def reason_to_stop(self) -> str | None:
        """Why this node should stop now, or None."""
        now = time.monotonic()
        with self.lock:
            for peer in self.peers:
                outcome = self.outcomes.get(peer)
                if outcome and not outcome.startswith("ok"):
                    return f"{self.name(peer)} {outcome}"
                silent = self.silent_for(peer)
                if outcome is None and silent is not None and silent > self.a.peer_timeout:
                    return f"{self.name(peer)} silent for {silent:.0f} s (no heartbeat)"
                if silent is None and now - self.started > self.a.join_timeout:
                    return f"{self.name(peer)} never started (waited {self.a.join_timeout:.0f} s)"
            if now - self.store_ok_at > self.a.peer_timeout:
                return f"lost the watch store on {self.name(0)} for {now - self.store_ok_at:.0f} s"
        return None

    def first_failed_peer(self) -> str | None:
        """A peer's failure that came first (our ranks died of it), if one is posted within two
        probe rounds: the peer that failed may still be posting while its collectives already
        broke ours."""
        deadline = time.monotonic() + 2 * self.a.heartbeat + 1.0
        while True:
            with self.lock:
                for peer in self.peers:
                    outcome = self.outcomes.get(peer)
                    if outcome and not outcome.startswith("ok"):
                        return f"{self.name(peer)} {outcome}"
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def wait_for_peers_outcome(self) -> None:
        """Node 0 hosts the store: keep it up until every live peer has posted its outcome, so
        that none of them mistakes our exit for a failure. A peer whose heartbeat stopped is
        not waited for (it is gone)."""
        deadline = time.monotonic() + self.a.peer_timeout
        gone_after = 3 * self.a.heartbeat + 2.0
        while time.monotonic() < deadline:
            with self.lock:
                pending = [p for p in self.peers if p not in self.outcomes]
                waited = time.monotonic() - self.started
                if all((self.silent_for(p) or 0.0) > gone_after or (self.silent_for(p) is None and waited > gone_after) for p in pending):
                    return
            time.sleep(self.a.heartbeat / 2)

    def close(self) -> None:
        self.closing.set()


class StderrTee:
    """Copies torchrun's stderr (its ranks' too) to ours line by line, keeping the last lines:
    torchrun's exit code is only 1, the cause is in what it printed."""

    def __init__(self, stream, keep: int = 400):
        self.tail: collections.deque[str] = collections.deque(maxlen=keep)
        self.thread = threading.Thread(target=self._pump, args=(stream,), name="torchrun-stderr", daemon=True)
        self.thread.start()

    def _pump(self, stream) -> None:
        out = sys.stderr.buffer
        for line in iter(stream.readline, b""):
            try:
                out.write(line)
                out.flush()
            except OSError:  # a full disk under the log: keep reading, or torchrun stalls on the pipe
                pass
            self.tail.append(line.decode(errors="replace"))

    def drain(self) -> None:
        # Ranks that outlive torchrun keep the pipe open: give the last lines a moment, no more.
        self.thread.join(timeout=5)

    def cause(self) -> str | None:
        """After drain(): one line on why torchrun failed."""
        return failure_cause(list(self.tail))


def descendants(pid: int) -> list[int]:
    """Every process below pid (torchrun's workers run in sessions of their own, so a process
    group kill would miss them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            ppid = int(stat[stat.rfind(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def stop_tree(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM torchrun (it forwards to its workers), wait, then SIGKILL everything it started."""
    tree = descendants(proc.pid)
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and (proc.poll() is None or any(_alive(p) for p in tree)):
        tree = sorted(set(tree) | set(descendants(proc.pid)))
        time.sleep(0.1)
    for pid in [proc.pid, *tree]:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.wait()
    # torchrun's workers are not our children: wait until the kernel has torn them down too, so
    # the stage ends only when nothing of it runs (a large rank takes a while to exit).
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in tree) and time.monotonic() < deadline:
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().split(b") ")[-1][:1] != b"Z"
    except OSError:
        return False


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    events = EventLog(a.stage, a.events, echo=False)
    host, port = split_endpoint(a.endpoint)
    dog = Watchdog(a, events)

    def on_term(signum, frame) -> None:
        dog.cancelled = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    say = lambda text: print(f"[node_launcher {dog.names[a.node_rank] if a.node_rank < len(dog.names) else a.node_rank}] {text}", flush=True)  # noqa: E731
    try:
        dog.connect()
    except Exception as e:  # noqa: BLE001
        say(f"error: {e}")
        events.finished("failed", error=str(e), node_rank=a.node_rank)
        return 1
    argv_ = torchrun_argv(a)
    # The address this node reaches node 0 from: where its collectives' traffic leaves.
    say(f"node {a.node_rank}/{a.nnodes} at {source_address_towards(host, port)}: {' '.join(argv_[1:])}")
    # Same process group as us: the supervisor's cancel (killpg) reaches torchrun directly too.
    proc = subprocess.Popen(argv_, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = StderrTee(proc.stderr)
    stop_reason = None
    while proc.poll() is None:
        if dog.cancelled:
            stop_reason = "cancelled"
            dog.post("cancelled")
            break
        reason = dog.reason_to_stop()
        if reason:
            stop_reason = reason
            dog.post(f"stopped ({reason})")
            break
        time.sleep(0.2)  # cheap: reason_to_stop reads memory; the prober talks to the store
    if stop_reason is not None:
        say(f"stopping torchrun: {stop_reason}")
        stop_tree(proc, a.grace)
        # a cancel is this node's own; any other reason to stop is a peer's trouble
        cancelled = stop_reason == "cancelled"
        events.finished("failed", error="cancelled" if cancelled else f"stopped: {stop_reason}", cause="cancelled" if cancelled else "peer", node_rank=a.node_rank)
        code = 143 if stop_reason == "cancelled" else 3
        stderr.drain()
    else:
        stderr.drain()  # torchrun's last lines, its report among them, before reading the cause
        code = proc.returncode
        cause = stderr.cause() if code != 0 else None
        outcome = "ok" if code == 0 else f"failed (torchrun exit code {code}{': ' + cause if cause else ''})"
        whose = "own"
        if code != 0 and is_peer_loss(cause):
            earlier = dog.first_failed_peer()
            if earlier:  # our ranks died of a peer's failure (a collective broke): say so
                outcome += f" after {earlier}"
                whose = "peer"
        dog.post(outcome)
        say(f"torchrun finished: {outcome}")
        if code != 0:  # the node's verdict, after the ranks' own events: status shows the cause
            events.finished("failed", error=outcome, cause=whose, node_rank=a.node_rank)
    if a.node_rank == 0:
        dog.wait_for_peers_outcome()
    dog.close()
    return code


if __name__ == "__main__":
    exit_code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Not sys.exit: a store call stuck on a dead link (daemon thread) must not delay the exit.
    os._exit(exit_code)

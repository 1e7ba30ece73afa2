"""How one host takes part in a group run (harness.multinode): what every node of the run agrees
on (GroupLaunch), and one node's part (GroupNode), which a host's Jobs (harness.jobs) asks how
each stage starts there: a distributed stage under remote_scripts/node_launcher.py (torchrun with a
static rendezvous on node 0, plus a peer watchdog), with the collectives' environment of this
process. Pure: no connection, no call to the host.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
from dataclasses import dataclass
from typing import Any, Sequence

from harness.stages import SCRIPTS_DIR, STAGES

NODE_LAUNCHER = f"{SCRIPTS_DIR}/node_launcher.py"
# Environment families that configure the collectives; passed through from the laptop.
DIST_ENV_RE = re.compile(r"^(NCCL_|GLOO_|TORCH_NCCL_|TORCH_DISTRIBUTED_|TORCH_CPP_LOG_LEVEL$|TORCHELASTIC_)")
WATCH_SECRET_ENV = "HARNESS_WATCH_SECRET"  # remote_scripts/common/watch_store.py's SECRET_ENV


def distributed_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The collectives' settings from this process's environment (values stay in memory)."""
    environ = dict(os.environ if environ is None else environ)
    return {k: v for k, v in environ.items() if DIST_ENV_RE.match(k)}


def stages_for_node(stages: Sequence[str], rank: int) -> list[str]:
    """Which of a group run's stages node `rank` runs (docs/architecture/group-runs.md, "A group run")."""
    dist = [i for i, s in enumerate(stages) if STAGES[s].distributed]
    if rank == 0 or not dist:  # no distributed stage: every node runs them all
        return list(stages)
    return [s for i, s in enumerate(stages) if i <= dist[-1]]


@dataclass(frozen=True)
class GroupLaunch:
    """What every node of one group run agrees on."""

    group: str
    hosts: tuple[str, ...]
    run_id: str
    rdzv_host: str
    rdzv_port: int
    nproc_per_node: int  # 0: each host's GPU count (at least 1)
    watchdog_timeout: float
    grace_s: float
    # the watch store's per-run secret (node_launcher.py): every node's environment, never the record
    watch_secret: str = dataclasses.field(default_factory=lambda: secrets.token_urlsafe(32), repr=False)

    @property
    def endpoint(self) -> str:
        host = f"[{self.rdzv_host}]" if ":" in self.rdzv_host else self.rdzv_host
        return f"{host}:{self.rdzv_port}"


@dataclass(frozen=True)
class GroupNode:
    """One host's part in a group run, as its Jobs (harness.jobs.Jobs' `node`) starts the
    stages there: distributed stages go through node_launcher.py."""

    launch: GroupLaunch
    rank: int

    def stage_command(self, stage: str, argv: list[str], events_path: str, nproc: int) -> list[str]:
        """The stage's own command line `argv`, under node_launcher.py if it is distributed."""
        if not STAGES[stage].distributed:
            return argv
        launch = self.launch
        per_node = launch.nproc_per_node or max(1, nproc)
        # The watchdog stops torchrun within its own grace, before the supervisor's SIGKILL.
        inner_grace = max(1.0, min(launch.grace_s - 2.0, launch.grace_s * 0.8))
        return [
            argv[0], NODE_LAUNCHER,
            "--node-rank", str(self.rank), "--nnodes", str(len(launch.hosts)), "--nproc-per-node", str(per_node),
            "--endpoint", launch.endpoint, "--run-id", launch.run_id, "--node-names", ",".join(launch.hosts),
            "--peer-timeout", f"{launch.watchdog_timeout:g}", "--grace", f"{inner_grace:g}",
            "--events", events_path, "--stage", stage,
            "--", *argv[1:],
        ]

    def env(self) -> dict[str, str]:
        """What every node's stages get besides the host's own env (values in memory only)."""
        return {**distributed_env(), WATCH_SECRET_ENV: self.launch.watch_secret}

    def record(self) -> dict[str, Any]:
        """The run record's "group" (no secret values)."""
        return {
            **{k: v for k, v in dataclasses.asdict(self.launch).items() if k != "watch_secret"},
            "hosts": list(self.launch.hosts),
            "node_rank": self.rank,
            "nnodes": len(self.launch.hosts),
            "endpoint": self.launch.endpoint,
            "env_names": sorted(distributed_env()),  # names only
        }

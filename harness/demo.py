"""The embedded default: the whole EAGLE-3 pipeline on this machine, on a tiny verifier.

Nothing here is special-cased: the demo is a config with one local host (runtime "host"), and it
goes through the same library path as a GPU box: `sync` pushes remote_scripts/ into the demo's
workdir, `Jobs.launch` starts the detached supervisor that runs the stages one after another,
and the summary is read from the evaluate stage's report.json.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from harness.config import Config, HostConfig, PipelineConfig, SyncConfig
from harness.errors import HarnessError
from harness.events import acceptance_length, finished_failure
from harness.host import Host
from harness.run_pull import run_outputs
from harness.stages import DEMO_CHAIN
from harness.sync import sync
from harness.transport.local import LocalTransport

REPO_ROOT = Path(__file__).resolve().parent.parent

# Stage flags tuned for 2 CPU cores: the whole chain in a few minutes, tau >= 3.5 at k = 3.
# Torch's default of one OpenMP thread per core is very slow when anything else runs on the
# machine; one thread per stage is faster and predictable.
DEMO_STAGE_ARGS: dict[str, dict[str, Any]] = {
    "verifier": {"threads": 1},
    "prepare": {},
    "extract": {"threads": 1},
    "train": {"threads": 1},
    "evaluate": {"threads": 1},
    "export": {},
}


# The demo's verifiers (make_tiny_verifier.py --arch): the small Llama, or a toy of the
# architecture our users train for (Kimi-K2.5: multimodal wrapper, DeepSeek-V3 MoE text model).
DEMO_VERIFIERS = ("llama", "kimi-k2.5")

# What `harness demo --json` prints, also kept in the workdir: a script (or a test) reads it
# after the plain command, without running the demo again.
SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class DemoOptions:
    workdir: Path = Path("demo-output")  # everything the demo writes lives here
    speculative_tokens: int = 3
    verifier: str = "llama"  # one of DEMO_VERIFIERS
    stage_args: dict[str, dict[str, Any]] = field(default_factory=lambda: DEMO_STAGE_ARGS)

    def stages(self) -> dict[str, dict[str, Any]]:
        """stage_args, with the verifier stage building the chosen architecture."""
        if self.verifier not in DEMO_VERIFIERS:
            raise HarnessError(f"unknown demo verifier {self.verifier!r} (choices: {', '.join(DEMO_VERIFIERS)})")
        if self.verifier == "llama":
            return self.stage_args
        # The released checkpoint's layout: the key names and config a user's download has.
        return {**self.stage_args, "verifier": {**self.stage_args.get("verifier", {}), "arch": self.verifier, "layout": "released"}}


@dataclass(frozen=True)
class DemoSummary:
    run_id: str
    tau: float
    acceptance_per_position: list[float]
    k: int
    prompts: int
    draft: str  # the checkpoint evaluate and export used: the best estimated tau while training
    training_tau: list[dict[str, float]]  # [{"step": N, "tau": X}]: the train stage's estimates
    export: str
    report: str
    plots: dict[str, str]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "tau": self.tau,
            "acceptance_per_position": self.acceptance_per_position,
            "k": self.k,
            "prompts": self.prompts,
            "draft": self.draft,
            "training_tau": self.training_tau,
            "export": self.export,
            "report": self.report,
            "plots": self.plots,
            "seconds": self.seconds,
        }


def demo_config(options: DemoOptions) -> Config:
    """The demo's config: one local host whose workdir is options.workdir, the stages run by the
    very interpreter running harness (it has the pipeline extra installed)."""
    workdir = options.workdir.expanduser().resolve()
    host = HostConfig(name="local", local=True, workdir=str(workdir), runtime="host", python=sys.executable)
    pipeline = PipelineConfig(
        verifier="outputs/tiny-verifier",
        data="outputs/chat.jsonl",
        output_dir="outputs",
        max_seq_len=256,
        speculative_tokens=options.speculative_tokens,
        stages=options.stages(),
    )
    return Config(
        path=REPO_ROOT / "harness.toml",  # not read: sync paths are relative to its directory
        hosts={"local": host},
        sync=SyncConfig(paths=["remote_scripts"]),
        pipeline=pipeline,
    )


def run_demo(options: DemoOptions, on_output: Callable[[bytes], None]) -> DemoSummary:
    """Sync, run the demo chain attached (its JSON-lines stream goes to `on_output`), summarize."""
    if not (REPO_ROOT / "remote_scripts").is_dir():
        raise HarnessError(f"remote_scripts/ not found next to the harness package ({REPO_ROOT}); run the demo from a checkout")
    started = time.monotonic()
    config = demo_config(options)
    host = config.hosts["local"]
    transport = LocalTransport("local")
    sync(transport, config.root, config.sync_paths(), host.workdir, python=host.python)
    jobs = Host(config, host, lambda _name: transport).jobs
    run_id = jobs.launch(list(DEMO_CHAIN)).run_id
    jobs.stream_logs(run_id, on_output, follow=True, as_json=True)
    status = jobs.status(run_id)
    if status.state != "ok":
        failed = status.failed_stage
        if failed:
            failure = finished_failure(failed.last_event)
            why = f" ({failure.error})" if failure and failure.error else ""
            raise HarnessError(f"demo run {run_id}: stage {failed.stage} exited with code {failed.exit_code}{why}; its log: {host.workdir}/runs/{run_id}/{failed.stage}/log")
        raise HarnessError(f"demo run {run_id} ended {status.state}; logs under {host.workdir}/runs/{run_id}/")
    summary = _summary(run_id, config, time.monotonic() - started)
    _write_atomically(Path(host.workdir) / SUMMARY_FILE, json.dumps(summary.to_json(), indent=2) + "\n")
    return summary


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(text)
    partial.replace(path)


def _summary(run_id: str, config: Config, seconds: float) -> DemoSummary:
    """The run's own outputs (its artifacts, as its run.json names them), summed up."""
    workdir = Path(config.hosts["local"].workdir)
    try:
        record = json.loads((workdir / "runs" / run_id / "run.json").read_text())
    except (OSError, ValueError) as e:
        raise HarnessError(f"demo run {run_id}: no readable run record ({e})") from None
    outputs = run_outputs(record, str(workdir))[0]
    if outputs["evaluate"] is None or outputs["train"] is None or outputs["export"] is None:
        raise HarnessError(f"demo run {run_id}: its record names no evaluation, draft or export (see {workdir}/runs/{run_id}/run.json)")
    report_path = Path(outputs["evaluate"]) / "report.json"
    try:
        report = json.loads(report_path.read_text())
    except (OSError, ValueError) as e:
        raise HarnessError(f"demo run {run_id}: no readable evaluation report at {report_path} ({e})") from None
    extra = report.get("extra") or {}
    tau = acceptance_length(report.get("tau"))
    if tau is None:  # evaluate fails rather than write one: a report from elsewhere, or a bug
        raise HarnessError(f"demo run {run_id}: {report_path} holds tau {report.get('tau')!r}, not a measured acceptance length (at least 1): see the evaluate stage's log")
    return DemoSummary(
        run_id=run_id,
        tau=tau,
        acceptance_per_position=[float(a) for a in report["acceptance_per_position"]],
        k=int(report["k"]),
        prompts=int(report.get("prompts", 0)),
        draft=str(extra.get("draft") or outputs["train"]),
        training_tau=[{"step": int(t["step"]), "tau": float(t["tau"])} for t in extra.get("training_tau") or []],
        export=str(outputs["export"]),
        report=str(report_path),
        plots={k: str(v) for k, v in (extra.get("plots") or {}).items()},
        seconds=round(seconds, 1),
    )

"""The README's main command, end to end: `harness demo` builds and trains the tiny verifier,
then prepare -> extract -> train -> evaluate -> export run as one detached run on the local
transport. The draft must really learn: tau >= 3.5 at k = 3 within the 10-minute budget."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.pipeline, pytest.mark.slow]

BUDGET_S = 600


def test_demo_trains_a_draft_that_the_verifier_accepts(tmp_path: Path):
    workdir = tmp_path / "demo"
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "harness", "demo", "--json", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=BUDGET_S + 120,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout)  # --json: stdout carries the summary alone

    assert elapsed < BUDGET_S, f"demo took {elapsed:.0f} s"
    assert summary["k"] == 3
    assert len(summary["acceptance_per_position"]) == 3
    assert summary["tau"] >= 3.5, summary
    assert all(0.0 <= a <= 1.0 for a in summary["acceptance_per_position"])

    # What the summary points at exists, and the report agrees with it.
    report = json.loads(Path(summary["report"]).read_text())
    assert report["tau"] == summary["tau"]
    assert report["prompts"] > 0 and report["prompts"] == summary["prompts"]
    for plot in summary["plots"].values():
        assert Path(plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"acceptance", "training"} <= set(summary["plots"])
    export_config = json.loads((Path(summary["export"]) / "config.json").read_text())
    verifier_path = export_config["speculators_config"]["verifier"]["name_or_path"]
    assert Path(verifier_path).is_absolute() and (Path(verifier_path) / "config.json").is_file()

    # It went through a real run: the run's record and every stage's state are on "the host".
    run_dir = workdir / "runs" / summary["run_id"]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["stages"] == ["verifier", "regenerate", "prepare", "extract", "train", "evaluate", "export"]
    for stage in record["stages"]:
        state = json.loads((run_dir / stage / "state.json").read_text())
        assert state["state"] == "ok" and state["exit_code"] == 0, (stage, state)


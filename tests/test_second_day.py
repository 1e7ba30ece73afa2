"""The second day on your own box, typed into a real terminal: a run, then the same run with one
flag changed by `--set`, then the first run pulled and the two compared.

The box is the test bed's sshd (`runtime = "host"`) and the stages are the real pipeline on the
session's tiny verifier at the smallest sizes that still train (a few optimizer steps, four
prompts measured). What the screen must show: the second run makes train and evaluate anew (a new
key: its lr changed) and reuses prepare and extract, saying so; `pull` of the first run brings the
first run's own report, byte for byte, not the later one's; `diff` shows the lr and both taus;
`rm` of the first run (named by the end of its id) frees what only it needed, `gc` then finds
nothing, and the second run is named by the start of its id."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import pytest

from tests.fixtures.job_project import toml_value
from tests.fixtures.terminal import Terminal

pytestmark = [pytest.mark.ssh, pytest.mark.pipeline]

REPO = Path(__file__).resolve().parents[1]
RUN_S = 240  # a guard against a hang on a loaded machine, not a speed claim
STAGES = {
    "prepare": {"max_samples": 48},
    "extract": {"batch_size": 8},
    "train": {"epochs": 1, "max_steps": 4, "total_seq_len": 256, "threads": 1},
    "evaluate": {"max_prompts": 4, "max_new_tokens": 16, "threads": 1},
}


def run_id_of(shown: str) -> str:
    return re.search(r"^run (\d{8}-\d{6}-[0-9a-f]{6}) started on gpu$", shown, re.M).group(1)


def test_the_second_day_a_changed_flag_retrains_reuses_the_rest_and_each_run_keeps_its_own(tmp_path, ssh_host, tiny_verifier):
    project, work = tmp_path / "project", tmp_path / "box-workdir"
    project.mkdir()
    shutil.copytree(REPO / "remote_scripts", project / "remote_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    (project / "harness.toml").write_text("\n".join([
        "[hosts.gpu]", f'ssh = "{ssh_host.alias}"', f'workdir = "{work}"', 'runtime = "host"', f'python = "{sys.executable}"',
        "[sync]", 'paths = ["remote_scripts", "harness.toml"]',
        "[pipeline]", f'verifier = "{tiny_verifier.verifier}"', f'data = "{tiny_verifier.data}"', "max_seq_len = 256",
        *(line for stage, flags in STAGES.items() for line in [f"[pipeline.stages.{stage}]", *(f"{k} = {toml_value(v)}" for k, v in flags.items())]),
    ]) + "\n")
    bin_dir = Path(sys.executable).parent
    env = ssh_host.env({**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"})
    term = Terminal(tmp_path, project, env)
    try:
        day_one = "harness run gpu prepare extract train evaluate"
        term.start(day_one)
        assert term.finish(day_one, timeout=RUN_S) == 0, term.screen()[-3000:]
        first = run_id_of(term.output_of(day_one))

        day_two = day_one + " --set train.lr=0.003"
        term.start(day_two)
        assert term.finish(day_two, timeout=RUN_S) == 0, term.screen()[-3000:]
        shown = term.output_of(day_two)
        second = run_id_of(shown)
        for stage in ("prepare", "extract"):
            assert f"{stage}: reused from run {first} (same inputs; --fresh {stage} to redo it)" in shown, shown
        assert "train: reused" not in shown and "evaluate: reused" not in shown
        assert re.search(r"\[train\] metric: step \d+", shown), shown  # it trained again
        table = shown[shown.index(f"run {second} on gpu: ok"):]
        assert re.search(r"│ extract\s+│ reused\s+│", table) and re.search(r"│ train\s+│ ok\s+│", table), table

        records = {r: json.loads((work / "runs" / r / "run.json").read_text()) for r in (first, second)}
        evaluations = {r: Path(rec["artifacts"]["evaluate"]["path"]) for r, rec in records.items()}
        assert evaluations[first] != evaluations[second]
        assert records[second]["artifacts"]["train"]["parts"]["flags"]["lr"] == 0.003
        assert records[first]["artifacts"]["train"]["parts"]["flags"]["lr"] == 0.001

        assert term.command(f"harness pull gpu {first}") == 0, term.screen()[-3000:]
        pulled = project / "runs" / first / "outputs" / "eval" / "report.json"
        assert pulled.read_bytes() == (evaluations[first] / "report.json").read_bytes()
        assert (project / "runs" / first / "outputs" / "checkpoints" / "best.json").read_bytes() == \
            (Path(records[first]["artifacts"]["train"]["path"]) / "best.json").read_bytes()

        assert term.command(f"harness diff gpu {first} {second}") == 0
        compared = term.output_of(f"harness diff gpu {first} {second}")
        assert re.search(r"flag\s+│ train\.lr\s+│ 0\.001\s+│ 0\.003", compared), compared
        taus = [json.loads((evaluations[r] / "report.json").read_text())["tau"] for r in (first, second)]
        assert re.search(rf"tau\s+│ overall\s+│ {taus[0]:.4g}\s+│ {taus[1]:.4g}", compared), (taus, compared)
        assert re.search(r"artifact\s+│ extract\s+│ (\w{20}) \(made\)\s+│ \1 \(reused\)", compared), compared

        # Removing the first run (named by the end of its id) frees what only it needed: its draft
        # and its evaluation; what the second run reused stays, and the second run is named by its start.
        removing = f"harness rm gpu {first[-6:]}"
        assert term.command(removing + " --dry-run") == 0
        planned = term.output_of(removing + " --dry-run")
        firsts = {stage: Path(records[first]["artifacts"][stage]["path"]) for stage in ("train", "evaluate")}
        assert f"would remove run {first}" in planned and all(f"would remove {s}/{p.name}" in planned for s, p in firsts.items()), planned
        assert all(p.is_dir() for p in firsts.values())
        assert term.command(removing) == 0
        assert not (work / "runs" / first).exists() and not any(p.exists() for p in firsts.values())
        assert all(Path(records[second]["artifacts"][s]["path"]).is_dir() for s in ("prepare", "extract", "train", "evaluate"))
        assert term.command("harness gc gpu --dry-run") == 0
        assert "would free 0 B on gpu" in term.output_of("harness gc gpu --dry-run")
        assert term.command(f"harness status gpu {second[:15]}") == 0
        assert f"run {second} on gpu: ok" in term.output_of(f"harness status gpu {second[:15]}")
    finally:
        term.close()

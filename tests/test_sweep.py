"""`harness sweep` (harness/sweep.py): the grid and the winner's choice as pure logic; then over the
real sshd test bed, a sweep's trials as queued runs (cancel, pick-up after a lost link) with the
fake stages, and one sweep end to end with the real train and evaluate on the tiny verifier
(2 trials x 1 step, measured on the selection split, the winner on the test split)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from harness.config import load_config, parse_config
from harness.errors import ConfigError, UsageError
from harness.events import Evaluation
from harness.host_helpers.run_queue import competes
from harness.sweep import Sweep, TrialView, choose_winner, grid, parse_sets, placement, sweep_id, winner_lines
from harness.transport import connect
from tests.fixtures.job_project import toml_value
from tests.test_jobs import ssh_project

REPO = Path(__file__).resolve().parents[1]
DEADLINE_S = 240


# -- the grid and the winner -----------------------------------------------------------------------


def test_set_values_are_typed_as_toml_reads_them_and_the_grid_is_every_combination():
    axes = parse_sets(["train.lr=1e-3,3e-4", "train.epochs=5,10", "train.optimizer=adamw,muon", "train.loss-on=all"])
    assert axes == {"train.lr": [0.001, 0.0003], "train.epochs": [5, 10], "train.optimizer": ["adamw", "muon"], "train.loss-on": ["all"]}
    trials = grid(axes)
    assert len(trials) == 8 and [t.name for t in trials] == [f"t{i}" for i in range(8)]
    assert trials[0].flags == {"lr": 0.001, "epochs": 5, "optimizer": "adamw", "loss_on": "all"}
    assert trials[1].flags["optimizer"] == "muon" and trials[2].flags["epochs"] == 10 and trials[4].flags["lr"] == 0.0003  # first axis slowest
    assert grid({}) == []


@pytest.mark.parametrize("bad, says", [
    ("train.lr", "expected STAGE.FLAG=VALUE"), ("train.lr=", "expected STAGE.FLAG=VALUE"), ("evaluate.max_prompts=4,8", "varies train flags"),
    ("lr=1e-3", "varies train flags"), ("train.output=a,b", "sets train.output itself"), ("train.hidden-states=x", "sets train.hidden-states itself"),
])
def test_a_bad_axis_is_one_clear_error(bad, says):
    with pytest.raises(UsageError, match=says):
        parse_sets([bad])


def view(name: str, state: str, tau: float | None) -> TrialView:
    return TrialView(name, {"lr": name}, None, "r-" + name, state, None, Evaluation(tau) if tau is not None else None, None)


def test_the_winner_is_the_highest_selection_tau_of_the_trials_that_ended_ok_the_first_on_a_tie():
    assert choose_winner([view("t0", "ok", 2.1), view("t1", "ok", 2.4), view("t2", "ok", 2.4), view("t3", "ok", 2.2)]).name == "t1"
    assert choose_winner([view("t0", "failed", None), view("t1", "cancelled", None), view("t2", "ok", 1.5)]).name == "t2"
    assert choose_winner([view("t0", "failed", None), view("t1", "running", None)]) is None
    assert choose_winner([]) is None


def test_a_trial_is_read_from_its_runs_stages():
    """evaluate's finished summary is the trial's tau (per category too); a failed stage's line is its error."""
    from harness.jobs import RunStatus, StageStatus
    from harness.sweep import trial_view

    ok = {"t": 1.0, "stage": "evaluate", "event": "finished", "status": "ok", "tau": 2.5, "split": "selection", "tau_by_category": {"math": {"tau": 2.0, "prompts": 3}}}
    done = RunStatus("r1", "ok", [StageStatus("train", "ok", tau={"step": 9, "tau": 2.7}), StageStatus("evaluate", "ok", last_event=ok)])
    t = trial_view("t0", {"lr": 0.001}, 0, "r1", done)
    assert (t.state, t.tau, t.measured.by_category, t.training_tau, t.error) == ("ok", 2.5, {"math": {"tau": 2.0, "prompts": 3}}, 2.7, None)
    failed = {"t": 1.0, "stage": "evaluate", "event": "finished", "status": "failed", "error": "NoPrompts: chat.jsonl: no rows with split='selection'", "cause": "own"}
    t = trial_view("t1", {}, None, "r2", RunStatus("r2", "failed", [StageStatus("train", "ok"), StageStatus("evaluate", "failed", exit_code=1, last_event=failed)]))
    assert (t.state, t.stage, t.tau, t.error) == ("failed", "evaluate", None, failed["error"])
    assert trial_view("t2", {}, None, "r3", None).state == "not started"


def test_the_winner_is_printed_as_the_train_table_of_harness_toml():
    text = winner_lines({"epochs": 3, "threads": 1}, {"lr": 0.0003, "epochs": 10, "optimizer": "muon", "loss_on": "replies"})
    assert text.splitlines()[0] == "[pipeline.stages.train]"
    assert tomllib.loads(text) == {"pipeline": {"stages": {"train": {"epochs": 10, "threads": 1, "lr": 0.0003, "optimizer": "muon", "loss_on": "replies"}}}}


def test_sweep_table_of_the_config_and_the_sweep_id(tmp_path):
    raw = {"hosts": {"box": {"local": True}}, "sweep": {"grid": {"train": {"lr": [1e-3, 3e-4]}}, "gpus": [0, 1]}}
    config = parse_config(raw, tmp_path / "harness.toml")
    assert config.sweep.grid == {"train": {"lr": [1e-3, 3e-4]}} and config.sweep.split == "selection" and config.sweep.gpus == [0, 1]
    with pytest.raises(ConfigError, match="sweep.grid.evaluate"):
        parse_config({**raw, "sweep": {"grid": {"evaluate": {"max_prompts": [4]}}}}, tmp_path / "harness.toml")
    with pytest.raises(ConfigError, match="sweep.grid.train.lr"):
        parse_config({**raw, "sweep": {"grid": {"train": {"lr": 1e-3}}}}, tmp_path / "harness.toml")
    axes = {"train.lr": [1e-3, 3e-4]}
    assert sweep_id("box", axes, "selection", config) == sweep_id("box", dict(axes), "selection", config)  # the same command: the same sweep
    assert len({sweep_id("box", axes, "selection", config), sweep_id("box", {"train.lr": [1e-3]}, "selection", config),
                sweep_id("box", axes, "heldout", config), sweep_id("gpu", axes, "selection", config)}) == 4


def test_trials_go_round_robin_over_the_gpus_then_over_the_slots_of_each():
    assert placement(5, [0, 1], 2) == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 0)]
    assert placement(3, [3], 1) == [(3, None)] * 3
    assert placement(3, [], 2) == [(None, 0), (None, 1), (None, 0)]
    with pytest.raises(UsageError, match="per_gpu 0"):
        placement(2, [0], 0)
    # the queue: a slot waits only for runs in its own slot, or in none, on a shared GPU
    assert competes({"gpus": [0], "slot": 0}, [0], 0) and not competes({"gpus": [0], "slot": 1}, [0], 0)
    assert competes({"gpus": [0], "slot": None}, [0], 1) and competes({"gpus": "all"}, [0], 1) and competes({"gpus": [0], "slot": 1}, [0], None)
    assert not competes({"gpus": [1], "slot": 0}, [0], 0)


# -- trials as queued runs, over SSH (the fake stages: the run machinery, not the training) -----------


def harness(config: Path, ssh_host, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "--config", str(config), *args],
                          capture_output=True, text=True, timeout=DEADLINE_S, env={**ssh_host.env(), "COLUMNS": "200"})


def wait_for(read, ok, timeout: float = 90):
    deadline = time.monotonic() + timeout
    while not ok(value := read()):
        assert time.monotonic() < deadline, f"never reached: {value}"
        time.sleep(0.3)
    return value


@pytest.mark.ssh
def test_a_sweep_is_queued_runs_that_cancel_together_and_a_rerun_picks_it_up(tmp_path, ssh_host):
    config_path = ssh_project(tmp_path, ssh_host, {"train": {"lines": 200, "sleep": 200}})
    config = load_config(config_path)
    host = config.host("box")
    transport = connect(host, ssh_host.connect_options())
    try:
        from harness.host import Host

        sweep = Sweep(Host(config, host, lambda _name: transport))
        # A lost link after the plan was written, before any launch: the plan is on the box, no run.
        planned = sweep.plan(parse_sets(["train.lr=1e-3,3e-4,1e-4"]), "selection", [], per_gpu=2)
        assert [t.runs for t in sweep.load(None).trials] == [t.runs for t in planned.trials]
        r = harness(config_path, ssh_host, "sweep", "box", "--set", "train.lr=1e-3,3e-4,1e-4", "--per-gpu", "2", "--detach", "--json")
        assert r.returncode == 0, r.stderr
        first = json.loads(r.stdout)
        assert first["sweep_id"] == planned.sweep_id  # the same sweep, picked up
        assert [t["run_id"] for t in first["trials"]] == [t.run_id for t in planned.trials]
        # one GPU set, two slots: t0 and t1 at once, t2 behind t0 (its slot)
        assert f"run {planned.trials[2].run_id} queued on box (place 1 for all GPUs)" in r.stderr and f"run {planned.trials[1].run_id} started" in r.stderr
        status = wait_for(lambda: harness(config_path, ssh_host, "sweep", "box", "--status", "--json"), lambda p: json.loads(p.stdout)["trials"][0]["state"] == "running")
        assert [t["state"] for t in json.loads(status.stdout)["trials"]] == ["running", "running", "queued"]
        table = harness(config_path, ssh_host, "sweep", "box", "--status")
        assert planned.sweep_id in table.stdout and "0.0003" in table.stdout and "queued" in table.stdout, table.stdout
        # every trial's run reads the same prepared data and hidden states, and writes its own
        # artifact: its lr is in its train key
        run_dir = f"{sweep.runtime.workdir}/runs/{planned.trials[2].run_id}"
        argv = json.loads(transport.get_bytes(f"{run_dir}/train/spec.json"))["command"]
        assert argv[argv.index("--hidden-states") + 1] == "inputs" and argv[argv.index("--lr") + 1] == "0.0001"
        assert argv[argv.index("--output") + 1] == "@artifact:train@"
        assert json.loads(transport.get_bytes(f"{run_dir}/run.json"))["recipes"]["train"]["flags"]["lr"] == 0.0001

        cancel = harness(config_path, ssh_host, "cancel", "box", planned.sweep_id, "--grace", "1")
        assert cancel.returncode == 0, cancel.stderr
        assert cancel.stdout.splitlines() == [f"sweep {planned.sweep_id} t{i}: cancelled" for i in range(3)]
        after = json.loads(harness(config_path, ssh_host, "sweep", "box", "--status", "--json").stdout)
        assert [t["state"] for t in after["trials"]] == ["cancelled"] * 3 and after["done"] and after["winner"] is None
        # Followed now (as `harness sweep` without --detach follows): a cancelled sweep starts
        # nothing and its first view is done, so the follower ends at once.
        heard: list[str] = []
        views = list(sweep.follow(planned.sweep_id, heard.append, poll_s=0))
        assert len(views) == 1 and views[0].done and views[0].winner is None and heard == []

        # The same command again: the cancelled trials start again, as new runs of the same sweep.
        again = harness(config_path, ssh_host, "sweep", "box", "--set", "train.lr=1e-3,3e-4,1e-4", "--detach", "--json")
        assert again.returncode == 0, again.stderr
        resumed = json.loads(again.stdout)
        assert resumed["sweep_id"] == planned.sweep_id
        assert not {t["run_id"] for t in resumed["trials"]} & {t.run_id for t in planned.trials}
        assert [len(t.runs) for t in sweep.load(planned.sweep_id).trials] == [2, 2, 2]
        assert harness(config_path, ssh_host, "cancel", "box", planned.sweep_id, "--grace", "1").returncode == 0
        bad = harness(config_path, ssh_host, "sweep", "box", "--status", "--id", "sweep-nonesuch")
        assert bad.returncode == 2 and bad.stderr.startswith("harness: error: invalid sweep id") and len(bad.stderr.splitlines()) == 1
    finally:
        transport.close()


# -- end to end: the real train and evaluate on the tiny verifier --------------------------------------


def selection_data(source: Path, dest: Path) -> None:
    """The fixture's chat data with half of its held-out rows as the selection split, and categories
    (chat, qa, chat, ... in each split); a held-out row cut after its first reply is one prompt."""
    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    heldout = [r for r in rows if r.get("split") == "heldout"]
    for i, r in enumerate(heldout):
        r["split"] = "selection" if i % 2 else "heldout"
        r["category"] = "chat" if i % 4 < 2 else "qa"
        first_reply = next(j for j, m in enumerate(r["messages"]) if m["role"] == "assistant")
        r["messages"] = r["messages"][: first_reply + 1]
    dest.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.ssh
@pytest.mark.pipeline
@pytest.mark.slow
def test_a_sweep_trains_each_recipe_on_the_same_hidden_states_and_names_the_winner(tmp_path, ssh_host, tiny_verifier, prepared_data, hidden_states):
    work = tmp_path / "work"
    (work / "outputs").mkdir(parents=True)
    (work / "remote_scripts").symlink_to(REPO / "remote_scripts")
    (work / "outputs" / "prepared").symlink_to(prepared_data)  # made elsewhere: train reads them by path (an input from outside the store)
    (work / "outputs" / "hidden_states").symlink_to(hidden_states)
    selection_data(tiny_verifier.data, work / "outputs" / "chat.jsonl")
    config_path = tmp_path / "harness.toml"
    stages = {"train": {"epochs": 1, "max_steps": 1, "total_seq_len": 256, "threads": 1, "prepared": "outputs/prepared", "hidden_states": "outputs/hidden_states"},
              "evaluate": {"max_prompts": 2, "max_new_tokens": 8, "threads": 1}}
    config_path.write_text("\n".join([
        "[hosts.box]", f'ssh = "{ssh_host.alias}"', f'workdir = "{work}"', f'python = "{sys.executable}"', "connect_timeout = 5",
        "[pipeline]", f'verifier = "{tiny_verifier.verifier}"', 'data = "outputs/chat.jsonl"',
        *(line for stage, flags in stages.items() for line in [f"[pipeline.stages.{stage}]", *(f"{k} = {toml_value(v)}" for k, v in flags.items())]),
        "[sweep.grid.train]", "lr = [1e-3, 0.0]",
    ]) + "\n")
    # Two trials at once, one per (nominal) GPU; followed to the end; JSON at the end.
    r = harness(config_path, ssh_host, "sweep", "box", "--gpus", "0,1", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout)
    sid = result["sweep_id"]
    assert result["done"] and [t["state"] for t in result["trials"]] == ["ok", "ok"], result
    assert [t["gpu"] for t in result["trials"]] == [0, 1]
    assert [line.endswith("started on box") for line in r.stderr.splitlines() if line.startswith("trial ")] == [True, True]  # t1 not queued behind t0
    for t in result["trials"]:
        assert set(t["tau_by_category"]) == {"chat", "qa"}
    winner = result["winner"]
    best = max(result["trials"], key=lambda t: t["tau"])
    assert winner["tau"] == best["tau"] and winner["flags"] == {"lr": best["flags"]["lr"]}
    assert tomllib.loads(winner["harness_toml"])["pipeline"]["stages"]["train"] == {**stages["train"], "lr": winner["flags"]["lr"]}
    test = winner["test"]
    assert test["state"] == "ok" and set(test["tau_by_category"]) == {"chat", "qa"}
    def report(run_id: str) -> dict:  # evaluate's artifact of that run (run.json names it)
        evaluate = json.loads((work / "runs" / run_id / "run.json").read_text())["artifacts"]["evaluate"]
        return json.loads((Path(evaluate["path"]) / "report.json").read_text())

    reports = {"t0/eval": report(result["trials"][0]["run_id"]), "t1/eval": report(result["trials"][1]["run_id"]), f"{winner['trial']}/test": report(test["run_id"])}
    trains = {json.loads((work / "runs" / t["run_id"] / "run.json").read_text())["artifacts"]["train"]["key"] for t in result["trials"]}
    assert len(trains) == 2  # each trial trained its own draft; the test run read the winner's, by its key
    test_record = json.loads((work / "runs" / test["run_id"] / "run.json").read_text())
    assert test_record["artifacts"]["train"]["role"] == "read" and test_record["artifacts"]["train"]["key"] in trains
    # Each tau the sweep shows is its run's evaluate report's, and that one the report's own counts'.
    assert [t["tau"] for t in result["trials"]] + [test["tau"]] == [round(r["tau"], 4) for r in reports.values()]
    for r in reports.values():
        assert r["tau"] == pytest.approx((r["generated_tokens"] - r["prompts"]) / r["rounds"], abs=1e-4)
    assert {n: r["extra"]["split"] for n, r in reports.items()} == {"t0/eval": "selection", "t1/eval": "selection", f"{winner['trial']}/test": "heldout"}
    assert {n: r["by_category"]["chat"]["prompts"] + r["by_category"]["qa"]["prompts"] for n, r in reports.items()} == {n: r["prompts"] for n, r in reports.items()}
    # Shown again (a later laptop): the table with its winner and the lines for harness.toml.
    shown = harness(config_path, ssh_host, "sweep", "box", "--status")
    assert shown.returncode == 0 and f"{winner['trial']} *" in shown.stdout and "[pipeline.stages.train]" in shown.stdout, shown.stdout
    # Running it again starts nothing: every trial and the test run ended.
    again = harness(config_path, ssh_host, "sweep", "box", "--gpus", "0,1", "--detach")
    assert again.returncode == 0 and again.stdout.strip() == sid and not [line for line in again.stderr.splitlines() if " run " in line], again.stderr

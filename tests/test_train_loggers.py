"""Training loggers (remote_scripts/common/loggers.py, train_draft.py --loggers): a real short
training writes TensorBoard event files under the run's logger directory; a logger whose package
is missing is one line before anything is built; W&B's mode and MLflow's store are decided before
training, by rules tested here without a network."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import pytest

from harness.config import PipelineConfig
from harness.pipeline import stage_argv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))
from common import loggers  # noqa: E402
from tests.fixtures.pipeline_data import read_events, run_script  # noqa: E402


def test_the_config_passes_loggers_to_the_train_stage():
    argv = stage_argv("train", PipelineConfig(stages={"train": {"loggers": ["tensorboard", "wandb"]}}))
    assert argv[argv.index("--loggers"):][:3] == ["--loggers", "tensorboard", "wandb"]


def test_a_missing_package_is_named_in_one_line():
    installed = {"tensorboard"}
    loggers.check_installed(["tensorboard"], find_spec=lambda name: name if name in installed else None)
    with pytest.raises(loggers.LoggerError) as e:
        loggers.check_installed(["tensorboard", "wandb", "mlflow"], find_spec=lambda name: name if name in installed else None)
    assert str(e.value).startswith("loggers wandb, mlflow: package wandb mlflow is not installed where the train stage runs")
    assert "\n" not in str(e.value)


def test_wandb_goes_offline_where_its_server_cannot_be_reached():
    asked: list[str] = []

    def unreachable(url: str) -> bool:
        asked.append(url)
        return False

    extra, messages = loggers.prepare_env(["wandb"], "/w/ck/logs", {}, can_reach=unreachable)
    assert extra == {"WANDB_MODE": "offline"} and asked == [loggers.WANDB_DEFAULT_URL]
    assert len(messages) == 1 and "/w/ck/logs/wandb" in messages[0] and "wandb sync" in messages[0]
    # a user's own choice stands, and the network is not asked
    assert loggers.prepare_env(["wandb"], "/l", {"WANDB_MODE": "online"}, can_reach=unreachable) == ({}, [])
    assert len(asked) == 1
    # its own server (WANDB_BASE_URL) is the one asked
    loggers.prepare_env(["wandb"], "/l", {"WANDB_BASE_URL": "https://wandb.example.internal"}, can_reach=unreachable)
    assert asked[-1] == "https://wandb.example.internal"


def test_wandb_online_without_a_key_is_one_line_before_training(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login
    with pytest.raises(loggers.LoggerError, match="no WANDB_API_KEY where the train stage runs"):
        loggers.prepare_env(["wandb"], "/l", {}, can_reach=lambda url: True)
    assert loggers.prepare_env(["wandb"], "/l", {"WANDB_API_KEY": "k"}, can_reach=lambda url: True) == ({}, [])


def test_mlflow_writes_under_the_logger_directory_unless_told_otherwise():
    assert loggers.prepare_env(["mlflow"], "/w/ck/logs", {}) == ({"MLFLOW_TRACKING_URI": "file:/w/ck/logs/mlruns"}, [])
    assert loggers.prepare_env(["mlflow"], "/l", {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}) == ({}, [])
    assert loggers.prepare_env(["tensorboard"], "/l", {}, can_reach=lambda url: pytest.fail("asked")) == ({}, [])


def _train(tiny_verifier, prepared_data, hidden_states, out: Path, events: Path, *extra: str, check: bool = True):
    return run_script(
        "train_draft.py",
        "--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--hidden-states", hidden_states, "--output", out,
        "--total-seq-len", "256", "--threads", "1", "--events", events, *extra, check=check,
    )


def test_a_logger_without_its_package_fails_before_training(tiny_verifier, prepared_data, hidden_states, tmp_path):
    missing = next((n for n in ("wandb", "mlflow", "trackio") if importlib.util.find_spec(n) is None), None)
    if missing is None:
        pytest.skip("every logger package is installed here")
    out, events = tmp_path / "checkpoints", tmp_path / "events.jsonl"
    started = time.monotonic()
    proc = _train(tiny_verifier, prepared_data, hidden_states, out, events, "--loggers", "tensorboard", missing, check=False)
    assert proc.returncode == 1
    finished = read_events(events)[-1]
    assert finished["status"] == "failed" and "\n" not in finished["error"], finished
    assert finished["error"] == f"LoggerError: logger {missing}: package {missing} is not installed where the train stage runs; " \
                                f'install it there (docker hosts: container.build_args = {{ EXTRA_PIP_PACKAGES = "{missing}" }}, then harness build) ' \
                                "or remove it from loggers"
    assert not out.exists()  # nothing was built, nothing written
    assert time.monotonic() - started < 120  # a hang guard, not a speed claim


@pytest.mark.slow
def test_a_real_training_writes_tensorboard_events_under_the_logger_directory(tiny_verifier, prepared_data, hidden_states, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, events = tmp_path / "checkpoints", tmp_path / "events.jsonl"
    _train(tiny_verifier, prepared_data, hidden_states, out, events, "--loggers", "tensorboard", "--run-name", "first",
           "--epochs", "1", "--max-steps", "3")
    assert read_events(events)[-1]["status"] == "ok"
    run_dir = out / loggers.LOG_DIR / "first"
    assert list(run_dir.glob("events.out.tfevents.*")), sorted(p.name for p in out.rglob("*"))
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    losses = acc.Scalars("train/loss")
    assert [e.step for e in losses] == [0, 1, 2] and all(e.value > 0 for e in losses), [(e.step, e.value) for e in losses]
    assert any(tag.startswith("val/") for tag in acc.Tags()["scalars"]), acc.Tags()["scalars"]

"""Training loggers (remote_scripts/common/loggers.py, train_draft.py --loggers): a real short
training through `harness run` on a host without network logs to TensorBoard, W&B (offline),
MLflow and Trackio under the run's logger directory, and `harness pull` brings them; a logger whose
package is missing is one line before anything is built; W&B's mode and MLflow's and Trackio's
stores are decided before training, by rules tested here without a network."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.config import PipelineConfig
from harness.pipeline import stage_argv

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "remote_scripts"))
from common import loggers  # noqa: E402
from tests.fixtures import logger_stores  # noqa: E402
from tests.fixtures import requires  # noqa: E402
from tests.fixtures.beds import bed_unavailable  # noqa: E402
from tests.fixtures.pipeline_data import REPO_ROOT, offline_env, read_events, run_script  # noqa: E402
from tests.test_jobs import assert_secret_absent  # noqa: E402


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


def test_mlflow_and_trackio_write_under_the_logger_directory_unless_told_otherwise():
    assert loggers.prepare_env(["mlflow"], "/w/ck/logs", {}) == ({"MLFLOW_TRACKING_URI": "sqlite:////w/ck/logs/mlflow.db"}, [])
    assert loggers.prepare_env(["mlflow"], "/l", {"MLFLOW_TRACKING_URI": "http://mlflow:5000"}) == ({}, [])
    assert loggers.prepare_env(["trackio"], "/w/ck/logs", {}) == ({"TRACKIO_DIR": "/w/ck/logs/trackio"}, [])
    for own in ("TRACKIO_DIR", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):  # the user's store or server stands
        assert loggers.prepare_env(["trackio"], "/l", {own: "x"}) == ({}, [])
    assert loggers.prepare_env(["tensorboard"], "/l", {}, can_reach=lambda url: pytest.fail("asked")) == ({}, [])


def test_finish_leaves_no_link_leading_out_of_the_logger_directory(tmp_path):
    """wandb-core links <run>/logs/debug-core.log to its log in ~/.cache by absolute path:
    `harness pull` refuses such a link, so finish replaces it by a copy."""
    logs, outside = tmp_path / "logs", tmp_path / "cache"
    (logs / "wandb" / "offline-run-1" / "logs").mkdir(parents=True)
    outside.mkdir()
    (outside / "core-debug.log").write_text("core log\n")
    run_logs = logs / "wandb" / "offline-run-1" / "logs"
    (run_logs / "debug-core.log").symlink_to(outside / "core-debug.log")
    (run_logs / "gone.log").symlink_to(outside / "never-written.log")
    (logs / "wandb" / "latest-run").symlink_to("offline-run-1")  # inside: kept as a link
    loggers.finish(str(logs))
    assert not (run_logs / "debug-core.log").is_symlink() and (run_logs / "debug-core.log").read_text() == "core log\n"
    assert not (run_logs / "gone.log").exists() and not (run_logs / "gone.log").is_symlink()
    assert (logs / "wandb" / "latest-run").is_symlink()
    assert sorted(p.name for p in run_logs.iterdir()) == ["debug-core.log"]  # no temporary left


def _train(tiny_verifier, prepared_data, hidden_states, out: Path, events: Path, *extra: str, check: bool = True, env: dict[str, str] | None = None):
    return run_script(
        "train_draft.py",
        "--verifier", tiny_verifier.verifier, "--prepared", prepared_data, "--hidden-states", hidden_states, "--output", out,
        "--total-seq-len", "256", "--threads", "1", "--events", events, *extra, check=check, env=env,
    )


def test_a_logger_without_its_package_fails_before_training(tiny_verifier, prepared_data, hidden_states, tmp_path):
    """mlflow hidden from the stage's interpreter (sys.modules["mlflow"] = None: what find_spec and
    import see for an absent package), whether or not it is installed here."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text('import sys\nsys.modules["mlflow"] = None\n')
    out, events = tmp_path / "checkpoints", tmp_path / "events.jsonl"
    started = time.monotonic()
    proc = _train(tiny_verifier, prepared_data, hidden_states, out, events, "--loggers", "tensorboard", "mlflow", check=False,
                  env=offline_env(PYTHONPATH=os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 1
    finished = read_events(events)[-1]
    assert finished["status"] == "failed" and "\n" not in finished["error"], finished
    assert finished["error"] == "LoggerError: logger mlflow: package mlflow is not installed where the train stage runs; " \
                                'install it there (docker hosts: container.build_args = { EXTRA_PIP_PACKAGES = "mlflow" }, then harness build) ' \
                                "or remove it from loggers"
    assert not out.exists()  # nothing was built, nothing written
    assert time.monotonic() - started < 120  # a hang guard, not a speed claim


def require_logger_packages() -> None:
    missing = [p for p in loggers.PACKAGES.values() if importlib.util.find_spec(p) is None]
    if missing:
        requires.missing(f"logger packages not installed: {' '.join(missing)}")


def no_network_prefix() -> list[str]:
    """A command prefix that runs its command in a new network namespace with only loopback up:
    nothing it starts can reach (or even attempt) another machine."""
    prefix = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        bed_unavailable("network namespace", probe.stderr.strip() or f"unshare exited {probe.returncode}")
    return prefix


@pytest.mark.slow
def test_every_logger_writes_under_the_run_offline_and_comes_back_with_pull(tiny_verifier, prepared_data, hidden_states, tmp_path):
    """`harness run local train` with all four loggers on a host with no network (a namespace with
    only loopback), WANDB_API_KEY passed by name; then `harness pull local last`. W&B finds its
    server unreachable and goes offline; every logger writes under checkpoints/logs/ (none in the
    working directory or the home), the pull brings them, and each store holds the same loss curve."""
    require_logger_packages()
    prefix = no_network_prefix()
    project, workdir, home = tmp_path / "project", tmp_path / "work", tmp_path / "home"
    shutil.copytree(REPO_ROOT / "remote_scripts", project / "remote_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    home.mkdir()
    train = {"prepared": str(prepared_data), "hidden_states": str(hidden_states), "total_seq_len": 256, "threads": 1, "epochs": 1,
             "max_steps": 3, "loggers": sorted(loggers.PACKAGES), "run_name": "first"}
    config = project / "harness.toml"
    config.write_text("\n".join([
        "[hosts.local]", "local = true", f"workdir = {json.dumps(str(workdir))}", 'runtime = "host"', f"python = {json.dumps(sys.executable)}",
        'env = ["WANDB_API_KEY"]', "[sync]", 'paths = ["remote_scripts"]', "[pipeline]", f"verifier = {json.dumps(str(tiny_verifier.verifier))}",
        "[pipeline.stages.train]", *(f"{k} = {json.dumps(v)}" for k, v in train.items()),
    ]) + "\n")
    secret = "wandb-key-" + os.urandom(8).hex()
    env = offline_env(WANDB_API_KEY=secret, HOME=str(home), MLFLOW_DISABLE_TELEMETRY="true")  # MLflow's usage report
    env.pop("WANDB_MODE", None)

    def harness(*args: str, cmd_prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
        return subprocess.run([*cmd_prefix, sys.executable, "-m", "harness", "--config", str(config), *args],
                              capture_output=True, text=True, env=env, cwd=project, timeout=900)

    assert harness("sync", "local").returncode == 0
    run = harness("run", "local", "train", cmd_prefix=tuple(prefix))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    pulled = tmp_path / "pulled"
    pull = harness("pull", "local", "last", str(pulled))
    assert pull.returncode == 0, pull.stderr

    logs = pulled / "outputs" / "checkpoints" / loggers.LOG_DIR
    train_log = (pulled / "train" / "log").read_text()  # the run directory's stage log
    assert f"W&B: {loggers.WANDB_DEFAULT_URL} cannot be reached from this host: logging offline to " in train_log
    tensorboard_curve, tensorboard_tags = logger_stores.tensorboard_scalars(logs / "first")
    assert any(tag.startswith("val/") for tag in tensorboard_tags), tensorboard_tags
    curves = {
        "tensorboard": tensorboard_curve,
        "wandb": logger_stores.wandb_offline_losses(logs / "wandb"),
        "mlflow": logger_stores.mlflow_losses(logs / "mlflow.db", "first"),
        "trackio": logger_stores.trackio_losses(logs / "trackio", "first"),
    }
    assert sorted(curves["tensorboard"]) == [0, 1, 2] and all(v > 0 for v in curves["tensorboard"].values()), curves
    for name, curve in curves.items():  # TensorBoard stores float32
        assert curve == pytest.approx(curves["tensorboard"], rel=1e-6), (name, curves)
    # nothing beside the run's outputs: not MLflow's default ./mlflow.db or ./mlruns, not trackio's ~/.cache/huggingface/trackio
    assert not [p for p in (workdir / "mlflow.db", workdir / "mlruns", project / "mlflow.db", project / "mlruns") if p.exists()]
    assert not (home / ".cache" / "huggingface" / "trackio").exists()
    assert (logs / "wandb" / "latest-run" / "logs" / "debug-core.log").is_file()  # a copy, not wandb-core's link out of the run
    for root in (workdir, pulled, home):
        assert_secret_absent(root, secret)

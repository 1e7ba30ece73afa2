"""[pipeline.stages.X] checked at config load against each stage script's own parser
(harness/stage_options.py): a typo in a table name or an option, or a value the option refuses,
is one line with the nearest name, exit 2, for every command that reads the config."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.config import load_config
from harness.errors import ConfigError
from harness.pipeline import STAGES, default_args, to_flags
from harness.config import PipelineConfig

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def project(tmp_path) -> Path:
    """A project as `harness init` wants it: the real remote_scripts/ beside harness.toml."""
    shutil.copytree(REPO / "remote_scripts", tmp_path / "remote_scripts", ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def config_with(project: Path, stages: str) -> Path:
    path = project / "harness.toml"
    path.write_text('[hosts.gpu]\nssh = "u@h"\n' + stages)
    return path


@pytest.mark.parametrize("stages, key, problem", [
    ("[pipeline.stages.trian]\nepochs = 2\n", "[pipeline.stages.trian]", "no stage 'trian' (did you mean 'train'?)"),
    ("[pipeline.stages.train]\nepoch = 2\n", "[pipeline.stages.train] epoch", "train_draft.py takes no --epoch (did you mean 'epochs'?)"),
    # no name near it: the option whose help names the words ("peak learning rate")
    ("[pipeline.stages.train]\nlearning_rate = 1e-4\n", "[pipeline.stages.train] learning_rate", "train_draft.py takes no --learning-rate (did you mean 'lr'?)"),
    ("[pipeline.stages.train]\nepochs = \"ten\"\n", "[pipeline.stages.train] epochs", "invalid value 'ten' for --epochs"),
    ("[pipeline.stages.prepare]\nstrict = 1\n", "[pipeline.stages.prepare] strict", "expected true or false (a flag), got 1"),
    ("[pipeline.stages.prepare]\nmax_seq_len = [1, 2]\n", "[pipeline.stages.prepare] max_seq_len", "expected one value, got a list"),
    ("[pipeline.stages.extract]\nbackend = \"vlm\"\n", "[pipeline.stages.extract] backend", "invalid value 'vlm' (choices: transformers, vllm) (did you mean 'vllm'?)"),
])
def test_a_wrong_table_option_or_value_is_one_error_with_the_nearest_name(project, stages, key, problem):
    path = config_with(project, stages)
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert e.value.key == key
    assert e.value.problem.startswith(problem), e.value.problem


def test_options_the_scripts_take_pass(project):
    config = load_config(config_with(project, "[pipeline.stages.train]\nepochs = 2\nlr = 1e-4\nonline = false\n"
                                              "[pipeline.stages.extract]\nlayers = [2, 5]\n"))
    assert config.pipeline.stages["train"] == {"epochs": 2, "lr": 1e-4, "online": False}


@pytest.mark.parametrize("command", [["hosts"], ["doctor", "gpu"], ["run", "gpu", "train", "--dry-run"]])
def test_every_command_refuses_it_before_connecting(project, command):
    config_with(project, "[pipeline.stages.trian]\nepochs = 2\n")
    r = subprocess.run([sys.executable, "-m", "harness", *command], cwd=project, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"harness: error: {project / 'harness.toml'}: [pipeline.stages.trian]: no stage 'trian' (did you mean 'train'?) (stages: {', '.join(STAGES)})"]


def test_without_remote_scripts_beside_the_config_only_stage_names_are_checked(tmp_path):
    # the box's code was not synced from here (it is already there): only it can check the options
    load_config(config_with(tmp_path, "[pipeline.stages.train]\nanything = 1\n"))
    with pytest.raises(ConfigError, match="no stage 'trian'"):
        load_config(config_with(tmp_path, "[pipeline.stages.trian]\nanything = 1\n"))


def test_a_script_without_build_parser_is_refused_not_executed(project):
    (project / "remote_scripts" / "train_draft.py").write_text("raise SystemExit('executed')\n")
    with pytest.raises(ConfigError, match="defines no build_parser"):
        load_config(config_with(project, "[pipeline.stages.train]\nepochs = 2\n"))


def test_the_flags_harness_passes_are_the_ones_each_parser_takes():
    """The other direction of the same seam: every flag of pipeline.default_args parses."""
    from harness.stage_options import stage_parser

    p = PipelineConfig(target_layer_ids=[2, 5], trust_remote_code=True)
    for stage, spec in STAGES.items():
        parser = stage_parser(REPO / "remote_scripts" / spec.script)
        args = {**default_args(stage, p), "events": "e.jsonl"}
        parser.parse_args(to_flags(args))  # exits (SystemExit) on a flag the script does not take


def test_false_turns_off_a_flag_that_is_on_by_default(project):
    """`baseline = false` (docs/pipeline.md) reaches serve_check as --no-baseline; false for a
    store_true flag stays absent; both parse to what the table says."""
    from harness.pipeline import stage_argv
    from harness.stage_options import stage_options, stage_parser

    config = load_config(config_with(project, "[pipeline.stages.serve_check]\nbaseline = false\nenforce_eager = false\n"))
    script = STAGES["serve_check"].script
    argv = stage_argv("serve_check", config.pipeline, options=stage_options(config.path, script))
    assert "--no-baseline" in argv and "--enforce-eager" not in argv and "--no-enforce-eager" not in argv
    parsed = stage_parser(project / "remote_scripts" / script).parse_args(argv[2:])
    assert parsed.baseline is False and parsed.enforce_eager is False


def test_loading_the_parsers_imports_nothing_heavy_and_leaves_the_process_as_it_was():
    code = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "from harness.pipeline import STAGES\n"
        "from harness.stage_options import stage_parser\n"
        "path, mods = list(sys.path), set(sys.modules)\n"
        f"[stage_parser(Path({str(REPO / 'remote_scripts')!r}) / s.script) for s in STAGES.values()]\n"
        "new = sorted(m for m in set(sys.modules) - mods if m.split('.')[0] in ('torch', 'transformers', 'datasets', 'numpy', 'common', 'vllm', 'speculators') or m.startswith('_harness_stage'))\n"
        "print(json.dumps({'path_same': sys.path == path, 'new': new}))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"path_same": True, "new": []}


def test_what_the_parsers_take_is_kept_until_the_code_changes(project, monkeypatch):
    import harness.stage_options as stage_options

    path = config_with(project, "[pipeline.stages.train]\nepochs = 2\n")
    load_config(path)
    assert json.loads((project / ".harness" / "stage-options.json").read_text())["scripts"]["train_draft.py"]["epochs"]["type"] == "int"
    loads = []
    real = stage_options.stage_parser
    monkeypatch.setattr(stage_options, "stage_parser", lambda script: loads.append(script.name) or real(script))
    load_config(path)
    assert loads == []  # unchanged code: no script loaded
    common = project / "remote_scripts" / "common" / "vllm_server.py"  # train's parser takes options from it
    common.write_text(common.read_text() + "\n# edited\n")
    load_config(path)
    assert loads == ["train_draft.py"]

"""The stage graph: which script each stage runs, with which arguments, in which order (the
table of stages and chains itself is pure data in harness.stages).

A stage is a plain command line (`python remote_scripts/<script>.py --flag value ...`) that any
engineer can also run by hand on the GPU box. Paths are relative to the host's workdir (the
job's working directory) unless absolute. `[pipeline.stages.<name>]` tables in harness.toml add or
override flags: `epochs = 20` -> `--epochs 20`, `compile = true` -> `--compile`,
`layers = [2, 5]` -> `--layers 2 5`.

Online training (`[pipeline.stages.train] online = true`): train starts vLLM itself and asks it for
the hidden states (remote_scripts/train_draft.py --online), so the chains leave out extract, train
gets no --hidden-states, and jobs does not wrap it in torchrun (its launcher runs torchrun over the
training GPUs beside the server's).
"""

from __future__ import annotations

from typing import Any

from harness.config import PipelineConfig
from harness.errors import UsageError, did_you_mean
from harness.stages import CHAIN_NAMES, DEFAULT_CHAIN, DEMO_CHAIN, REMOTE_CODE_STAGES, SCRIPTS_DIR, STAGES

ARTIFACTS_DIR = "artifacts"  # the store, under the pipeline's output_dir


def artifact_token(stage: str) -> str:
    """What a stage's command line says for another stage's artifact (or its own --output): the
    supervisor makes it the artifact's path once its key is known on the host."""
    return f"@artifact:{stage}@"


def artifact_arg(stage: str) -> str:
    """The --output of `stage`, or the flag value that reads it: its artifact's directory, or
    the file inside it."""
    file = STAGES[stage].output_file
    return artifact_token(stage) + (f"/{file}" if file else "")


def store_root(p: PipelineConfig) -> str:
    """The artifact store: relative to the workdir unless output_dir is absolute."""
    return f"{p.output_dir.rstrip('/')}/{ARTIFACTS_DIR}"


def online_training(p: PipelineConfig) -> bool:
    """`[pipeline.stages.train] online = true`: the draft trains from a running vLLM, no extract stage."""
    return p.stages.get("train", {}).get("online") is True


def launches_itself(stage: str, p: PipelineConfig) -> bool:
    """A distributed stage that starts its own torchrun (train --online: beside its vLLM server)."""
    return stage == "train" and online_training(p)


def default_args(stage: str, p: PipelineConfig) -> dict[str, Any]:
    """The flags the harness passes to a stage, before the config's overrides. What a stage
    reads of another, and its own --output, is that stage's artifact (artifact_arg)."""
    layers = {"layers": p.target_layer_ids} if p.target_layer_ids else {}
    stage_def = STAGES.get(stage)
    by_stage: dict[str, dict[str, Any]] = {
        "verifier": {"output": p.verifier, "data_out": p.data},
        "regenerate": {"verifier": p.verifier, "data": p.data},
        "prepare": {"verifier": p.verifier, "data": p.data, "max_seq_len": p.max_seq_len},
        "extract": {"verifier": p.verifier, **layers},
        "train": {"verifier": p.verifier, "speculative_tokens": p.speculative_tokens},
        "evaluate": {"verifier": p.verifier, "data": p.data, "speculative_tokens": p.speculative_tokens},
        "export": {"verifier": p.verifier},
        "serve_check": {"data": p.data},
        "dist_check": {},
    }
    args = {**by_stage[stage], **{flag: artifact_arg(upstream) for flag, upstream in (stage_def.reads if stage_def else ())}}
    if stage_def is not None and stage_def.keyed:
        args["output"] = artifact_arg(stage)
    if stage == "train" and online_training(p):
        del args["hidden_states"]
        args.update(layers)  # the layers vLLM saves; offline train reads them from extract's record
    if stage in REMOTE_CODE_STAGES:
        args["trust_remote_code"] = p.trust_remote_code  # False: no flag
    return args


def keeps_artifact(stage: str, p: PipelineConfig) -> bool:
    """Whether the stage's output is an artifact of the store: a keyed stage, unless a config made
    in code (a bench's) gives it an --output of its own (a file's config may not: stage_options)."""
    return STAGES[stage].keyed and "output" not in p.stages.get(stage, {})


def stage_args(stage: str, p: PipelineConfig) -> dict[str, Any]:
    """The stage's flags as its command line gets them: the harness's, the config's over them; a
    flag that reads a stage which keeps no artifact names that stage's own --output."""
    args = {**default_args(stage, p), **p.stages.get(stage, {})}
    for flag, upstream in STAGES[stage].reads if stage in STAGES else ():
        if args.get(flag) == artifact_arg(upstream) and not keeps_artifact(upstream, p):
            output = str(p.stages[upstream]["output"])
            args[flag] = f"{output}/{STAGES[upstream].output_file}" if STAGES[upstream].output_file else output
    return args


def to_flags(args: dict[str, Any], options: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """{"max_seq_len": 256, "compile": True, "layers": [2, 5]} -> ["--max-seq-len", "256", "--compile", "--layers", "2", "5"].
    False is left out, except where the script's parser (`options`: stage_options) has --no-KEY: a
    flag on by default (`baseline = false` -> --no-baseline)."""
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is False and options is not None and f"no_{key}" in options:
            argv.append("--no-" + key.replace("_", "-"))
            continue
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            argv += [flag, *(str(v) for v in value)]
        elif str(value).startswith("-"):  # `vllm_arg = "--enforce-eager"`: argparse would read "--flag --x" as two options
            argv.append(f"{flag}={value}")
        else:
            argv += [flag, str(value)]
    return argv


def stage_argv(stage: str, p: PipelineConfig, python: str = "python3", events_path: str | None = None,
               options: dict[str, dict[str, Any]] | None = None) -> list[str]:
    """The command line of one stage (without a torchrun launcher; see jobs for that); `options`:
    its script's (stage_options), where known."""
    if stage not in STAGES:
        raise unknown_stage(stage)
    args = stage_args(stage, p)
    if events_path:
        args["events"] = events_path
    return [python, f"{SCRIPTS_DIR}/{STAGES[stage].script}", *to_flags(args, options)]


def resolve_chain(requested: list[str], p: PipelineConfig | None = None) -> list[str]:
    """Validate stage names; "all" means the default chain (without extract when training is
    online). Order is kept as given."""
    if not requested or requested in (["all"], ["demo"]):
        chain = DEMO_CHAIN if requested == ["demo"] else DEFAULT_CHAIN
        return [s for s in chain if not (s == "extract" and p is not None and online_training(p))]
    unknown = [s for s in requested if s not in STAGES]
    if unknown:
        raise unknown_stage(unknown[0])
    return requested


def unknown_stage(name: str) -> UsageError:
    """The error for a stage name that is none: the near match, else where the names are."""
    close = did_you_mean(name, [*STAGES, *CHAIN_NAMES])
    return UsageError(f"unknown stage {name!r}", (close + " " if close else "") + "`harness run --help` lists the stages")

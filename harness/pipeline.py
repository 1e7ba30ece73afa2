"""The stage graph: which script each stage runs, with which arguments, in which order.

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

from dataclasses import dataclass
from typing import Any

from harness.config import PipelineConfig
from harness.errors import UsageError, did_you_mean

SCRIPTS_DIR = "remote_scripts"


@dataclass(frozen=True)
class Stage:
    name: str
    script: str  # file under remote_scripts/
    summary: str
    distributed: bool = False  # launched with torchrun over the host's GPUs (and across hosts)


STAGES: dict[str, Stage] = {
    s.name: s
    for s in [
        Stage("verifier", "make_tiny_verifier.py", "build (and briefly train) the tiny demo verifier and its chat data"),
        Stage("regenerate", "regenerate.py", "the verifier writes the assistant replies (rows without one, or all with replace = true)", distributed=True),
        Stage("prepare", "prepare_data.py", "tokenize chat data with the verifier's chat template"),
        Stage("extract", "extract_hidden_states.py", "verifier hidden states -> hs_<i>.safetensors", distributed=True),
        Stage("train", "train_draft.py", "train the EAGLE-3 draft (speculators, flex_attention)", distributed=True),
        Stage("evaluate", "evaluate.py", "acceptance length of the draft against the verifier"),
        Stage("export", "export.py", "a checkpoint vLLM can serve, and its vllm serve command"),
        Stage("serve_check", "serve_check.py", "the export served by vLLM: served acceptance from its counters, tokens/s with and without the draft"),
        # Not in any chain: the multi-node smoke test (real DDP steps that check their results).
        Stage("dist_check", "dist_check.py", "torch.distributed smoke test: all_reduce + DDP steps, checked", distributed=True),
    ]
}
# The full chain on a real verifier: the training chain, then the draft as vLLM serves it
# (serve_check says in one line where vLLM is not installed, or cannot serve the verifier, and
# ends ok). regenerate answers only rows without a reply (unless [pipeline.stages.regenerate]
# replace = true): on data that has replies it copies them, without loading the verifier.
TRAINING_CHAIN = ["regenerate", "prepare", "extract", "train", "evaluate", "export"]
DEFAULT_CHAIN = [*TRAINING_CHAIN, "serve_check"]
# The demo: "verifier", then the training chain; no vLLM servers (two engine starts would add
# minutes on 2 CPU cores): `harness run local serve_check` measures the demo's draft served.
DEMO_CHAIN = ["verifier", *TRAINING_CHAIN]
# The stages that load the verifier, its tokenizer or its config: `[pipeline] trust_remote_code`
# reaches each of them as --trust-remote-code.
REMOTE_CODE_STAGES = ("regenerate", "prepare", "extract", "train", "evaluate", "serve_check")  # export reads only weights


@dataclass(frozen=True)
class StagePaths:
    """Where each stage reads and writes, relative to the workdir."""

    verifier: str
    data: str
    regenerated: str
    prepared: str
    hidden_states: str
    checkpoints: str
    evaluation: str
    export: str

    @classmethod
    def from_config(cls, p: PipelineConfig) -> "StagePaths":
        out = p.output_dir.rstrip("/")
        return cls(
            verifier=p.verifier,
            data=p.data,
            regenerated=f"{out}/regenerated.jsonl",
            prepared=f"{out}/prepared",
            hidden_states=f"{out}/hidden_states",
            checkpoints=f"{out}/checkpoints",
            evaluation=f"{out}/eval",
            export=f"{out}/export",
        )


def online_training(p: PipelineConfig) -> bool:
    """`[pipeline.stages.train] online = true`: the draft trains from a running vLLM, no extract stage."""
    return p.stages.get("train", {}).get("online") is True


def launches_itself(stage: str, p: PipelineConfig) -> bool:
    """A distributed stage that starts its own torchrun (train --online: beside its vLLM server)."""
    return stage == "train" and online_training(p)


def default_args(stage: str, p: PipelineConfig) -> dict[str, Any]:
    """The flags the harness passes to a stage, before the config's overrides."""
    paths = StagePaths.from_config(p)
    layers = {"layers": p.target_layer_ids} if p.target_layer_ids else {}
    by_stage: dict[str, dict[str, Any]] = {
        "verifier": {"output": paths.verifier, "data_out": paths.data},
        "regenerate": {"verifier": paths.verifier, "data": paths.data, "output": paths.regenerated},
        "prepare": {"verifier": paths.verifier, "data": paths.data, "regenerated": paths.regenerated, "output": paths.prepared, "max_seq_len": p.max_seq_len},
        "extract": {"verifier": paths.verifier, "prepared": paths.prepared, "output": paths.hidden_states, **layers},
        "train": {
            "verifier": paths.verifier,
            "prepared": paths.prepared,
            "hidden_states": paths.hidden_states,
            "output": paths.checkpoints,
            "speculative_tokens": p.speculative_tokens,
        },
        "evaluate": {
            "verifier": paths.verifier,
            "draft": paths.checkpoints,
            "data": paths.data,
            "output": paths.evaluation,
            "speculative_tokens": p.speculative_tokens,
        },
        "export": {"draft": paths.checkpoints, "verifier": paths.verifier, "output": paths.export},
        # evaluate's output: its report.json says which prompts it measured; served.json lands beside it
        "serve_check": {"export": paths.export, "data": paths.data, "output": paths.evaluation},
        "dist_check": {},
    }
    if stage == "train" and online_training(p):
        del by_stage["train"]["hidden_states"]
        by_stage["train"].update(layers)  # the layers vLLM saves; offline train reads them from extract's record
    if stage in REMOTE_CODE_STAGES:
        by_stage[stage]["trust_remote_code"] = p.trust_remote_code  # False: no flag
    return by_stage[stage]


def to_flags(args: dict[str, Any]) -> list[str]:
    """{"max_seq_len": 256, "compile": True, "layers": [2, 5]} -> ["--max-seq-len", "256", "--compile", "--layers", "2", "5"]."""
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
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


def stage_argv(stage: str, p: PipelineConfig, python: str = "python3", events_path: str | None = None) -> list[str]:
    """The command line of one stage (without a torchrun launcher; see jobs for that)."""
    if stage not in STAGES:
        raise unknown_stage(stage)
    args = {**default_args(stage, p), **p.stages.get(stage, {})}
    if events_path:
        args["events"] = events_path
    return [python, f"{SCRIPTS_DIR}/{STAGES[stage].script}", *to_flags(args)]


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


CHAIN_NAMES = {"all": "the default chain", "demo": "the demo's chain"}


def unknown_stage(name: str) -> UsageError:
    """The error for a stage name that is none: the near match, else where the names are."""
    close = did_you_mean(name, [*STAGES, *CHAIN_NAMES])
    return UsageError(f"unknown stage {name!r}", (close + " " if close else "") + "`harness run --help` lists the stages")


def stages_help() -> str:
    """The stages and chains, one line each (`harness run --help`, shell completion)."""
    lines = [f"{s.name}: {s.summary}" for s in STAGES.values()]
    lines.append(f"all: {', '.join(DEFAULT_CHAIN)}")
    lines.append(f"demo: {', '.join(DEMO_CHAIN)}")
    return "\n".join(lines)

"""The stage table: each stage's name, script and what it reads, and the chains of stages, as
pure data (no config, no I/O), so the config's checks, the stage graph (harness.pipeline), the
CLI's help and completion all read one table without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

SCRIPTS_DIR = "remote_scripts"


@dataclass(frozen=True)
class Stage:
    name: str
    script: str  # file under remote_scripts/
    summary: str
    distributed: bool = False  # launched with torchrun over the host's GPUs (and across hosts)
    keyed: bool = True  # its output is an artifact of the store, reused while its key matches (harness/artifacts.py)
    reads: tuple[tuple[str, str], ...] = ()  # (flag, stage): the flags that name another stage's artifact
    output_file: str = ""  # the file the stage writes inside its artifact ("": --output is the directory)
    processes_matter: bool = False  # its result depends on the processes it runs on (train's global batch)


STAGES: dict[str, Stage] = {
    s.name: s
    for s in [
        Stage("verifier", "make_tiny_verifier.py", "build (and briefly train) the tiny demo verifier and its chat data", keyed=False),
        Stage("regenerate", "regenerate.py", "the verifier writes the assistant replies (rows without one, or all with replace = true)", distributed=True,
              output_file="regenerated.jsonl"),
        Stage("prepare", "prepare_data.py", "tokenize chat data with the verifier's chat template", reads=(("regenerated", "regenerate"),)),
        Stage("extract", "extract_hidden_states.py", "verifier hidden states -> hs_<i>.safetensors", distributed=True, reads=(("prepared", "prepare"),)),
        Stage("train", "train_draft.py", "train the EAGLE-3 draft (speculators, flex_attention)", distributed=True,
              reads=(("prepared", "prepare"), ("hidden_states", "extract")), processes_matter=True),
        Stage("evaluate", "evaluate.py", "acceptance length of the draft against the verifier", reads=(("draft", "train"),)),
        Stage("export", "export.py", "a checkpoint vLLM can serve, and its vllm serve command", reads=(("draft", "train"),)),
        Stage("serve_check", "serve_check.py", "the export served by vLLM: served acceptance from its counters, tokens/s with and without the draft",
              reads=(("export", "export"), ("evaluation", "evaluate"))),
        # Not in any chain: the multi-node smoke test (real DDP steps that check their results).
        Stage("dist_check", "dist_check.py", "torch.distributed smoke test: all_reduce + DDP steps, checked", distributed=True, keyed=False),
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
# Optional reads: without the artifact (no run made it) the stage goes on without the flag
# (prepare reads the chat data itself when regenerate has not answered it).
OPTIONAL_READS = {("prepare", "regenerated")}
# Flags that name what a stage reads: another stage's artifact (its token), or a file or directory
# from outside the store (identified on the host by its content: artifact_store.identify).
INPUT_FLAGS = ("verifier", "data", "regenerated", "prepared", "hidden_states", "draft", "export", "evaluation", "train_metrics")
# Flags that say where a stage writes, not what: never part of a key.
OUTPUT_FLAGS = ("output", "data_out", "events", "server_log", "staging_dir")
CHAIN_NAMES = {"all": "the default chain", "demo": "the demo's chain"}


def stages_help() -> str:
    """The stages and chains, one line each (`harness run --help`, shell completion)."""
    lines = [f"{s.name}: {s.summary}" for s in STAGES.values()]
    lines.append(f"all: {', '.join(DEFAULT_CHAIN)}")
    lines.append(f"demo: {', '.join(DEMO_CHAIN)}")
    return "\n".join(lines)

"""Export a trained draft as a directory vLLM serves as an EAGLE-3 speculator, and print the command.

    python remote_scripts/export.py --draft CHECKPOINTS --verifier DIR --output EXPORT_DIR [--events FILE]

The directory is speculators' own format, which vLLM reads natively (config.json and
model.safetensors, bf16), with the verifier path made ABSOLUTE, served beside its verifier with
`vllm serve VERIFIER --speculative-config '{"method": "eagle3", "model": EXPORT_DIR, ...}'` from any
directory (vLLM 0.33 refuses `vllm serve EXPORT_DIR` for a verifier on local disk). From the
train stage's output, the checkpoint its best.json names is exported, else the latest epoch's. The checkpoint is loaded back with speculators and run once
before anything lands at --output. The `vllm serve` command is printed and written to
serve_command.txt. What the directory holds: docs/pipeline.md, "Export".
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.checkpoints import WEIGHTS, resolve_draft  # noqa: E402
from common import verifier_path  # noqa: E402
from common.events import EventLog, run_stage  # noqa: E402

STAGE = "export"


class ExportError(RuntimeError):
    """A problem with the inputs, reported as one line."""


def export_config(config: dict[str, Any], verifier: str) -> dict[str, Any]:
    """The checkpoint's config with the verifier recorded as given (an absolute path for a local
    verifier) and checked for what vLLM needs of an EAGLE-3 speculator."""
    out = json.loads(json.dumps(config))  # deep copy
    if out.get("speculators_model_type") != "eagle3":
        raise ExportError(f"not an EAGLE-3 draft: speculators_model_type is {out.get('speculators_model_type')!r}")
    spec = out.get("speculators_config")
    if not isinstance(spec, dict) or not isinstance(spec.get("verifier"), dict):
        raise ExportError("config.json has no speculators_config.verifier")
    if not spec.get("proposal_methods"):
        raise ExportError("config.json has no speculators_config.proposal_methods")
    if "transformer_layer_config" not in out:
        raise ExportError("config.json has no transformer_layer_config")
    spec["verifier"]["name_or_path"] = verifier
    return out


def speculative_tokens(config: dict[str, Any]) -> int:
    spec = config["speculators_config"]
    methods = spec["proposal_methods"]
    default = spec.get("default_proposal_method")
    chosen = next((m for m in methods if m.get("proposal_type") == default), methods[0])
    return int(chosen.get("speculative_tokens", 3))


def serve_commands(verifier: str, export_dir: str, k: int) -> list[list[str]]:
    """The one way every vLLM we meet serves it: `vllm serve EXPORT_DIR` reads the verifier from
    config.json on 0.26 and 0.32, but 0.33 refuses a verifier on local disk
    (transformers_utils/config.py: "Speculators verifier must name a remote model repository")."""
    spec_config = json.dumps({"method": "eagle3", "model": export_dir, "num_speculative_tokens": k})
    return [["vllm", "serve", verifier, "--speculative-config", spec_config]]


def check_loads(export_dir: Path, verifier: str) -> dict[str, Any]:
    """Load the export with speculators and run the draft once on random inputs."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(export_dir))
    config.transformer_layer_config._attn_implementation = "sdpa"  # this check runs anywhere
    draft = Eagle3DraftModel.from_pretrained(str(export_dir), config=config, verifier=verifier).eval()
    hidden = draft.hidden_size
    n_aux = len(draft.config.eagle_aux_hidden_state_layer_ids or [0, 0, 0])
    T = 8
    dtype = next(draft.fc.parameters()).dtype  # bf16, as saved (and as vLLM runs it)
    with torch.no_grad():
        tokens = draft(
            hidden_states=torch.randn(1, T, n_aux * hidden, dtype=dtype),
            input_ids=torch.randint(0, draft.config.transformer_layer_config.vocab_size, (1, T)),
            document_ids=torch.zeros(1, T, dtype=torch.long),
            ttt_steps=1,
        )
    if tokens[0].shape != (1, T):
        raise ExportError(f"the exported draft produced tokens of shape {tuple(tokens[0].shape)}")
    return {"parameters": sum(p.numel() for p in draft.parameters()), "hidden_size": hidden, "draft_vocab_size": draft.config.draft_vocab_size}


def build_parser() -> argparse.ArgumentParser:
    """This stage's command line; harness checks [pipeline.stages] options against it on the laptop (no torch import)."""
    p = argparse.ArgumentParser(description="Export a trained EAGLE-3 draft for vLLM.")
    p.add_argument("--draft", required=True, help="a checkpoint directory, or the train stage's output (the checkpoint its best.json names, else the latest epoch)")
    p.add_argument("--verifier", required=True, help="verifier directory (recorded absolute) or hub id")
    p.add_argument("--output", required=True, help="export directory (replaced atomically)")
    p.add_argument("--no-check", action="store_true", help="skip loading the export back with speculators")
    p.add_argument("--events", default=None)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, parse_args(argv), run)


def run(args: argparse.Namespace, events: EventLog) -> dict[str, Any]:
    started = time.monotonic()
    ckpt, best = resolve_draft(Path(args.draft))
    verifier = verifier_path.resolve(args.verifier)
    config = export_config(json.loads((ckpt / "config.json").read_text()), verifier)
    k = speculative_tokens(config)
    out = Path(args.output).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)

    # Build next to the destination, check, then swap in: no half-written export at --output.
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes it private; an export is meant to be read by the server
    try:
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        shutil.copyfile(ckpt / WEIGHTS, staging / WEIGHTS)  # contents only: the checkpoint's mode may be private
        for extra in ("generation_config.json",):
            if (ckpt / extra).is_file():
                shutil.copy2(ckpt / extra, staging / extra)
        info = {} if args.no_check else check_loads(staging, verifier)
        commands = serve_commands(verifier, str(out), k)
        (staging / "serve_command.txt").write_text("\n".join(shlex.join(c) for c in commands) + "\n")
        manifest = {"source_checkpoint": str(ckpt.resolve()), "training_tau": best["tau"] if best else None, "verifier": verifier, "num_speculative_tokens": k, "serve": [shlex.join(c) for c in commands], **info}
        (staging / "export.json").write_text(json.dumps(manifest, indent=2) + "\n")
        if out.exists():
            old = out.with_name(f".{out.name}.old-{os.getpid()}")
            os.replace(out, old)
            os.replace(staging, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, out)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)

    events.artifact(str(out), kind="export")
    events.message("serve it with:\n  " + "\n  ".join(shlex.join(c) for c in commands))
    print(shlex.join(commands[0]))
    return {"export": str(out), "checkpoint": str(ckpt.resolve()), "verifier": verifier, "num_speculative_tokens": k, "serve_command": shlex.join(commands[0]), "seconds": round(time.monotonic() - started, 1)}


if __name__ == "__main__":
    sys.exit(main())

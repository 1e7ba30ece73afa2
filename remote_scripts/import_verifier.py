"""Turn a model as a user has it (a GGUF file, or any transformers-loadable directory) into the
verifier directory the stages take, and check it: the reloaded verifier's logits equal the
source model's.

    python remote_scripts/import_verifier.py --source model.Q4_1.gguf --output VERIFIER_DIR \
        [--dtype bfloat16] [--events FILE]
    python remote_scripts/import_verifier.py --source HF_MODEL_DIR --output VERIFIER_DIR

A GGUF file is dequantized as it loads (common/gguf_compat.py lets save_pretrained write a plain
checkpoint); its tokenizer and chat template come from the file too. Tied embeddings stay tied.
What it writes and how the check works: docs/pipeline.md, "Your own verifier". The directory
has config.json only once whole, with imported_from.json (the source's name and size, the dtype).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.events import EventLog, run_stage  # noqa: E402
from common.verifier_path import PROVENANCE, provenance  # noqa: E402

STAGE = "import_verifier"
PROBE = [{"role": "user", "content": "What is speculative decoding, in two sentences?"}]


class ImportError_(RuntimeError):
    """A problem with the inputs, reported as one line."""


def load_source(source: Path, dtype, trust_remote_code: bool = False):
    """(model, tokenizer) from a .gguf file or a transformers directory, dense, in `dtype`, on CPU."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    if source.is_file() and source.suffix == ".gguf":
        kwargs: dict[str, Any] = {"gguf_file": source.name}
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), dtype=dtype, quantization_config=GgufConfig(gguf_file=source.name, dequantize=True), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(source.parent), **kwargs)
        from common.gguf_compat import forget_gguf_quantizer

        forget_gguf_quantizer(model)
    elif (source / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype=dtype, trust_remote_code=trust_remote_code)
        tokenizer = AutoTokenizer.from_pretrained(str(source), trust_remote_code=trust_remote_code)
    else:
        raise ImportError_(f"--source {source}: neither a .gguf file nor a directory with config.json")
    return model.eval(), tokenizer


def probe_ids(tokenizer) -> list[int]:
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(PROBE, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(PROBE[0]["content"])["input_ids"]


STAGING = ".importing"  # inside --output, until the import is checked


def logits(model, ids: list[int]):
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float()


def import_verifier(args: argparse.Namespace, events: EventLog) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    source, out = Path(args.source), Path(args.output)
    if not source.exists():
        raise ImportError_(f"--source {source}: no such file or directory")
    if out.exists() and any(f.name != STAGING for f in out.iterdir()):  # (a killed import's staging is made anew)
        raise ImportError_(f"--output {out}: exists and is not empty")
    model, tokenizer = load_source(source, dtype, args.trust_remote_code)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    events.message(f"{source.name}: {type(model).__name__}, {model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, vocab {model.config.vocab_size}, tied embeddings: {tied}, {args.dtype}")
    ids = probe_ids(tokenizer)
    expected = logits(model, ids)
    # written into a hidden directory inside --output, its files moved up once checked, config.json
    # last: a failed or killed import leaves no verifier-looking directory (config.json is what
    # makes one) that a later run would take for a whole one
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    staging = out / STAGING
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir()
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))
        del model
        reloaded = AutoModelForCausalLM.from_pretrained(str(staging), dtype=dtype).eval()
        got = logits(reloaded, ids)
        if not torch.equal(expected, got):
            raise ImportError_(f"the reloaded verifier's logits differ from the source's (max |diff| {(expected - got).abs().max().item():.3g} over {len(ids)} probe tokens)")
        if tied and reloaded.get_output_embeddings().weight.data_ptr() != reloaded.get_input_embeddings().weight.data_ptr():
            raise ImportError_("the source ties its embeddings; the reloaded verifier does not")
        (staging / PROVENANCE).write_text(json.dumps(provenance(str(source), args.dtype), indent=1) + "\n")
        for f in sorted(staging.iterdir(), key=lambda f: f.name == "config.json"):
            f.rename(out / f.name)
        staging.rmdir()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    events.message(f"logits equal after the reload ({len(ids)} probe tokens)")
    events.artifact(str(out.resolve()), kind="verifier")
    return {"verifier": str(out.resolve()), "tied_embeddings": tied, "dtype": args.dtype, "probe_tokens": len(ids)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="A GGUF file or transformers model -> the verifier directory the stages take, logits checked.")
    p.add_argument("--source", required=True, help="a .gguf file, or a directory transformers loads")
    p.add_argument("--output", required=True, help="the verifier directory to write (new or empty)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"], help="the saved weights' dtype (a GGUF is dequantized to it)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--events", default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    return run_stage(STAGE, parse_args(argv), import_verifier, self_explaining=(ImportError_,))


if __name__ == "__main__":
    sys.exit(main())

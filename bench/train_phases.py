#!/usr/bin/env python3
"""Where a train run's wall time goes outside its steps: speculators' phases timed in-process.

    python bench/train_phases.py make-full DIR [ROWS] [SEQ]
        a Llama-3.1-8B-width verifier directory holding only what training reads (config,
        embeddings, lm_head, final norm), ROWS prepared rows of SEQ tokens and their hidden states
        (random): the draft at bench/gpu/speed.py's width on a CPU (a run's peak RSS: 17.7 GiB)
    python bench/train_phases.py run SCRIPT ARGS...
        SCRIPT (bench/gpu/train_observed.py: our stage; bench/gpu/speculators_direct.py: `speculators
        train`) run in this process with timers around speculators' phases; the table on stderr
        at exit (seconds since this process started). BENCH_METRICS as those scripts want it.
        TRAIN_PHASES_COMPILE=1: compile the draft's forward as speculators does under CUDA (it
        compiles only there); TRAIN_PHASES_CPU_SHIMS=1: speculators direct on a CPU, with
        remote_scripts/common/speculators_compat.py's device shims only.

bench/gpu/speed.py splits each GPU run's wall the same way from its metric lines' times.
"""

from __future__ import annotations

import atexit
import functools
import os
import runpy
import sys
import time
from pathlib import Path

T0 = time.time()
REPO = Path(__file__).resolve().parents[1]
rows: list[tuple[str, float, float]] = []  # (phase, start since T0, seconds)


def timed(owner, attr: str) -> None:
    fn = getattr(owner, attr)

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0 = time.time()
        try:
            return fn(*a, **kw)
        finally:
            rows.append((f"{getattr(owner, '__name__', owner)}.{attr}", t0 - T0, time.time() - t0))

    setattr(owner, attr, wrapper)


def report() -> None:
    steps = [r for r in rows if r[0].startswith("step ")]
    keep = {steps[0], steps[-1]} if steps else set()
    print("phase table (start s, seconds):", file=sys.stderr)
    for name, start, seconds in sorted(rows, key=lambda r: r[1]):
        if not name.startswith("step ") or (name, start, seconds) in keep:
            print(f"  {start:8.2f}  {seconds:8.2f}  {name}", file=sys.stderr)
    print(f"  {time.time() - T0:8.2f}            exit ({len(steps)} steps logged)", file=sys.stderr)
    from torch._dynamo.utils import counters

    if counters["stats"]:
        print(f"dynamo: {dict(counters['stats'])}, graph breaks {sum(counters['graph_break'].values())}", file=sys.stderr)


def run(script: str, argv: list[str]) -> None:
    import logging

    t0 = time.time()
    import torch

    if os.environ.get("TRAIN_PHASES_COMPILE"):
        # speculators decides at import (models/utils.py conditional_torch_compile)
        available = torch.cuda.is_available
        torch.cuda.is_available = lambda: True
        import speculators.models.eagle3.core  # noqa: F401

        torch.cuda.is_available = available
    import speculators.models.eagle3.core as eagle3
    import speculators.train.checkpointer as ckpt
    import speculators.train.cli as cli
    import speculators.train.trainer as trainer

    rows.append(("import torch, speculators", 0.0, time.time() - t0))
    for owner, attr in [(cli, "main"), (cli, "parse_vocab_mappings"), (cli, "build_draft_model"), (eagle3.Eagle3DraftModel, "__init__"),
                        (eagle3.Eagle3DraftModel, "load_verifier_weights"), (cli, "create_train_val_loaders"), (trainer.Trainer, "__init__"),
                        (trainer.Trainer, "train_epoch"), (trainer.Trainer, "val_epoch"), (ckpt.SingleGPUCheckpointer, "save_checkpoint")]:
        timed(owner, attr)

    class Steps(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if record.name == "speculators.metrics" and isinstance(record.msg, dict) and "train" in record.msg:
                ms = (record.msg.get("profile") or {}).get("step_ms", 0.0)
                rows.append((f"step {record.msg.get('global_step')} logged ({ms:.0f} ms)", time.time() - T0, 0.0))

    logging.getLogger().addHandler(Steps())
    if os.environ.get("TRAIN_PHASES_CPU_SHIMS"):
        sys.path.insert(0, str(REPO / "remote_scripts"))
        from common import speculators_compat

        speculators_compat.apply_cpu_shims()
    atexit.register(report)
    sys.argv = [script, *argv]
    sys.path.insert(0, str(Path(script).resolve().parent))
    runpy.run_path(script, run_name="__main__")


def make_full(out: Path, rows_n: int, seq: int) -> None:
    import json

    import torch
    from datasets import load_from_disk
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    sys.path.insert(0, str(REPO / "bench" / "gpu"))
    import gpu_bench as gb

    verifier = out / "verifier"
    verifier.mkdir(parents=True, exist_ok=True)
    LlamaConfig(**gb.FULL_SHAPE, num_hidden_layers=16, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                tie_word_embeddings=False, torch_dtype="bfloat16", bos_token_id=128000, eos_token_id=128001).save_pretrained(verifier)
    g = torch.Generator().manual_seed(0)
    vocab, hidden = gb.FULL_SHAPE["vocab_size"], gb.FULL_SHAPE["hidden_size"]
    save_file({"model.embed_tokens.weight": (torch.randn(vocab, hidden, generator=g) * 0.02).to(torch.bfloat16),
               "lm_head.weight": (torch.randn(vocab, hidden, generator=g) * 0.02).to(torch.bfloat16),
               "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}, str(verifier / "model.safetensors"), metadata={"format": "pt"})
    gb.make_prepared(out / "prepared", rows_n, seq)
    states = out / "hidden_states"
    states.mkdir(exist_ok=True)
    data = load_from_disk(str(out / "prepared")).with_format("torch")
    for i in range(rows_n):
        save_file({"hidden_states": torch.randn(seq, 4, hidden, generator=g).to(torch.bfloat16), "token_ids": data[i]["input_ids"]}, str(states / f"hs_{i}.safetensors"))
    (states / "extract_meta.json").write_text(json.dumps({"target_layer_ids": [2, 8, 13], "verifier_num_layers": 16, "hidden_size": hidden}))
    print(f"{out}: verifier (embeddings, lm_head, norm), {rows_n} rows of {seq} tokens and their hidden states")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "make-full":
        make_full(Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 3, int(sys.argv[4]) if len(sys.argv) > 4 else 256)
    elif len(sys.argv) >= 3 and sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3:])
    else:
        sys.exit("usage: train_phases.py make-full DIR [ROWS] [SEQ] | run SCRIPT ARGS...")

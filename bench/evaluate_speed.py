#!/usr/bin/env python3
"""The evaluate stage's two measurement methods side by side: the reference chain (two forwards
per round, no cache) and the fast one (batched cached decoding, one verifier and one draft
forward per prompt). One run, the same models and prompts; prints both times, the ratio and
whether every prompt's rounds and acceptances are identical.

    python bench/evaluate_speed.py [--verifier DIR --draft CKPT --data chat.jsonl] \
        [--prompts 16] [--max-new-tokens 96] [--batch-size 1] [--record]

Without --verifier/--draft/--data it builds the tests' tiny verifier and a draft trained for 20
steps in --workdir (a few minutes on 2 cores; reused on the next run). --record puts a dated
section under "## bench/evaluate_speed.py" in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "remote_scripts"
sys.path.insert(0, str(SCRIPTS))
sys.path.insert(0, str(ROOT))

import evaluate as ev  # noqa: E402
from common.conversations import load_prompts  # noqa: E402
from bench.results_file import record  # noqa: E402


def _script(name: str, *args) -> None:
    subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], check=True, stdout=subprocess.DEVNULL)


def build_tiny(work: Path) -> tuple[Path, Path, Path]:
    """The tests' tiny verifier (make_tiny_verifier defaults) and a draft trained for 20 steps."""
    verifier, data, draft = work / "verifier", work / "chat.jsonl", work / "checkpoints"
    if not (draft / "best.json").is_file():
        print(f"building the tiny verifier and a draft in {work} ...", file=sys.stderr, flush=True)
        _script("make_tiny_verifier.py", "--output", verifier, "--data-out", data, "--events", work / "e1.jsonl")
        _script("prepare_data.py", "--verifier", verifier, "--data", data, "--output", work / "prepared", "--max-seq-len", 256, "--events", work / "e2.jsonl")
        _script("extract_hidden_states.py", "--verifier", verifier, "--prepared", work / "prepared", "--output", work / "hidden", "--batch-size", 8, "--events", work / "e3.jsonl")
        _script("train_draft.py", "--verifier", verifier, "--prepared", work / "prepared", "--hidden-states", work / "hidden", "--output", draft,
                "--epochs", 1, "--max-steps", 20, "--total-seq-len", 256, "--lr", "5e-3", "--events", work / "e4.jsonl")
    return verifier, data, draft


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--verifier")
    p.add_argument("--draft")
    p.add_argument("--data")
    p.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "harness-evaluate-speed"))
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("-k", "--speculative-tokens", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=0, help="the fast method's (0: its default)")
    p.add_argument("--dtype", default=None, help="the verifier's dtype (default: the stages' rule, fp32 on CPU)")
    p.add_argument("--device", default=None, help="default: cuda where torch sees a GPU, else cpu")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--record", action="store_true")
    args = p.parse_args()

    import torch
    from transformers import AutoTokenizer

    from common.checkpoints import resolve_draft
    from common.verifier import load_verifier, locate_decoder

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.verifier:
        verifier_dir, data, draft_dir = Path(args.verifier), Path(args.data), Path(args.draft)
    else:
        work = Path(args.workdir)
        work.mkdir(parents=True, exist_ok=True)
        verifier_dir, data, draft_dir = build_tiny(work)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = load_verifier(str(verifier_dir.resolve()), device=device, dtype=args.dtype)
    draft = ev.load_draft(resolve_draft(draft_dir)[0], str(verifier_dir.resolve()), "sdpa").to(device)
    verifier = ev.HFVerifier(model, ev.draft_layers(draft, locate_decoder(model).num_layers), torch.bfloat16)
    proposer = ev.Eagle3Proposer(draft)
    tokenizer = AutoTokenizer.from_pretrained(str(verifier_dir.resolve()))
    prompts = load_prompts(tokenizer, data, "heldout", args.prompts)
    eos = ev._eos_ids(tokenizer, model)
    k, max_new = args.speculative_tokens, args.max_new_tokens
    batch = args.batch_size or verifier.batch_size(prompts, max_new + k + 1)

    def chain_method(prompts):  # what --method chain does, greedy check included
        return ev.measure_chain(verifier, proposer, prompts, k, max_new, eos)

    # Warm-up (first calls allocate and pick kernels), then each method timed on every prompt.
    ev.measure_fast(verifier, proposer, prompts[:batch], k, max_new, eos, batch)
    chain_method(prompts[:1])
    started = time.perf_counter()
    fast = ev.measure_fast(verifier, proposer, prompts, k, max_new, eos, batch)
    fast_s = time.perf_counter() - started
    started = time.perf_counter()
    chain = chain_method(prompts)
    chain_s = time.perf_counter() - started

    same = [(f.generated, f.rounds, f.accepted, f.trials) == (c.generated, c.rounds, c.accepted, c.trials) for f, c in zip(fast, chain)]
    tokens = sum(len(r.generated) for r in chain)
    fr, cr = ev.summarize(fast, k), ev.summarize(chain, k)
    lines = [
        f"verifier {verifier_dir.name} ({model.config.model_type}, {locate_decoder(model).num_layers} layers, {next(model.parameters()).dtype}), "
        f"{len(prompts)} prompts, k={k}, max_new_tokens={max_new}, fast batch {batch}, torch threads {torch.get_num_threads()}, {platform.machine()}, load {os.getloadavg()[0]:.1f}",
        f"chain (reference): {chain_s:8.2f} s  {tokens / chain_s:8.1f} tokens/s  tau {cr.tau:.4f}",
        f"fast:              {fast_s:8.2f} s  {tokens / fast_s:8.1f} tokens/s  tau {fr.tau:.4f}",
        f"speed-up {chain_s / fast_s:.1f}x; identical rounds and acceptances on {sum(same)}/{len(same)} prompts; greedy checks: chain {sum(bool(r.greedy_match) for r in chain)}, fast {sum(bool(r.greedy_match) for r in fast)}",
    ]
    print("\n".join(lines))
    if args.record:
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        cmd = " ".join(["python bench/evaluate_speed.py", *sys.argv[1:]])
        record("## bench/evaluate_speed.py", f"### {stamp}: `{cmd}`\n\n```\n" + "\n".join(lines) + "\n```")
    return 0 if all(same) else 1


if __name__ == "__main__":
    sys.exit(main())
